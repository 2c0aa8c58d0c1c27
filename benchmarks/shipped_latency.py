"""Line written to the log to incident on the topic, through a real rsyslog, Kafka and one worker.

    python benchmarks/shipped_latency.py --kafka 127.0.0.1:9092      # 1,000 lines/s for 60 s
    python benchmarks/shipped_latency.py --kafka HOST:PORT --rate 1000 --seconds 120 \
        --template RSYSLOG_SyslogProtocol23Format

A live fleet's kernel log as a site ships it: ``--rate`` lines a second forwarded over TCP to a
real rsyslog relay (Debian's ``rsyslog`` + ``rsyslog-kafka``, started here on 127.0.0.1: imtcp in,
omkafka out with ``--template``, its default ``RSYSLOG_FileFormat``), which ships each line as one
Kafka record with no key to the deployment's ``kernel-log`` topic; one ``faultstream worker`` (its
own app id, topics and store; the product's default settings) reads it. Event time is wall time:
every line carries the moment it is written. One line in a hundred of the stream is another
driver's; after ``--warmup`` seconds, once a second, a planted ``NVRM: Xid ...: 79, ... GPU has
fallen off the bus.`` line on a GPU no other plant uses.

A consumer of the incidents topic matches each plant with the first ``gpu_bus`` incident of its
node and GPU; latency = the wall time it was received - the wall time its line was written to the
relay's socket. The table gives the lines sent and their rate, plants and matches, and latency
p50/p90/p99/max (target: p99 < 2 s at 1,000 lines/s). Topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer
from worker_throughput import (
    CLI,
    ROOT,
    TOPIC_SETTINGS,
    Kafka,
    deployment_env,
    free_port,
    log,
    run_cli,
    stop_process,
    topics_of,
    work_folder,
)

NOISE = (
    "mlx5_core 0000:8d:00.0: Port module event: module 4, Cable plugged",
    "EXT4-fs (md0): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib1: link becomes ready",
    "docker0: port 4(vethab86b2c) entered forwarding state",
)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def start_relay(
    folder: Path, bootstrap: str, topic: str, template: str
) -> tuple[subprocess.Popen[bytes], int]:
    """rsyslogd in the foreground: imtcp on a free port, omkafka to ``topic``."""
    binary = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
    if not Path(binary).exists() or not glob.glob("/usr/lib/*/rsyslog/omkafka.so"):
        raise SystemExit("rsyslog with omkafka is not installed: apt-get install rsyslog rsyslog-kafka")
    port = free_port()
    config = folder / "rsyslog.conf"
    config.write_text(
        f"""global(workDirectory="{folder}")
module(load="imtcp")
module(load="omkafka")
input(type="imtcp" address="127.0.0.1" port="{port}" ruleset="ship")
ruleset(name="ship") {{
  action(type="omkafka" broker=["{bootstrap}"] topic="{topic}" template="{template}")
}}
"""
    )
    relay = subprocess.Popen(
        [binary, "-n", "-f", str(config), "-i", str(folder / "rsyslogd.pid")],
        stdout=(folder / "rsyslogd.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return relay, port
        except OSError:
            if relay.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rsyslogd did not start: see {folder / 'rsyslogd.log'}") from None
            time.sleep(0.1)


def line(node: str, text: str) -> bytes:
    stamp = datetime.now(UTC).isoformat(timespec="microseconds")
    return f"<4>{stamp} {node} kernel: {text}\n".encode()


async def collect(
    bootstrap: str, topic: str, found: dict[tuple[str, str], float], stop: asyncio.Event
) -> None:
    """Receive time of the first gpu_bus incident of each (node, GPU)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for messages in batch.values():
                for message in messages:
                    incident = orjson.loads(message.value)
                    if incident.get("kind") == "gpu_bus":
                        found.setdefault((incident["node"], incident["gpu"]), now)
    finally:
        await consumer.stop()


