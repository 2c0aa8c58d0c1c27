"""The worker's fair-share poll (stream/worker/fetching.py) on aiokafka's real fetcher and the real
broker: a poll takes a share of every partition with records fetched, about its byte budget;
across polls it hands on every record once, in each partition's order; and after a seek it hands
on from the new position, nothing of what it held from before.

No broker fails these tests, never skips them: run them through tests/run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream.worker.fetching import FairPoll, HeldBack
from stream.worker.joining import NO_JOINING, BatchedRecord, RunJoining
from tests.services import kafka

pytestmark = pytest.mark.integration

#: Messages per partition: two long partitions and a short one (the jobs topic beside the inputs).
SIZES = {0: 3_000, 1: 3_000, 2: 12}
#: Each message value: 100 bytes (no key), so a budget in bytes is a number of messages here.
VALUE_BYTES = 100


def _value(partition: int, n: int) -> bytes:
    return f"{partition}:{n}".encode().ljust(VALUE_BYTES, b".")


@pytest.fixture
def topic(bootstrap: str) -> Iterator[str]:
    name = f"fairpoll-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, len(SIZES), bootstrap=bootstrap)
    yield name
    kafka.delete_topic(name, bootstrap=bootstrap)


def _two_lines(partition: int, n: int) -> bytes:
    """A value of two lines (a publisher's batch), as long as :func:`_value`'s."""
    return f"{partition}:{n}\n".encode().ljust(VALUE_BYTES, b".")


async def _publish(bootstrap: str, topic: str, value: Callable[[int, int], bytes] = _value) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, value=value(partition, n), partition=partition)
            for partition, size in SIZES.items()
            for n in range(size)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


def _values(record: object) -> list[bytes]:
    """The broker's message values a handed-on record holds (a batched one: its parts')."""
    if isinstance(record, BatchedRecord):
        return [value for _, value in record.parts]
    return [record.value]  # type: ignore[attr-defined]


async def _polls(
    bootstrap: str,
    topic: str,
    budget_bytes: int,
    seek_after_first: int | None = None,
    value: Callable[[int, int], bytes] = _value,
    handed: list[object] | None = None,
    joining: RunJoining = NO_JOINING,
) -> list[dict[int, list[bytes]]]:
    """Every poll (partition -> values) until all of the topic is handed on, once all its
    partitions' first fetches are in (so that every poll has all of them to share out);
    ``seek_after_first``: partition 0 is sought back to this offset after the first poll;
    ``joining``: what the poll joins, and each record it hands on is appended to ``handed``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, partition) for partition in SIZES]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        fetcher = consumer._fetcher
        for _ in range(200):
            if len(fetcher._records) == len(SIZES):
                break
            await asyncio.sleep(0.05)
        assert len(fetcher._records) == len(SIZES), "the partitions' first fetches did not all arrive"
        polls: list[dict[int, list[bytes]]] = []
        poll = FairPoll(budget_bytes, joining)
        last = {partition: value(partition, size - 1) for partition, size in SIZES.items()}
        reached: set[int] = set()
        while reached != set(SIZES):
            assert len(polls) < 10 * sum(SIZES.values()), "the polls stopped handing records on"
            drained = await poll(fetcher, set(), 2.0)
            polls.append(
                {
                    tp.partition: [v for record in records for v in _values(record)]
                    for tp, records in drained.items()
                }
            )
            if handed is not None:
                handed.extend(record for records in drained.values() for record in records)
            reached |= {partition for partition, values in polls[-1].items() if values[-1] == last[partition]}
            if len(polls) == 1 and seek_after_first is not None:
                consumer.seek(tps[0], seek_after_first)
                reached.discard(0)
        return polls
    finally:
        await consumer.stop()


def test_a_poll_shares_its_budget_and_every_record_is_handed_on_once_in_order(bootstrap, topic):
    asyncio.run(_publish(bootstrap, topic))
    budget = 60  # messages
    polls = asyncio.run(_polls(bootstrap, topic, budget * VALUE_BYTES))

    assert all(sum(map(len, poll.values())) <= budget for poll in polls)
    # The short partition is all in the first poll (aiokafka's capped poll took the first
    # partition's 60 records and nothing of the others).
    assert polls[0].get(2) == [_value(2, n) for n in range(SIZES[2])]
    assert set(polls[0]) == set(SIZES)
    # The long partitions, as long as both have records, share each poll evenly.
    both = [poll for poll in polls if 0 in poll and 1 in poll]
    assert len(both) >= SIZES[0] // budget
    assert all(len(poll[0]) == len(poll[1]) for poll in both[1:-1])
    for partition, size in SIZES.items():
        handed = [value for poll in polls for value in poll.get(partition, [])]
        assert handed == [_value(partition, n) for n in range(size)]


