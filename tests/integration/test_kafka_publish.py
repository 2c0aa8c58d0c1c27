"""`faultstream init-kafka` and `faultstream replay --to kafka://` against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.inputs.files import LateRecord, MergedInputs
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.codec import partition_for_key, record_key
from stream.kafka.topics import topic_specs
from stream.settings import Settings
from stream.worker.merge import PUBLISH_SKEW_SECONDS
from tests.services import kafka
from tests.services.kafka import consume

#: Topics init-kafka creates (every one of topic_specs).
TOPICS = len(topic_specs(Settings.from_env()))

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = sorted((ROOT / "examples" / "sim-48x14" / "logs").iterdir())


@pytest.fixture
def topics_env(bootstrap: str) -> dict[str, str]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    env = kafka.deployment_env(bootstrap, prefix, 3)
    yield env
    kafka.delete_deployment_topics(env)


def faultstream(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


async def topic_config(bootstrap: str, topic: str, set_to: dict[str, str] | None = None) -> dict[str, str]:
    """A topic's config (after setting ``set_to``, as an operator or an older version would)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if set_to:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=set_to)])
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {entry[0]: entry[1] for entry in response.resources[0][4]}
    finally:
        await admin.close()


def test_init_kafka_creates_the_topics_once_with_their_configs(bootstrap, topics_env):
    first = faultstream(topics_env, "init-kafka")
    assert first.count(": created") == TOPICS
    incidents = asyncio.run(topic_config(bootstrap, topics_env["FAULTSTREAM_TOPIC_INCIDENTS"]))
    assert (
        incidents["cleanup.policy"] == "delete"
    )  # keyed by node: compaction would drop a node's other incidents
    ecc = topics_env["FAULTSTREAM_TOPIC_ECC"]
    config = asyncio.run(topic_config(bootstrap, ecc))
    assert (config["retention.ms"], config["message.timestamp.type"]) == ("-1", "CreateTime")  # by size only
    # A topic left with age retention (an older version's config) is set right by the next run.
    asyncio.run(
        topic_config(bootstrap, ecc, set_to={"cleanup.policy": "delete", "retention.ms": "604800000"})
    )
    again = faultstream(topics_env, "init-kafka")
    assert again.count(": exists, config set") == TOPICS
    assert asyncio.run(topic_config(bootstrap, ecc))["retention.ms"] == "-1"