async def drive(args: argparse.Namespace, port: int, plants: dict[tuple[str, str], float]) -> int:
    """Write ``args.rate`` lines a second for warm-up + ``args.seconds``; plant once a second."""
    rng = random.Random(args.seed)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    tick = 0.01
    per_tick = args.rate * tick
    started = time.monotonic()
    end = started + args.warmup + args.seconds
    next_plant = started + args.warmup
    owed = 0.0
    plant_number = 0
    while (now := time.monotonic()) < end:
        owed += per_tick
        lines = []
        while owed >= 1:
            owed -= 1
            node = f"node{rng.randrange(args.nodes):04d}"
            lines.append(line(node, rng.choice(NOISE)))
        if now >= next_plant:
            node = f"node{plant_number // 7 % args.nodes:04d}"
            gpu = plant_number % 7
            pci = f"0000:{0x07 + 8 * gpu:02x}:00"
            pid = 1000 + plant_number
            text = f"NVRM: Xid (PCI:{pci}): 79, pid={pid}, name=python, GPU has fallen off the bus."
            lines.append(line(node, text))
            plants[(node, pci)] = time.time()
            plant_number += 1
            next_plant += 1.0
        writer.write(b"".join(lines))
        await writer.drain()
        sent += len(lines)
        await asyncio.sleep(max(0.0, started + (sent / args.rate) - time.monotonic()))
    writer.close()
    return sent


async def measure(args: argparse.Namespace, workdir: Path) -> int:
    prefix = f"shiplat{uuid.uuid4().hex[:6]}"
    env = deployment_env(args.kafka, prefix, args.partitions)
    env["FAULTSTREAM_DATA_DIR"] = str(workdir / "data")
    env["FAULTSTREAM_METRICS_PORT"] = str(free_port())
    async with Kafka(args.kafka) as kafka:
        kafka.created.extend(topics_of(env, TOPIC_SETTINGS))
        try:
            run_cli(["init-kafka"], env)
            relay, port = start_relay(workdir, args.kafka, env["FAULTSTREAM_TOPIC_KERNEL_LOG"], args.template)
            with (workdir / "worker.log").open("w") as out:
                worker = subprocess.Popen(
                    [*CLI, "worker", "--clickhouse", f"chdb://{workdir / 'store'}"],
                    env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            try:
                await asyncio.sleep(8)  # the worker joins its group
                plants: dict[tuple[str, str], float] = {}
                found: dict[tuple[str, str], float] = {}
                stop = asyncio.Event()
                collector = asyncio.create_task(
                    collect(args.kafka, env["FAULTSTREAM_TOPIC_INCIDENTS"], found, stop)
                )
                began = time.monotonic()
                sent = await drive(args, port, plants)
                took = time.monotonic() - began
                deadline = time.monotonic() + args.tail
                while time.monotonic() < deadline and not plants.keys() <= found.keys():
                    await asyncio.sleep(0.2)
                stop.set()
                await collector
            finally:
                for process in (worker, relay):
                    stop_process(process)
        finally:
            await kafka.delete(kafka.created)
    latencies = [found[key] - at for key, at in plants.items() if key in found]
    print(
        f"rsyslog {args.template} -> Kafka -> one worker, {args.partitions} partitions; "
        f"{args.seconds} s measured\n"
    )
    print("| lines/s (target) | lines/s (sent) | plants | incidents | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells = [percentile(latencies, q) * 1000 for q in (0.5, 0.9, 0.99, 1.0)]
    print(
        f"| {args.rate:,} | {sent / took:,.0f} | {len(plants)} | {len(latencies)} | "
        + " | ".join(f"{cell:,.0f}" for cell in cells)
        + " |"
    )
    return 0 if len(latencies) == len(plants) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kafka", required=True, help="bootstrap server, HOST:PORT")
    parser.add_argument("--rate", type=int, default=1000, help="lines a second (default 1,000)")
    parser.add_argument("--seconds", type=int, default=60, help="measured seconds (default 60)")
    parser.add_argument("--warmup", type=int, default=10, help="seconds before the first plant (default 10)")
    parser.add_argument("--tail", type=int, default=30, help="seconds waited for the last incidents")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--template", default="RSYSLOG_FileFormat")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--smoke", action="store_true", help="200 lines/s for 5 s (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rate, args.seconds, args.warmup = 200, 5, 3
    with work_folder(args.workdir, "shipped-latency-") as workdir:
        log(f"work folder {workdir}")
        return asyncio.run(measure(args, workdir))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
