"""Failover on the real broker (issue 17, and the kill -9 of issue 12): workers killed with SIGKILL
five times during a replay change nothing.

Two workers with static group instance ids replay a simulated cluster published to 4 partitions
(one record a message, so that the backlog lasts); five times one of them (in turn) is killed with
SIGKILL in the middle of it and a replacement with the same instance id started at once. Then:

- after every kill, every input partition with work left commits again (no time is asserted here:
  ``tests/soak/failover.py`` prints the resume times);
- the incidents, attributions and MTTF rows equal the embedded replay's;
- the dead letters equal the embedded replay's (none on this cluster): a job copy sent again by
  a re-keyer's successor is skipped as a repeat, never dead-lettered as late;
- ``jobs-by-node`` holds each copy the re-keying makes (one per jobs message and partition) at
  least once, every extra copy names its source and is a repeat by the rule the workers skip by;
- no worker logged an ERROR line or a Faust "Timer ... is overlapping".

The history is published before the workers read it. Published at a steady rate while they work
(``tests/soak/failover.py --rate``) the results can differ, kills or not: see that script.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream.kafka.codec import decode_record, message_lines, partition_for_key
from stream.worker.rekeying import CopiesApplied, copy_source
from tests.services import kafka
from tests.services.failover import KillRun, kill_during_replay
from tests.services.worker import (
    Worker,
    assert_same_results,
    cli,
    progress,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, list[dict]], str]:
    """A simulated 60-node cluster, 40 days with DCGM scrapes every 2 h (~250,000 records: a backlog
    that outlasts five kills even now that a worker goes faster), and what the embedded replay makes
    of it."""
    folder = tmp_path_factory.mktemp("failover")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "60", "--days", "40", "--seed", "21", "--ecc-interval-minutes", "120",
        "--out", str(sim))  # fmt: skip
    inputs = [sim / "kernel.log", sim / "sacct.txt", sim / "dcgm.prom"]
    store = folder / "embedded"
    cli({}, "replay", *map(str, inputs), "--clickhouse", f"chdb://{store}", "--no-progress")
    # MTTF rows are compared up to the day before the last XID: the rows of the last hours are
    # decided by the end of the input, which the embedded replay reaches and a worker never does
    # (on this cluster one such row has the same hours with another version).
    [last] = query(
        store, "SELECT toString(toStartOfDay(max(ts)) - toIntervalDay(1)) AS t FROM faultstream.xid_events"
    )
    expected = results([store], last["t"])
    expected["dead_letters"] = dead_letters([store])
    return inputs, expected, last["t"]


def dead_letters(stores: list[Path]) -> list[dict]:
    """Every dead letter of the stores (kind and reason), one per (source, location, reason)."""
    rows = {
        (row["source"], row["location"], row["reason"]): row
        for store in stores
        for row in query(
            store, "SELECT source, location, reason, record_kind FROM faultstream.dead_letters FINAL"
        )
    }
    return sorted(({"kind": r["record_kind"], "reason": r["reason"]} for r in rows.values()), key=str)


Message = tuple[int, int, bytes, list[tuple[str, bytes]]]


async def _read_all(bootstrap: str, topic: str) -> list[Message]:
    """(partition, offset, value, headers) of every message of ``topic``, in each partition's order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = sorted(consumer._client.cluster.partitions_for_topic(topic) or ())
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = sorted(consumer._client.cluster.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        found: list[Message] = []
        for tp in tps:
            while (await consumer.position(tp)) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=2000)
                found += [
                    (tp.partition, m.offset, m.value or b"", list(m.headers or ())) for m in batch.get(tp, [])
                ]
        return found
    finally:
        await consumer.stop()