def test_a_budget_below_one_message_a_partition_still_takes_one_of_each(bootstrap, topic):
    asyncio.run(_publish(bootstrap, topic))
    polls = asyncio.run(_polls(bootstrap, topic, VALUE_BYTES))
    assert {partition: len(values) for partition, values in polls[0].items()} == {0: 1, 1: 1, 2: 1}
    for partition, size in SIZES.items():
        assert [value for poll in polls for value in poll.get(partition, [])] == [
            _value(partition, n) for n in range(size)
        ]


def test_after_a_seek_the_poll_hands_on_from_there_and_nothing_it_held(bootstrap, topic):
    asyncio.run(_publish(bootstrap, topic))
    budget = 60  # messages
    polls = asyncio.run(_polls(bootstrap, topic, budget * VALUE_BYTES, seek_after_first=5))
    first = polls[0][0]
    assert 5 < len(first) < SIZES[0]  # the poll held more of partition 0 than it handed on
    after = [value for poll in polls[1:] for value in poll.get(0, [])]
    assert after == [_value(0, n) for n in range(5, SIZES[0])]
    for partition in (1, 2):
        assert [value for poll in polls for value in poll.get(partition, [])] == [
            _value(partition, n) for n in range(SIZES[partition])
        ]


def test_messages_of_several_lines_are_handed_on_in_batches_each_message_whole_once_in_order(
    bootstrap, topic
):
    asyncio.run(_publish(bootstrap, topic, _two_lines))
    budget = 60  # messages
    handed: list[object] = []
    polls = asyncio.run(
        _polls(bootstrap, topic, budget * VALUE_BYTES, value=_two_lines, handed=handed,
               joining=RunJoining(frozenset({topic}), 256, frozenset({topic}), 8))
    )  # fmt: skip
    batches = [record for record in handed if isinstance(record, BatchedRecord)]
    assert batches and all(2 <= len(batch.parts) <= 8 for batch in batches)
    assert sum(len(batch.parts) for batch in batches) > 0.9 * sum(SIZES.values())
    for batch in batches:
        assert [offset for offset, _ in batch.parts] == list(
            range(batch.offset - len(batch.parts) + 1, batch.offset + 1)
        )
    for partition, size in SIZES.items():
        assert [v for poll in polls for v in poll.get(partition, [])] == [
            _two_lines(partition, n) for n in range(size)
        ]


async def _held_back_polls(bootstrap: str, topic: str) -> tuple[list[int], list[bytes], list[bytes]]:
    """Partition 0 held back after the first poll for 20 polls, then read again: partition 0's
    position after each held-back poll, and every value of partitions 0 and 1 handed on."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=20 * VALUE_BYTES
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, partition) for partition in SIZES]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        held_back = HeldBack()
        poll = FairPoll(5 * VALUE_BYTES, NO_JOINING, held_back)
        handed: dict[int, list[bytes]] = {0: [], 1: []}
        positions: list[int] = []

        async def one_poll() -> None:
            drained = await poll(consumer._fetcher, set(), 0.5)
            for tp, records in drained.items():
                if tp.partition in handed:
                    handed[tp.partition].extend(v for record in records for v in _values(record))

        while not handed[0]:
            await one_poll()
        held_back.partitions = frozenset({TopicPartition(topic, 0)})
        for _ in range(20):
            await one_poll()
            positions.append(
                consumer._fetcher._subscriptions.subscription.assignment.state_value(tps[0]).position
            )
        held_back.partitions = frozenset()
        for _ in range(10 * SIZES[0]):
            if len(handed[0]) == SIZES[0] and len(handed[1]) == SIZES[1]:
                break
            await one_poll()
        return positions, handed[0], handed[1]
    finally:
        await consumer.stop()


def test_a_partition_held_back_is_not_handed_on_nor_fetched_and_is_whole_once_read_again(bootstrap, topic):
    asyncio.run(_publish(bootstrap, topic))
    positions, zero, one = asyncio.run(_held_back_polls(bootstrap, topic))
    # Held back: partition 0 is fetched no further (its position stays: at most a fetch waits).
    assert len(set(positions)) == 1 and positions[0] < SIZES[0] // 2, positions
    # The other partitions went on meanwhile, and once read again partition 0 is all handed on,
    # once each, in order.
    assert one == [_value(1, n) for n in range(SIZES[1])]
    assert zero == [_value(0, n) for n in range(SIZES[0])]
