"""One XID from the kernel-log topic and from DCGM's XID gauge on the ``xid`` topic is one XID,
live as in the replay (issue 41).

A simulated cluster's kernel log goes, line by line and with no key, to the deployment's
``kernel-log`` topic (as omkafka sends it); its DCGM scrapes, the XID gauge of every GPU beside them
(each XID shows at the next 6-hourly scrape, as ``receive`` would send its changes) and its job
records go in with ``replay --to``. One worker over 4 partitions must write the incidents,
attributions and MTTF rows of the embedded replay of the kernel log, scrapes and jobs *without*
the gauge, and one ``xid_events`` row per kernel XID.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.services import kafka
from tests.services.worker import Worker, assert_same_results, cli, query, results, wait_until_caught_up
from tests.services.xid_gauge import gauge_reports, write_xid_gauge

pytestmark = pytest.mark.e2e


async def ship(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    """Each line a record with no key, as rsyslog's omkafka sends it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sends = [await producer.send(topic, value=line) for line in lines]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


def test_kernel_lines_and_the_xid_gauge_live_give_the_kernel_log_s_results(
    bootstrap: str, tmp_path: Path
) -> None:
    sim = tmp_path / "sim"
    cli({}, "simulate", "--nodes", "24", "--days", "10", "--seed", "43", "--out", str(sim))
    gauge = tmp_path / "dcgm-xid.prom"
    kernel = write_xid_gauge(sim, gauge)
    assert len(gauge_reports(gauge)) >= 10
    embedded = tmp_path / "embedded"
    cli({}, "replay", str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--clickhouse", f"chdb://{embedded}", "--no-progress")  # fmt: skip
    [last] = query(embedded, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([embedded], last["t"])
    assert len(expected["incidents"]) >= 5

    env = kafka.deployment_env(
        bootstrap, f"tworep{uuid.uuid4().hex[:6]}", 4, FAULTSTREAM_DATA_DIR=str(tmp_path / "d")
    )
    cli(env, "init-kafka")
    lines = [line for line in (sim / "kernel.log").read_bytes().splitlines(keepends=True) if line.strip()]
    asyncio.run(ship(bootstrap, env["FAULTSTREAM_TOPIC_KERNEL_LOG"], lines))
    cli(env, "replay", str(sim / "sacct.txt"), str(sim / "dcgm.prom"), str(gauge),
        "--to", f"kafka://{bootstrap}", "--no-progress")  # fmt: skip
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker], timeout=300)
    finally:
        worker.stop()
    assert_same_results(results([worker.store], last["t"]), expected)
    events = query(worker.store, "SELECT count() AS n FROM faultstream.xid_events")[0]["n"]
    assert int(events) == sum(b"NVRM: Xid" in line or b"SXid" in line for line in lines) >= len(kernel)
    assert query(worker.store, "SELECT count() AS n FROM faultstream.dead_letters")[0]["n"] in (0, "0")
    kafka.delete_deployment_topics(env)
