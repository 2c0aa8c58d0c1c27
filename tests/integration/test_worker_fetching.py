"""The worker's fair-share poll (stream/worker/fetching.py) on aiokafka's real fetcher and the real
broker: a poll takes a share of every partition with records fetched, about its byte budget;
across polls it hands on every record once, in each partition's order; and after a seek it hands
on from the new position, nothing of what it held from before.

No broker fails these tests, never skips them: run them through tests/run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream.worker.fetching import FairPoll
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


async def _publish(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, value=_value(partition, n), partition=partition)
            for partition, size in SIZES.items()
            for n in range(size)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _polls(
    bootstrap: str, topic: str, budget_bytes: int, seek_after_first: int | None = None
) -> list[dict[int, list[bytes]]]:
    """Every poll (partition -> values) until all of the topic is handed on, once all its
    partitions' first fetches are in (so that every poll has all of them to share out);
    ``seek_after_first``: partition 0 is sought back to this offset after the first poll."""
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
        poll = FairPoll(budget_bytes)
        last = {partition: _value(partition, size - 1) for partition, size in SIZES.items()}
        reached: set[int] = set()
        while reached != set(SIZES):
            assert len(polls) < 10 * sum(SIZES.values()), "the polls stopped handing records on"
            drained = await poll(fetcher, set(), 2.0)
            polls.append(
                {tp.partition: [record.value for record in records] for tp, records in drained.items()}
            )
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
