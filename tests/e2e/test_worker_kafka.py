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
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass
class Run:
    """One worker's run over the example logs, with an SRE console following the incidents."""

    env: dict[str, str]
    worker: Worker
    console: str  # what `faultstream tail --json` printed while the worker ran


def start_console(env: dict[str, str], *args: str, out: Path) -> subprocess.Popen:
    """`faultstream tail` in the background, printing to `out`."""
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "tail", *args],
            env={**os.environ, **env}, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip


@pytest.fixture(scope="module", params=[256, 1], ids=["256-records-a-message", "1-record-a-message"])
def run(
    bootstrap: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Run]:
    """Published in batches (the default) and one record a message (what third-party producers send)."""
    tmp_path = tmp_path_factory.mktemp("worker-kafka")
    prefix = f"w{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"))
    cli(env, "init-kafka")
    # The console starts before anything is published and follows the topic live.
    console_path = tmp_path / "tail.jsonl"
    console = start_console(env, "--json", out=console_path)
    per_message = str(request.param)
    cli(
        env,
        "replay",
        str(LOGS),
        "--to",
        f"kafka://{bootstrap}",
        "--no-progress",
        "--records-per-message",
        per_message,
    )
    bad = [b"{not json", b'{"ts": "2024-01-05T00:00:00Z", "cluster": "sim", "node": "node0001", "xid": "79"}']
    asyncio.run(produce(bootstrap, env["FAULTSTREAM_TOPIC_XID"], [(b"node0001", value) for value in bad]))
    worker = Worker(env, tmp_path / "worker-store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker])
        assert worker.metric("faultstream_dead_letters_total") == 2
        assert worker.metric("faultstream_commits_total") >= 1
    finally:
        worker.stop()
    sent = len(incident_messages(env))
    deadline = time.monotonic() + 30
    while console.poll() is None and time.monotonic() < deadline:  # until it has printed what was sent
        if len(console_path.read_bytes().splitlines()) >= sent:
            break
        time.sleep(0.5)
    console.terminate()
    console.wait(timeout=10)
    yield Run(env, worker, console_path.read_text())
    kafka.delete_deployment_topics(env)


def test_worker_results_equal_the_embedded_replay(run: Run, embedded) -> None:
    expected, before = embedded
    assert_same_results(results([run.worker.store], before), expected)
    letters = query(
        run.worker.store, "SELECT reason, raw FROM faultstream.dead_letters FINAL ORDER BY reason"
    )
    assert [(row["reason"][:17], row["raw"][:9]) for row in letters] == [
        ("field 'xid' must ", '{"ts": "2'),
        ("not JSON (unexpec", "{not json"),
    ]
    on_topic = {incident_id for incident_id, _ in incident_messages(run.env)}
    assert on_topic == {row["incident_id"] for row in expected["incidents"]}


def test_the_sre_console_shows_every_incident_update_live_once(run: Run, embedded) -> None:
    expected, _ = embedded
    lines = [json.loads(line) for line in run.console.splitlines() if line.startswith("{")]
    shown = [(incident["incident_id"], incident["version"]) for incident in lines]
    assert len(shown) == len(set(shown)), "an update was shown twice"
    newest: dict[str, int] = {}
    for incident_id, version in shown:
        newest[incident_id] = max(version, newest.get(incident_id, 0))
    # Every incident reached the console, in its final state (the store's version).
    assert newest == {row["incident_id"]: row["version"] for row in expected["incidents"]}
    assert len(shown) == len(set(incident_messages(run.env))), "every distinct update on the topic is shown"


def test_the_sre_console_filters_and_colours(run: Run) -> None:
    shown = [json.loads(line) for line in run.console.splitlines() if line.startswith("{")]
    critical = [incident for incident in shown if incident["severity"] == "critical"]
    assert critical, "the example logs have critical incidents"
    lines = cli(
        run.env, "tail", "--from-beginning", "--no-follow", "--severity", "critical", "--color", "always"
    ).splitlines()
    assert len(lines) == len(critical)
    assert all(" CRITICAL " in line for line in lines)
    red, green = "\x1b[1;31m", "\x1b[32m"  # open, resolved
    resolved = sum(incident["status"] == "resolved" for incident in critical)
    assert sum(line.startswith(green) for line in lines) == resolved
    assert sum(line.startswith(red) for line in lines) == len(lines) - resolved
    node = critical[0]["node"]
    plain = cli(run.env, "tail", "--from-beginning", "--no-follow", "--node", node, "--color", "never")
    assert len(plain.splitlines()) == sum(incident["node"] == node for incident in shown)
    assert all(f" {node}" in line and "\x1b[" not in line for line in plain.splitlines())
    assert cli(run.env, "tail", "--from-beginning", "--no-follow", "--kind", "no_such_kind*") == ""


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


def test_a_store_that_cannot_be_reached_stops_the_worker_with_the_stores_exit_code(
    bootstrap: str, tmp_path: Path
) -> None:
    """The store connects while Faust starts (not before): its failure still stops the worker,
    says why, and exits with the code of a store failure."""
    import socket

    from stream.cli.common import EXIT_STORE

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    prefix = f"s{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data"))
    cli(env, "init-kafka")
    worker = subprocess.run(
        [sys.executable, "-m", "stream.cli", "worker", "--clickhouse", f"http://127.0.0.1:{port}/"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert worker.returncode == EXIT_STORE, worker.stderr[-3000:]
    assert (
        f"faultstream: ClickHouse: cannot connect to ClickHouse at http://127.0.0.1:{port}/" in worker.stderr
    )
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
