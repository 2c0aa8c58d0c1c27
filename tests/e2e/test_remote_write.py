"""DCGM through a real Prometheus' remote_write (issue 41): Debian's Prometheus 2.42 scrapes three
exporters of dcgm-exporter's format whose counters change over time (an uncorrectable ECC error on
one GPU, an XID gauge change on another, a blank counter, a temperature it must pass over), sharded
and in small batches so that one GPU's series of a scrape come in several requests, with
``remote_write`` to ``faultstream receive``; one worker reads what the receiver produced. Its
incidents, ECC samples and XID events must equal the embedded replay of the same scrapes as a file
(written from Prometheus' own store: the times it gave the samples).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.services import kafka
from tests.services.prometheus import start_prometheus
from tests.services.worker import (
    ROOT,
    Worker,
    assert_same_results,
    cli,
    free_port,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

NODES = ("node0001", "node0002", "node0003")
GPUS = 4


def exposition(node: str, scrape: int) -> str:
    """One scrape of a node's exporter: counters that move with the scrape number."""
    lines = []
    for gpu in range(GPUS):
        labels = (
            f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{0x07 + 8 * gpu:02X}:00.0",'
            f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"'
        )
        dbe = 1 if (node, gpu) == ("node0002", 1) and scrape >= 8 else 0
        xid = 79 if (node, gpu) == ("node0003", 2) and scrape >= 12 else 0
        lines += [
            f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{labels}}} {scrape // 3 * (gpu + 1)}",
            f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} {dbe}",
            f"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{{{labels}}} {100 + scrape // 3 * (gpu + 1)}",
            f"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{{{labels}}} {dbe}",
            f"DCGM_FI_DEV_RETIRED_SBE{{{labels}}} {9223372036854775794 if gpu == 3 else 0}",
            f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}",
            f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {40 + gpu}",
        ]
    return "# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter\n" + "\n".join(lines) + "\n"


class Exporter:
    """One node's exporter on a free port; each GET is the next scrape."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = exposition(exporter.node, exporter.scrapes).encode()
                exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def scrapes_file(prometheus_url: str, path: Path) -> int:
    """Every DCGM sample Prometheus stored, as a scrape file (lines grouped by time)."""
    found = json.load(
        urllib.request.urlopen(
            f"{prometheus_url}/api/v1/query?"
            + urllib.parse.urlencode({"query": '{__name__=~"DCGM_.*"}[10m]'}),
            timeout=10,
        )
    )
    lines = []
    for series in found["data"]["result"]:
        metric = dict(series["metric"])
        name = metric.pop("__name__")
        for key in ("instance", "job"):
            metric.pop(key, None)
        labels = ",".join(f'{key}="{value}"' for key, value in sorted(metric.items()))
        for ts, value in series["values"]:
            number = float(value)
            shown = "NaN" if math.isnan(number) else str(int(number)) if number == int(number) else value
            lines.append(
                (round(float(ts) * 1000), name, f"{name}{{{labels}}} {shown} {round(float(ts) * 1000)}")
            )
    lines.sort()
    path.write_text("".join(line + "\n" for _, _, line in lines))
    return len(lines)


def test_dcgm_through_prometheus_remote_write_gives_the_replay_s_results(
    bootstrap: str, tmp_path: Path
) -> None:
    env = kafka.deployment_env(
        bootstrap, f"rw{uuid.uuid4().hex[:6]}", 2, FAULTSTREAM_DATA_DIR=str(tmp_path / "d"),
        FAULTSTREAM_RECEIVE_SETTLE_SECONDS="3",
    )  # fmt: skip
    cli(env, "init-kafka")
    port = free_port()
    receive_log = (tmp_path / "receive.log").open("w")
    receiver = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "receive", "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, **env}, cwd=ROOT, stdout=receive_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    exporters = [Exporter(node) for node in NODES]
    prometheus = None
    try:
        deadline = time.monotonic() + 60
        while "receiving Prometheus remote_write" not in (tmp_path / "receive.log").read_text():
            assert receiver.poll() is None and time.monotonic() < deadline, (
                tmp_path / "receive.log"
            ).read_text()
            time.sleep(0.2)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                {
                    "job_name": "dcgm",
                    "static_configs": [{"targets": [f"127.0.0.1:{e.port}" for e in exporters]}],
                }
            ],
            "remote_write": [
                {
                    "url": f"http://127.0.0.1:{port}/api/v1/write",
                    # Small batches over several shards: a GPU's series of one scrape in several requests.
                    "queue_config": {
                        "max_samples_per_send": 20,
                        "batch_send_deadline": "1s",
                        "min_shards": 3,
                        "max_shards": 3,
                    },
                }
            ],
        }
        prometheus = start_prometheus(tmp_path / "prometheus", config)
        while min(e.scrapes for e in exporters) < 25:
            assert receiver.poll() is None, (tmp_path / "receive.log").read_text()
            time.sleep(0.5)
        for exporter in exporters:
            exporter.stop()
        time.sleep(8)  # the last batches sent, the last samples settled
        written = scrapes_file(prometheus.url, tmp_path / "dcgm.prom")
        assert written > 25 * len(NODES) * GPUS * 5
    finally:
        if prometheus is not None:
            prometheus.stop()
        receiver.terminate()
        receiver.wait(timeout=30)
    log = (tmp_path / "receive.log").read_text()
    assert "Traceback" not in log, log[-3000:]

    embedded = tmp_path / "embedded"
    cli({}, "replay", str(tmp_path / "dcgm.prom"), "--clickhouse", f"chdb://{embedded}", "--no-progress")
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        inputs = [env["FAULTSTREAM_TOPIC_ECC"], env["FAULTSTREAM_TOPIC_XID"]]
        wait_until_caught_up(env, [worker], timeout=240, topics=inputs)  # no jobs: nothing to re-key
    finally:
        worker.stop()
    [last] = query(embedded, "SELECT toString(max(ts) + INTERVAL 1 HOUR) AS t FROM faultstream.ecc_samples")
    expected = results([embedded], last["t"])
    kinds = {row["kind"] for row in expected["incidents"]}
    assert {"gpu_memory", "gpu_bus"} <= kinds, expected["incidents"]  # the DBE and the XID 79
    assert_same_results(results([worker.store], last["t"]), expected)
    for table in ("ecc_samples", "xid_events"):
        sql = f"SELECT count() AS n, toString(min(ts)) AS first, toString(max(ts)) AS last FROM faultstream.{table}"
        assert query(worker.store, sql) == query(embedded, sql), table
    kafka.delete_deployment_topics(env)