def test_five_sigkills_during_a_replay_change_nothing(
    bootstrap: str, tmp_path: Path, cluster: tuple[list[Path], dict[str, list[dict]], str]
) -> None:
    inputs, expected, before = cluster
    prefix = f"failover{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, PARTITIONS, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    run = KillRun()
    try:
        kill_during_replay(run, env, inputs, tmp_path, workers=2, kills=5)
        wait_until_caught_up(env, run.alive, timeout=420)
        repeats_at_end = sum(w.metric("faultstream_rekey_repeats_total") for w in run.alive)
    finally:
        for worker in run.alive:
            worker.stop()

    print(f"resume seconds after each kill: {run.resumes}")  # the figures, in pytest -s output
    assert len(run.resumes) == 5
    assert all(seconds is not None for _, seconds in run.resumes), (
        f"a kill's partitions never moved: {run.resumes}"
    )
    stores = [worker.store for worker in run.incarnations]
    got = results(stores, before)
    assert_same_results(got, {k: v for k, v in expected.items() if k != "dead_letters"})
    assert dead_letters(stores) == expected["dead_letters"]

    # jobs-by-node: each copy one re-keying makes is there; every extra one is a recognisable repeat.
    bootstrap_servers = env["FAULTSTREAM_KAFKA_BOOTSTRAP"]
    jobs = asyncio.run(_read_all(bootstrap_servers, env["FAULTSTREAM_TOPIC_JOBS"]))
    wanted = set()
    for _partition, offset, value, _headers in jobs:
        for _location, line in message_lines(value, offset):
            job = decode_record("job", line, "jobs", "test")
            wanted |= {(offset, partition_for_key(node.encode(), PARTITIONS)) for node in job.nodes}
    copies = asyncio.run(_read_all(bootstrap_servers, env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]))
    seen: Counter[tuple[int, int]] = Counter()
    repeats_by_rule = 0
    rule = {partition: CopiesApplied() for partition in range(PARTITIONS)}
    for partition, _offset, _value, headers in copies:
        source = copy_source(headers)
        assert source is not None, "a job copy without its source header"
        seen[(source[1], partition)] += 1
        repeats_by_rule += rule[partition].repeat(headers)
    assert set(seen) == wanted
    extra = sum(seen.values()) - len(seen)
    assert repeats_by_rule == extra, f"{extra} extra copies, {repeats_by_rule} of them repeats by the rule"
    # The skipped repeats were counted (killed workers' counters were read just before each kill).
    assert run.repeats_before_kills + repeats_at_end <= extra
    print(  # the figures of the run, in pytest -s output
        json.dumps({"resume_seconds": run.resumes, "extra_copies": extra, "copies": len(seen),
                    "repeats_counted": run.repeats_before_kills + repeats_at_end})
    )  # fmt: skip

    for worker in run.incarnations:
        log = worker.log()
        errors = [line for line in log.splitlines() if "[ERROR]" in line]
        assert not errors, f"{worker.log_path}: ERROR lines:\n" + "\n".join(errors[:5])
        assert "is overlapping" not in log, f"{worker.log_path}: Faust's timer overlapped"
    kafka.delete_deployment_topics(env)


def test_three_workers_one_leaving_mid_replay_change_nothing(
    bootstrap: str, tmp_path: Path, cluster: tuple[list[Path], dict[str, list[dict]], str]
) -> None:
    """Three workers (dynamic membership) share 4 partitions; one stops cleanly (SIGTERM) in the
    middle of the replay, leaves the group, and the other two take its partitions over from their
    checkpoints."""
    inputs, expected, before = cluster
    prefix = f"leave{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, PARTITIONS, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    cli(env, "replay", *map(str, inputs), "--to", f"kafka://{bootstrap}", "--no-progress",
        "--records-per-message", "1")  # fmt: skip
    members = [Worker(env, tmp_path / f"store{n}", tmp_path / f"worker{n}.log") for n in range(3)]
    try:
        deadline = time.monotonic() + 180
        # It has work of its own: rows written, not only commits (a commit may carry records the
        # merge still holds for another source, which a clean stop hands over unapplied).
        while (
            members[2].metric("faultstream_commits_total", before_start=0) < 3
            or members[2].metric("faultstream_sink_rows_total", before_start=0) == 0
        ):
            members[2].assert_alive()
            assert time.monotonic() < deadline, "the third worker wrote nothing in 180 s"
            time.sleep(0.5)
        members[2].stop()
        done = progress(env)
        assert any(committed < end for committed, end in done.values()), "it left after the end"
        wait_until_caught_up(env, members[:2], timeout=420)
    finally:
        for member in members:
            member.stop()
    # It had input partitions of its own before it left (which ones depends on the assignment:
    # some of its commits may have been of XID or job records only).
    stored = query(
        members[2].store,
        "SELECT (SELECT count() FROM faultstream.ecc_samples) + (SELECT count() FROM faultstream.xid_events)"
        " + (SELECT count() FROM faultstream.job_events) AS n",
    )
    assert stored[0]["n"] > 0, "the worker that left had applied nothing of its own"
    stores = [m.store for m in members]
    assert_same_results(results(stores, before), {k: v for k, v in expected.items() if k != "dead_letters"})
    assert dead_letters(stores) == expected["dead_letters"]
    kafka.delete_deployment_topics(env)
