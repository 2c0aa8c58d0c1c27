"""Hand the agents what the consumer fetched in small, fair shares, so no topic waits behind another.

Faust hands every record of one poll to the agents before it polls again, and a poll took every
record aiokafka had buffered: on a backlog, tens of thousands of input messages (16 MiB fetches,
``worker_fetch_partition_bytes``). Once a poll's jobs messages were re-keyed, the jobs topic's next
ones waited until the detection agent was through the rest of the poll: re-keying went in bursts
with 3-5 s pauses, and the jobs-by-node copies every partition's merge waits for came late. In a
failover test the alive re-keyer was paused that way for longer than the resume bound (10 s).

A poll here takes about ``worker_poll_bytes`` of message values and keys, shared evenly by the
partitions that have records fetched (each at least one record), so the next poll, and the jobs
topic's next messages, come after a fraction of a second of work. The budget is in bytes, not
messages, because the work is: a message holds one record or a few hundred. aiokafka capped a poll
another way, by messages, draining partitions in the order their fetches completed: a capped poll
would still wait for one input partition's 16 MiB before another partition's first record.

This reaches into Faust's aiokafka driver and aiokafka's fetcher (their versions are pinned
together in pyproject.toml); ``tests/integration/test_worker_fetching.py`` holds the poll to its
rules on the real broker.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import faust
from aiokafka.consumer.fetcher import FetchResult
from aiokafka.errors import ConsumerStoppedError
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["FairShareTransport", "fair_poll", "install", "records_for"]


def records_for(share_bytes: int, record_bytes: int) -> int:
    """How many records of ``record_bytes`` each fill a partition's share of a poll (at least one).

    >>> records_for(1 << 20, 180), records_for(1 << 20, 46_000), records_for(100, 0)
    (5825, 22, 100)
    """
    return max(share_bytes // max(record_bytes, 1), 1)


async def fair_poll(
    fetcher: Any, partitions: Set[Any], timeout: float | None, budget: int
) -> dict[Any, list[Any]]:
    """Take a poll of about ``budget`` bytes from an aiokafka consumer's fetcher, in even shares
    of the ``partitions`` (all when empty) with records fetched: wait up to ``timeout`` seconds for
    the first record (or raise the first partition's fetch error, as aiokafka's own poll does),
    then take each partition's share without waiting, sized by its first record (a partition's
    messages are alike: one topic, one producer's batching)."""
    drained: dict[Any, list[Any]] = await fetcher.fetched_records(partitions, timeout=timeout, max_records=1)
    if not drained:
        return drained
    ready = [
        tp
        for tp, result in list(fetcher._records.items())
        if type(result) is FetchResult and (not partitions or tp in partitions)
    ]
    share = budget // max(len(set(ready) | drained.keys()), 1)
    for tp in ready:
        if type(fetcher._records.get(tp)) is not FetchResult:
            # An error waiting for a partition stays for the next poll, which raises it before it
            # hands on anything (nothing handed on here is lost to it).
            continue
        taken = drained.get(tp)
        if taken is None:
            taken = (await fetcher.fetched_records({tp}, timeout=0, max_records=1)).get(tp)
            if not taken:
                continue
            drained[tp] = taken
        first = taken[0]
        more = records_for(share, first.serialized_value_size + max(first.serialized_key_size, 0)) - len(
            taken
        )
        if more > 0:
            taken.extend((await fetcher.fetched_records({tp}, timeout=0, max_records=more)).get(tp, ()))
    return drained


class FairShareConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, polling with :func:`fair_poll`."""

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: Set[Any],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> dict[Any, list[Any]]:
        # Faust's own checks, then its fetched_records call replaced.
        if not self.consumer.flow_active:
            return {}
        fetcher = consumer._fetcher
        if consumer._closed or fetcher._closed:
            raise ConsumerStoppedError()
        with fetcher._subscriptions.fetch_context():
            return await fair_poll(fetcher, active_partitions, timeout, self.consumer.transport.poll_bytes)


class FairShareConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> FairShareConsumerThread:
        return FairShareConsumerThread(self, loop=self.loop, beacon=self.beacon)


class FairShareTransport(faust_aiokafka.Transport):
    Consumer = FairShareConsumer

    def __init__(self, url: Any, app: faust.App, *, poll_bytes: int) -> None:
        super().__init__(url, app)
        self.poll_bytes = poll_bytes


def install(app: faust.App, poll_bytes: int) -> None:
    """Make ``app``'s consumer poll about ``poll_bytes`` at a time, in fair shares."""
    app.transport = FairShareTransport(app.conf.broker_consumer, app, poll_bytes=poll_bytes)
