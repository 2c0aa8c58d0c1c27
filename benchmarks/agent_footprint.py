"""The node agent's footprint: its RSS and CPU share at one kernel line a second and 8 GPUs scraped
every 30 s (issue 41's budget: <= 50 MB RSS, <= 1% of one core).

    python benchmarks/agent_footprint.py HOST:PORT [--seconds 70] [--scrape-seconds 30]

Starts ``faultstream agent`` on a kernel-log file in a temporary folder, with a local HTTP server
serving a dcgm-exporter scrape of 8 GPUs (every ECC counter) as its ``--dcgm-url``; writes one
kernel line a second (one in ten an ``NVRM: Xid`` line) for ``--seconds``, then prints the agent's
RSS (VmRSS, and its peak VmHWM) and its CPU share over the run from ``/proc/PID/stat`` (user +
system ticks, after the first 10 s so the interpreter's start is not counted), and what Kafka
acknowledged. The agent publishes to ``bench-agent.*`` topics of the broker at HOST:PORT.
Also prints the RSS of a bare interpreter that imported what the agent imports, to say what
dominates.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
)  # fmt: skip


def scrape() -> bytes:
    """A dcgm-exporter scrape of 8 GPUs (the ECC counters and a few others the agent passes over)."""
    lines = []
    for metric in COUNTERS:
        lines.append(f"# HELP {metric} x\n# TYPE {metric} gauge")
        for gpu in range(8):
            bus = f"00000000:{0x18 + gpu * 0x10:02X}:00.0"
            labels = (f'gpu="{gpu}",UUID="GPU-{gpu:08d}",pci_bus_id="{bus}",device="nvidia{gpu}",'
                      'modelName="NVIDIA H100 80GB HBM3",Hostname="bench-node"')  # fmt: skip
            lines.append(f"{metric}{{{labels}}} {gpu}")
    return ("\n".join(lines) + "\n").encode()


class Exporter(BaseHTTPRequestHandler):
    body = scrape()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def proc_stat(pid: int) -> tuple[int, int, int]:
    """(CPU ticks used, VmRSS kB, VmHWM kB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return ticks, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def baseline_rss_kb() -> int:
    """RSS of an interpreter that imported what the agent imports, doing nothing."""
    code = (
        "import aiokafka, prometheus_client, orjson, stream.agent.service, stream.cli.main;"
        "import pathlib;"
        "status = pathlib.Path('/proc/self/status').read_text().splitlines();"
        "print([line for line in status if line.startswith('VmRSS')][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return int(out.stdout.split()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bootstrap")
    parser.add_argument("--seconds", type=float, default=70.0)
    parser.add_argument("--scrape-seconds", type=float, default=30.0)
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    folder = Path(tempfile.mkdtemp(prefix="agent-footprint-"))
    log = folder / "kern.log"
    metrics_port = 19468
    env = {
        **os.environ,
        "FAULTSTREAM_KAFKA_BOOTSTRAP": args.bootstrap,
        "FAULTSTREAM_TOPIC_KERNEL_LOG": "bench-agent.kernel-log",
        "FAULTSTREAM_TOPIC_ECC": "bench-agent.ecc",
        "FAULTSTREAM_AGENT_DCGM_SECONDS": str(args.scrape_seconds),
        "FAULTSTREAM_AGENT_METRICS_PORT": str(metrics_port),
    }
    with (folder / "agent.log").open("w") as agent_log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "agent", "--kernel-log", str(log), "--dcgm-url", url,
             "--state-dir", str(folder / "state"), "--node", "bench-node"],
            env=env, cwd=ROOT, stdout=agent_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        time.sleep(10)  # the interpreter's start and imports are not the steady state
        ticks0, _, _ = proc_stat(agent.pid)
        started = time.monotonic()
        rss_samples = []
        n = 0
        while time.monotonic() - started < args.seconds:
            text = (
                f"NVRM: Xid (PCI:0000:3b:00): 13, pid={n}, Graphics Exception"
                if n % 10 == 0
                else f"usb 1-1: new high-speed USB device number {n}"
            )
            with log.open("a") as handle:
                handle.write(f"2025-03-04T17:22:31.{n:06d}+00:00 bench-node kernel: [{n}.000000] {text}\n")
            n += 1
            rss_samples.append(proc_stat(agent.pid)[1])
            time.sleep(1.0)
        elapsed = time.monotonic() - started
        ticks1, rss, hwm = proc_stat(agent.pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
            page = answer.read().decode()
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        server.shutdown()
    cpu = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / elapsed
    published = [
        line for line in page.splitlines() if line.startswith("faultstream_agent_records_published_total")
    ]
    print(
        f"agent footprint over {elapsed:.0f} s: {n} kernel lines (1/s), "
        f"8 GPUs scraped every {args.scrape_seconds:g} s"
    )
    print(f"  RSS        {rss / 1024:.1f} MB now, {max(rss_samples) / 1024:.1f} MB highest sampled, "
          f"{hwm / 1024:.1f} MB peak (VmHWM)   budget <= 50 MB")  # fmt: skip
    print(f"  CPU        {cpu * 100:.2f}% of one core (user + system)   budget <= 1%")
    print(f"  baseline   {baseline_rss_kb() / 1024:.1f} MB: a bare interpreter that imported aiokafka, "
          "prometheus_client, orjson and the agent's modules")  # fmt: skip
    print("  published  " + "; ".join(published))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
