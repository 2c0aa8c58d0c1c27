"""Failover on the real broker (issue 17, and the kill -9 of issue 12): workers killed with SIGKILL
five times during a replay change nothing, and each time their partitions resume within 10 s.

Two workers with static group instance ids replay a simulated cluster published to 4 partitions
(one record a message, so that the backlog lasts); five times one of them (in turn, from the one
re-keying the jobs at the first kill, if one still is) is killed with SIGKILL in the middle of it
and a replacement with the same instance id started at once. Then:

- after every kill, every partition with work left commits again within ``RESUME_SECONDS`` of the
  replacement's launch (the resume time, defined in ``tests/services/failover.py`` and
  docs/kafka.md#failover; the test prints each);
- the incidents, attributions and MTTF rows equal the embedded replay's;
- the dead letters equal the embedded replay's (none on this cluster): a job copy sent again by
  a re-keyer's successor is skipped as a repeat, never dead-lettered as late;
- ``jobs-by-node`` holds each copy the re-keying makes (one per jobs message and partition) at
  least once, every extra copy names its source and is a repeat by the rule the workers skip by,
  and the partitions' newest checkpoints count exactly that many repeats skipped;
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
from tests.services.failover import BACKLOG_JOIN_RECORDS, KillRun, checkpointed_repeats, kill_during_replay
from tests.services.worker import (
    assert_same_results,
    cli,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

PARTITIONS = 4
#: The failover target: a killed worker's partitions commit again within this long of its
#: replacement's launch, each time.
RESUME_SECONDS = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, list[dict]], str]:
    """A simulated 60-node cluster, 40 days with DCGM scrapes every 40 minutes (~690,000 records:
    at one record a message, joined by two (``BACKLOG_JOIN_RECORDS``): a backlog that outlasts
    five kills, where sparser scrapes let the workers finish before the last), and what the
    embedded replay makes of it."""
    folder = tmp_path_factory.mktemp("failover")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "60", "--days", "40", "--seed", "21", "--ecc-interval-minutes", "40",
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
    expected = results([store], last["t"], dead_letters=True)
    return inputs, expected, last["t"]


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
    # The backlog is published before the workers start: a partition with nothing left to read is
    # done, and the fleet stage need not wait long for it (the tests' default is 15 s).
    env = kafka.deployment_env(bootstrap, prefix, PARTITIONS, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"),
                               FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS="5",
                               FAULTSTREAM_WORKER_JOIN_RECORDS=BACKLOG_JOIN_RECORDS)  # fmt: skip
    cli(env, "init-kafka")
    run = KillRun()
    began = time.time()
    try:
        kill_during_replay(run, env, inputs, tmp_path, workers=2, kills=5, patience=30, rekeyer_first=True)
        killed = time.time()
        wait_until_caught_up(env, run.alive, timeout=420)
        caught_up = time.time()
    finally:
        for worker in run.alive:
            worker.stop()

    resumes = [seconds for _, seconds in run.resumes]
    # The figures, in pytest -s output (and in the assertion's message).
    print("resume seconds after each kill: " + ", ".join("-" if s is None else f"{s:.1f}" for s in resumes))
    assert len(resumes) == 5
    assert all(s is not None and s <= RESUME_SECONDS for s in resumes), (
        f"after a kill the partitions took longer than {RESUME_SECONDS} s to commit again: {run.resumes}"
        f"\n{run.events}"
    )
    stores = [worker.store for worker in run.incarnations]
    compared = time.time()
    got = results(stores, before, dead_letters=True)
    assert_same_results(
        {k: v for k, v in got.items() if k != "dead_letters"},
        {k: v for k, v in expected.items() if k != "dead_letters"},
    )
    assert got["dead_letters"] == expected["dead_letters"]

    # jobs-by-node: each copy one re-keying makes is there; every extra one is a recognisable repeat.
    bootstrap_servers = env["FAULTSTREAM_KAFKA_BOOTSTRAP"]
    jobs = asyncio.run(_read_all(bootstrap_servers, env["FAULTSTREAM_TOPIC_JOBS"]))
    wanted = set()
    for _partition, offset, value, _headers in jobs:
        for _location, line in message_lines(value, offset):
            job = decode_record("job", line, "jobs", "test")
            wanted |= {(offset, partition_for_key(node.encode(), PARTITIONS)) for node in job.nodes}
    copies = asyncio.run(_read_all(bootstrap_servers, env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]))
    # A copy of a message, or of lines the fetch joined (one offset a line): counted a source offset.
    seen: Counter[tuple[int, int]] = Counter()
    rule = {partition: CopiesApplied() for partition in range(PARTITIONS)}
    for partition, _offset, _value, headers in copies:
        source = copy_source(headers)
        assert source is not None, "a job copy without its source header"
        for source_offset in source[1]:
            seen[(source_offset, partition)] += 1
        rule[partition].fresh_from(headers)
    repeats_by_rule = sum(applied.repeats for applied in rule.values())
    assert set(seen) == wanted
    extra = sum(seen.values()) - len(seen)
    assert repeats_by_rule == extra, f"{extra} extra copies, {repeats_by_rule} of them repeats by the rule"
    # Each extra copy was skipped and counted once, in the history the partitions' newest
    # checkpoints carry (whichever worker skipped it, killed or not).
    counted = checkpointed_repeats(env)
    seconds = {
        "publishing": run.events[0][0] - began,
        "kills": killed - run.events[0][0],
        "catching up": caught_up - killed,
        "comparing": time.time() - compared,
    }
    print(  # the figures of the run, in pytest -s output
        json.dumps({"resume_seconds": resumes, "extra_copies": extra, "copies": len(seen),
                    "repeats_counted": counted, "seconds": {k: round(v, 1) for k, v in seconds.items()},
                    "first_kill": [text for _, text in run.events if text.startswith("re-keying")]})
    )  # fmt: skip
    assert sum(counted.values()) == extra, f"{extra} extra copies, repeats counted per partition: {counted}"
    assert extra > 0, "no copy was sent twice: the kills did not test the repeat rule"

    for worker in run.incarnations:
        log = worker.log()
        errors = [line for line in log.splitlines() if "[ERROR]" in line]
        assert not errors, f"{worker.log_path}: ERROR lines:\n" + "\n".join(errors[:5])
        assert "is overlapping" not in log, f"{worker.log_path}: Faust's timer overlapped"
    kafka.delete_deployment_topics(env)
