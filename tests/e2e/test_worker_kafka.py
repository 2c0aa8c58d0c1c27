"""The production path end to end on the real broker: replay --to Kafka -> worker -> ClickHouse + incidents topic.

With one partition the worker sees what the embedded replay sees, so the tables must be equal:
the same incident ids, versions and states, the same attributions, the same MTTF rows for every
window closed before the last event (the embedded replay also closes the last, open window at
the end of its input; a live worker leaves it open).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.services import kafka
from tests.services.kafka import consume

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "examples" / "sim-48x14" / "logs"


def cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, f"faultstream {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result.stdout


async def caught_up(bootstrap: str, group: str, topics: list[str], partitions_per_topic: int) -> bool:
    """True when the group has committed every input partition up to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in range(partitions_per_topic)]
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            committed = await consumer.committed(tp)
            if (committed or 0) < ends[tp]:
                return False
        return True
    finally:
        await consumer.stop()


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


def query(store: Path, sql: str) -> list[dict]:
    out = cli({}, "query", sql, "--clickhouse", f"chdb://{store}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def tables(store: Path, before: str) -> dict[str, list[dict]]:
    return {
        "incidents": query(
            store,
            "SELECT incident_id, version, status, kind, node, gpu FROM faultstream.incidents FINAL ORDER BY incident_id",
        ),
        "attributions": query(
            store,
            "SELECT job_id, start, hardware FROM faultstream.job_attributions FINAL ORDER BY job_id, start",
        ),
        "mttf": query(
            store,
            "SELECT window_seconds, window_start, size_bucket, round(node_hours, 6) AS nh, failures, jobs_ended "
            f"FROM faultstream.mttf_windows WHERE window_end <= toDateTime64('{before}', 3, 'UTC') "
            "ORDER BY window_seconds, window_start, size_bucket",
        ),
    }


def test_worker_results_equal_the_embedded_replay(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"))
    cli(env, "init-kafka")
    cli(env, "replay", str(LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
    bad = [b"{not json", b'{"ts": "2024-01-05T00:00:00Z", "cluster": "sim", "node": "node0001", "xid": "79"}']
    asyncio.run(produce(bootstrap, env["FAULTSTREAM_TOPIC_XID"], [(b"node0001", value) for value in bad]))
    worker_store = tmp_path / "worker-store"
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "worker", "--clickhouse", f"chdb://{worker_store}"],
        env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        inputs = [env["FAULTSTREAM_TOPIC_XID"], env["FAULTSTREAM_TOPIC_ECC"], env["FAULTSTREAM_TOPIC_JOBS"],
                  env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]]  # fmt: skip
        deadline = time.monotonic() + 180
        while not asyncio.run(caught_up(bootstrap, prefix, inputs, 1)):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker did not commit all input offsets in 180 s"
            time.sleep(2)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
    embedded_store = tmp_path / "embedded-store"
    cli({}, "replay", str(LOGS), "--clickhouse", f"chdb://{embedded_store}", "--no-progress")
    [last] = query(embedded_store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = tables(embedded_store, last["t"])
    got = tables(worker_store, last["t"])
    assert len(expected["incidents"]) > 10 and len(expected["mttf"]) > 100
    assert got == expected
    letters = query(worker_store, "SELECT reason, raw FROM faultstream.dead_letters FINAL ORDER BY reason")
    assert [(row["reason"][:17], row["raw"][:9]) for row in letters] == [
        ("field 'xid' must ", '{"ts": "2'),
        ("not JSON (unexpec", "{not json"),
    ]
    incidents, _ = asyncio.run(consume(bootstrap, env["FAULTSTREAM_TOPIC_INCIDENTS"], 1, 10_000, timeout=20,
                                       give_up=lambda: False))  # fmt: skip
    on_topic = {m.key.decode() for m in incidents}
    assert on_topic == {row["incident_id"] for row in expected["incidents"]}
    kafka.delete_deployment_topics(env)


def test_a_bad_deploy_stops_the_worker_loudly(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"d{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(
        bootstrap,
        prefix,
        1,
        FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"),
        FAULTSTREAM_DEAD_LETTER_MIN_RECORDS="20",
    )
    cli(env, "init-kafka")
    asyncio.run(produce(bootstrap, env["FAULTSTREAM_TOPIC_XID"], [(b"node1", b"garbage")] * 50))
    worker = subprocess.run(
        [sys.executable, "-m", "stream.cli", "worker", "--clickhouse", f"chdb://{tmp_path / 'store'}"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert worker.returncode != 0
    assert "stopping the worker" in worker.stdout + worker.stderr
    assert "20 of 20 records (100%) are dead letters" in worker.stdout + worker.stderr
