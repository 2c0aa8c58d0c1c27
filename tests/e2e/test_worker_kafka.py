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
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.services import kafka
from tests.services.worker import (
    Worker,
    assert_same_results,
    cli,
    incident_messages,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "examples" / "sim-48x14" / "logs"


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


def test_worker_results_equal_the_embedded_replay(bootstrap: str, tmp_path: Path, embedded) -> None:
    expected, before = embedded
    prefix = f"w{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"))
    cli(env, "init-kafka")
    cli(env, "replay", str(LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
    bad = [b"{not json", b'{"ts": "2024-01-05T00:00:00Z", "cluster": "sim", "node": "node0001", "xid": "79"}']
    asyncio.run(produce(bootstrap, env["FAULTSTREAM_TOPIC_XID"], [(b"node0001", value) for value in bad]))
    worker = Worker(env, tmp_path / "worker-store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker])
        assert worker.metric("faultstream_dead_letters_total") == 2
        assert worker.metric("faultstream_commits_total") >= 1
    finally:
        worker.stop()
    assert_same_results(results([worker.store], before), expected)
    letters = query(worker.store, "SELECT reason, raw FROM faultstream.dead_letters FINAL ORDER BY reason")
    assert [(row["reason"][:17], row["raw"][:9]) for row in letters] == [
        ("field 'xid' must ", '{"ts": "2'),
        ("not JSON (unexpec", "{not json"),
    ]
    on_topic = {incident_id for incident_id, _ in incident_messages(env)}
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
    kafka.delete_deployment_topics(env)


def test_unknown_xids_are_kept_and_far_late_events_dead_lettered(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"u{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"))
    cli(env, "init-kafka")

    def xid(ts: str, code: int) -> tuple[bytes, bytes]:
        return b"node1", json.dumps({"ts": ts, "cluster": "c", "node": "node1", "xid": code}).encode()

    topic = env["FAULTSTREAM_TOPIC_XID"]
    first = [
        xid("2024-01-05T00:00:00Z", 13),
        xid("2024-01-05T01:00:00Z", 999),
        xid("2024-01-05T02:00:00Z", 13),
    ]
    asyncio.run(produce(bootstrap, topic, first))  # 999 is not in the catalog: kept and flagged
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker], topics=[topic])
        # Once the worker has processed up to 02:00, a record of the day before is late.
        asyncio.run(
            produce(bootstrap, topic, [xid("2024-01-04T00:00:00Z", 13), xid("2024-01-05T02:01:00Z", 13)])
        )
        wait_until_caught_up(env, [worker], topics=[topic])
        assert worker.metric("faultstream_late_events_total") == 1
    finally:
        worker.stop()
    rows = query(worker.store, "SELECT xid, category FROM faultstream.xid_events FINAL ORDER BY ts")
    assert [(row["xid"], row["category"]) for row in rows] == [
        (13, "application"),
        (999, "unknown"),
        (13, "application"),
        (13, "application"),
    ]  # fmt: skip  (the late one is not among them)
    [letter] = query(worker.store, "SELECT reason FROM faultstream.dead_letters FINAL")
    assert letter["reason"].startswith("late event (event time 2024-01-04")
    kafka.delete_deployment_topics(env)