@pytest.mark.parametrize("per_message", [1, 256])
def test_replay_to_kafka_publishes_every_record_in_its_key_partition_in_order(
    bootstrap, topics_env, tmp_path, per_message
):
    faultstream(topics_env, "init-kafka")
    bad = tmp_path / "node9.log"
    bad.write_bytes(
        b"2024-01-03T10:00:00+00:00 node9 kernel: NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        b"2024-01-03T10:00:01+00:00 node9 kernel: NVRM: Xid (PCI:0000:07\n"
    )
    out = json.loads(faultstream(topics_env, "replay", *map(str, EXAMPLE), str(bad), "--to", f"kafka://{bootstrap}",
                                 "--json", "--no-progress", "--records-per-message", str(per_message)))  # fmt: skip
    # The order records are published in: the event-time merge of the files.
    published: dict[type, list] = {XidEvent: [], EccSample: [], JobEvent: []}
    for item, _ in MergedInputs([*EXAMPLE, bad], ParseOptions(cluster="default"), None, 300_000):
        if not isinstance(item, InvalidRecord | LateRecord):
            published[type(item)].append(item)
    topic_of = {
        XidEvent: "FAULTSTREAM_TOPIC_XID",
        EccSample: "FAULTSTREAM_TOPIC_ECC",
        JobEvent: "FAULTSTREAM_TOPIC_JOBS",
    }
    for record_type, env_name in topic_of.items():
        topic = topics_env[env_name]
        want = published[record_type]
        assert out["sent"][topic] == len(want)
        partitions = 1 if env_name == "FAULTSTREAM_TOPIC_JOBS" else 3  # jobs: one partition, in order
        messages, _ = asyncio.run(consume(bootstrap, topic, partitions, out["messages"][topic], timeout=60))
        assert len(messages) == out["messages"][topic]
        got_by_key: dict[bytes, list] = {}
        for message in messages:
            records = [record_type.from_dict(json.loads(line)) for line in message.value.split(b"\n")]
            assert 1 <= len(records) <= per_message
            # A message: consecutive records of one partition, with its first record's key and time.
            assert message.key == record_key(records[0]) and message.timestamp == records[0].ts_ms
            for record in records:
                assert partition_for_key(record_key(record), partitions) == message.partition
                got_by_key.setdefault(record_key(record), []).append(record.to_dict())
        want_by_key: dict[bytes, list] = {}
        for record in want:
            want_by_key.setdefault(record_key(record), []).append(record.to_dict())
        assert got_by_key == want_by_key  # every record once, each key's records in publish order
        if per_message > 1 and len(want) > per_message * partitions:
            assert len(messages) < len(want) / 10
    letters, _ = asyncio.run(
        consume(bootstrap, topics_env["FAULTSTREAM_TOPIC_DEAD_LETTERS"], 1, 1, timeout=30)
    )
    [letter] = letters
    headers = dict(letter.headers)
    assert b"truncated" in headers["reason"] and headers["location"] == b"line 2"
    assert letter.value.endswith(b"NVRM: Xid (PCI:0000:07")


async def _watch_order(
    bootstrap: str, env: dict[str, str], publisher: subprocess.Popen[bytes]
) -> tuple[int, list[str]]:
    """Read xid, ecc and jobs while ``publisher`` runs, asking the jobs topic's end offset after
    each fetch as a worker's idle rule does. Return how many jobs messages were read, and those
    not readable yet when asked at least :data:`PUBLISH_SKEW_SECONDS` after a record of another
    topic more than the allowed lateness past them had arrived (what a worker would let pass)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from stream.worker.broker import BrokerQueries

    lateness_ms = Settings.from_env().allowed_lateness_seconds * 1000
    jobs = TopicPartition(env["FAULTSTREAM_TOPIC_JOBS"], 0)
    others = [env["FAULTSTREAM_TOPIC_XID"], env["FAULTSTREAM_TOPIC_ECC"]]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_wait_ms=5)  # fmt: skip
    queries = BrokerQueries({"bootstrap_servers": bootstrap})
    await consumer.start()
    try:
        partitions = range(int(env["FAULTSTREAM_TOPIC_PARTITIONS"]))
        consumer.assign([TopicPartition(topic, p) for topic in others for p in partitions] + [jobs])
        read: list[tuple[int, int]] = []  # jobs messages: (offset, event time)
        # After each fetch: (newest event time of the other topics read, when, the jobs end offset then).
        asked: list[tuple[int, float, int]] = []
        newest, quiet = -1, 0
        while quiet < 10:
            fetched = await consumer.getmany(timeout_ms=200)
            for tp, messages in fetched.items():
                for message in messages:
                    if tp == jobs:
                        read.append((message.offset, message.timestamp))
                    else:
                        newest = max(newest, message.timestamp)
            if fetched:
                at = time.monotonic()
                asked.append((newest, at, (await queries.end_offsets([jobs]))[jobs]))
            quiet = quiet + 1 if not fetched and publisher.poll() is not None else 0
    finally:
        await consumer.stop()
        await queries.close()
    late = []
    for offset, ts in read:
        passed = next((at for other, at, _ in asked if other > ts + lateness_ms), None)
        if passed is None:
            continue
        end = next((end for _, at, end in asked if at >= passed + PUBLISH_SKEW_SECONDS), None)
        if end is not None and offset >= end:
            late.append(f"jobs offset {offset} (event time {ts}): not readable {PUBLISH_SKEW_SECONDS} s after "
                        f"the other topics passed {ts + lateness_ms}")  # fmt: skip
    return len(read), late


def test_a_paced_replay_keeps_event_time_order_across_topics(bootstrap, topics_env, tmp_path):
    """A paced replay compresses days into seconds (the example: 14 days at 3,000 records/s, about
    two minutes of event time a millisecond), so a jobs record readable a few milliseconds after
    later ECC records is past the allowed lateness; a worker whose jobs source was idle let those
    ECC records through first, and the job's end came late (the scale-out test's rare failure).
    The producer's 20 ms linger made 5-31 ms of that; without it 2-7 ms remain, which a worker's
    drained answer allows for (:data:`PUBLISH_SKEW_SECONDS`): none may be left beyond that."""
    faultstream(topics_env, "init-kafka")
    publisher = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "replay", *map(str, EXAMPLE), "--to", f"kafka://{bootstrap}",
         "--no-progress", "--rate", "3000"],
        env={**os.environ, **topics_env}, cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "publisher.log").open("w"),
    )  # fmt: skip
    try:
        jobs, late = asyncio.run(_watch_order(bootstrap, topics_env, publisher))
    finally:
        publisher.kill()
    assert publisher.wait() == 0, (tmp_path / "publisher.log").read_text()[-2000:]
    assert jobs > 100, "too few jobs messages to tell"
    assert not late, f"{len(late)} of {jobs} jobs messages out of order, e.g.\n" + "\n".join(late[:5])
