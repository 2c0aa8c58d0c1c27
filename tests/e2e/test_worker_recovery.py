"""Crash safety of the worker on the real broker: kill -9 and a ClickHouse outage, on one partition.

Each test compares what the worker wrote with the embedded replay of the same example logs: the
same incident ids with the same versions, states, severities and first evidence, the same
attributions and the same MTTF partial rows. (Groups of workers — splitting the partitions, one
joining, one killed, one leaving — are ``test_scale_out.py``'s and ``test_worker_failover.py``'s.)

What at-least-once allows, and the tests hold to: after a kill -9 the restarted worker redoes the
work since its partition's last checkpoint (at most ``worker_flush_seconds`` of input), so an
incident update can reach the incidents topic twice with the same id and version; consumers keep
the highest version per id, and ClickHouse's ReplacingMergeTree keeps one row per id.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.services import kafka
from tests.services.worker import (
    FLAKY_SINK_WORKER,
    Worker,
    assert_same_results,
    cli,
    incident_messages,
    input_topics,
    progress,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "examples" / "sim-48x14" / "logs"


def deployment(
    bootstrap: str, tmp_path: Path, partitions: int, name: str, *, per_message: int
) -> dict[str, str]:
    """Topics of a deployment of its own, the example published to them."""
    prefix = f"{name}{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, partitions, FAULTSTREAM_DATA_DIR=str(tmp_path / prefix))
    cli(env, "init-kafka")
    publish_logs(env, per_message)
    return env


def publish_logs(env: dict[str, str], per_message: int = 256) -> None:
    """Publish the example; ``per_message`` records a message (1: what a one-record producer sends).

    The kill uses one record a message: the example must span enough messages for it to land
    mid-stream; the outage uses small batches."""
    cli(env, "replay", str(LOGS), "--to", f"kafka://{env['FAULTSTREAM_KAFKA_BOOTSTRAP']}", "--no-progress",
        "--records-per-message", str(per_message))  # fmt: skip


def test_kill_9_mid_stream_then_restart_loses_nothing_and_duplicates_little(
    bootstrap: str, tmp_path: Path, embedded
) -> None:
    expected, before = embedded
    env = deployment(bootstrap, tmp_path, 1, "k", per_message=1)
    # Commit points a quarter of a second apart: the kill is keyed to committed progress, and at
    # the default interval (2 s) the worker reached its first commit point at the end of the input.
    env["FAULTSTREAM_WORKER_FLUSH_SECONDS"] = "0.25"
    ecc = env["FAULTSTREAM_TOPIC_ECC"]
    ecc_messages = progress(env)[ecc][1]
    first = Worker(env, tmp_path / "store-1", tmp_path / "worker-1.log")
    deadline = time.monotonic() + 180
    # Kill it once it has read a third of the ECC messages, commit points behind it: keyed to its
    # own count (a local page, read every 20 ms), as the fetch joins one-record messages the input
    # takes it a few seconds, and the group's committed offsets (a broker round trip each look)
    # were once first seen at the end.
    while (
        first.metric("faultstream_events_in_total", before_start=0.0, label=f'topic="{ecc}"')
        < ecc_messages / 3
    ):
        first.assert_alive()
        assert time.monotonic() < deadline, "the first worker read a third of the ECC samples in 180 s"
        time.sleep(0.02)
    first.kill()
    at_kill = progress(env)
    assert at_kill[ecc][0] < at_kill[ecc][1], "the worker finished before the kill: nothing was tested"
    sent_before = len(incident_messages(env))

    second = Worker(env, tmp_path / "store-2", tmp_path / "worker-2.log")
    try:
        wait_until_caught_up(env, [second])
        assert second.metric("faultstream_checkpoints_restored_total") == 1
    finally:
        second.stop()
    assert "detector state restored from its checkpoint" in second.log()

    # ClickHouse: both workers' rows together are exactly the reference (the first's are not lost).
    assert_same_results(results([first.store, second.store], before), expected)
    # The incidents topic: every incident's newest version is there ...
    messages = incident_messages(env)
    newest: dict[str, int] = {}
    for incident_id, version in messages:
        newest[incident_id] = max(version, newest.get(incident_id, 0))
    assert newest == {row["incident_id"]: row["version"] for row in expected["incidents"]}
    # ... and the restart re-sent only what followed the last checkpoint, not all it had sent.
    repeated = sum(count - 1 for count in Counter(messages).values())
    assert repeated < max(sent_before / 4, 5), f"{repeated} of {len(messages)} incident updates sent twice"
    kafka.delete_deployment_topics(env)


def test_a_clickhouse_outage_pauses_the_worker_and_loses_nothing(
    bootstrap: str, tmp_path: Path, embedded
) -> None:
    expected, before = embedded
    prefix = f"o{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 1, FAULTSTREAM_DATA_DIR=str(tmp_path / prefix))
    cli(env, "init-kafka")
    outage = tmp_path / "clickhouse-is-down"
    outage.touch()
    env["FAULTSTREAM_TEST_OUTAGE_FILE"] = str(outage)
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log", entry=FLAKY_SINK_WORKER)
    try:
        # The input comes into a running worker that knows its inputs' progress, as a live stream
        # does: its records are released into rows, which the outage then keeps from a commit.
        # (Published before the worker, the whole example was read and held before the worker first
        # asked how far the inputs go, and committed with everything held: nothing left to test.)
        deadline = time.monotonic() + 120
        while worker.metric("faultstream_assignment_settled", before_start=0) < 1:
            worker.assert_alive()
            assert time.monotonic() < deadline, "the worker did not take its partitions in 120 s"
            time.sleep(0.2)
        time.sleep(1)
        publish_logs(env, 8)
        deadline = time.monotonic() + 120
        while (failed := worker.metric("faultstream_sink_flush_failures_total", before_start=0)) < 2:
            worker.assert_alive()
            assert time.monotonic() < deadline, "no ClickHouse flush was attempted in 120 s"
            time.sleep(0.5)
        # A commit point whose batch had no rows yet may have passed before the first failed flush
        # (the merge held everything: the checkpoint has it). From the failure on, nothing passes.
        rekeyed = (env["FAULTSTREAM_TOPIC_JOBS"], env["FAULTSTREAM_TOPIC_KERNEL_LOG"])
        detected = [topic for topic in input_topics(env) if topic not in rekeyed]
        commits, before_wait = worker.metric("faultstream_commits_total"), progress(env)
        time.sleep(8)  # two more attempts at least (backoff 0.5, 1, 2, 4 s)
        assert worker.metric("faultstream_sink_flush_failures_total") >= failed + 2
        during = progress(env)
        assert [during[t][0] for t in detected] == [before_wait[t][0] for t in detected], (
            f"offsets committed while ClickHouse was down: {before_wait} -> {during}"
        )
        assert worker.metric("faultstream_commits_total") == commits
        assert worker.metric("faultstream_checkpoints_written_total") == commits  # each commit had its own
        assert all(during[t][0] < during[t][1] for t in detected[:2]), (
            f"the outage came too late to test: {during}"
        )
        assert "ClickHouse flush failed, nothing is committed" in worker.log()
        outage.unlink()
        wait_until_caught_up(env, [worker])
    finally:
        worker.stop()
    assert_same_results(results([worker.store], before), expected)
    kafka.delete_deployment_topics(env)
