"""The real Kafka broker that tests/run starts (tests/services/kafka/start.sh) works with our stack:
aiokafka's idempotent producer and consumer, and a Faust worker reading from and writing to it.

No broker fails these tests, never skips them: run them through tests/run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from tests.services import kafka
from tests.services.kafka import consume

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 1_000
PARTITIONS = 4
KEYS = 37


@pytest.fixture
def new_topic(bootstrap: str) -> Iterator[object]:
    """A factory of fresh, uniquely named topics, deleted after the test."""
    made: list[str] = []

    def make(prefix: str, partitions: int) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        kafka.create_topic(name, partitions, bootstrap=bootstrap)
        made.append(name)
        return name

    yield make
    for name in made:
        kafka.delete_topic(name, bootstrap=bootstrap)


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> list:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for key, value in messages]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


def keyed_messages(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"node-{i % KEYS}".encode(), f"{i}".encode()) for i in range(n)]


def test_idempotent_round_trip_keeps_keys_on_their_partitions(bootstrap, new_topic):
    topic = new_topic("roundtrip", PARTITIONS)
    messages = keyed_messages(MESSAGES)
    metadata = asyncio.run(produce(bootstrap, topic, messages))

    produced_on: dict[bytes, set[int]] = defaultdict(set)
    for (key, _), meta in zip(messages, metadata, strict=True):
        produced_on[key].add(meta.partition)
    assert all(len(parts) == 1 for parts in produced_on.values()), "a key was spread over partitions"
    # The partition is the Java client's: murmur2 of the key, so other clients agree with ours.
    for key, (partition,) in produced_on.items():
        assert partition == (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
    per_partition = defaultdict(int)
    for meta in metadata:
        per_partition[meta.partition] += 1
    assert len(per_partition) == PARTITIONS

    records, end_offsets = asyncio.run(consume(bootstrap, topic, PARTITIONS, MESSAGES, timeout=30))
    assert len(records) == MESSAGES
    assert end_offsets == {p: per_partition[p] for p in range(PARTITIONS)}
    assert sorted(int(r.value) for r in records) == list(range(MESSAGES))
    last_seen: dict[bytes, int] = {}
    for record in records:
        assert {record.partition} == produced_on[record.key]
        assert int(record.value) > last_seen.get(record.key, -1), "a key's messages came out of order"
        last_seen[record.key] = int(record.value)


def test_faust_worker_forwards_every_message(bootstrap, new_topic, tmp_path):
    source = new_topic("faust-in", 2)
    sink = new_topic("faust-out", 1)
    n = 200
    messages = keyed_messages(n)
    asyncio.run(produce(bootstrap, source, messages))  # before the worker starts: read from "earliest"

    env = {
        **os.environ,
        "FAULTSTREAM_TEST_KAFKA": bootstrap,
        "FAUST_ECHO_ID": f"faust-echo-{uuid.uuid4().hex[:10]}",
        "FAUST_ECHO_SOURCE": source,
        "FAUST_ECHO_SINK": sink,
        "FAUST_ECHO_DATADIR": str(tmp_path / "faust-data"),
    }
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/services/faust_echo.py"), "worker", "-l", "warn", "--without-web"],
            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            records, end_offsets = asyncio.run(
                consume(bootstrap, sink, 1, n, timeout=45, give_up=lambda: worker.poll() is not None)
            )
            alive = worker.poll() is None
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    worker_log = log_path.read_text(errors="replace")[-4000:]
    assert alive, f"the Faust worker exited early:\n{worker_log}"
    assert len(records) == n, f"{len(records)} of {n} messages forwarded; worker log:\n{worker_log}"
    assert end_offsets == {0: n}, "the worker forwarded some messages twice"
    assert sorted((r.key, r.value) for r in records) == sorted(messages)
