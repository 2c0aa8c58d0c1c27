"""Hand the agents what the consumer fetched in small, fair shares, so no topic waits behind another.

Faust hands every record of one poll to the agents before it polls again, and a poll took every
record aiokafka had buffered: on a backlog, tens of thousands of input messages (16 MiB fetches,
``worker_fetch_partition_bytes``). Once a poll's jobs messages were re-keyed, the jobs topic's next
ones waited until the detection agent was through the rest of the poll: re-keying went in bursts
with 3-5 s pauses, and the jobs-by-node copies every partition's merge waits for came late. In a
failover test the alive re-keyer was paused that way for longer than the resume bound (10 s).

A poll here still drains everything aiokafka has fetched, so that its next fetch request covers
every partition at once as before, but it hands on only about ``worker_poll_bytes`` (message values
and keys), shared evenly by the partitions with records waiting, at least one record each; the
rest waits here for the next polls, which come after a fraction of a second of work. Two cheaper
caps were measured and dropped: aiokafka's own ``max_records`` drains partitions in the order their
fetches completed (a capped poll still waits for one input partition's 16 MiB), and taking a share
straight from aiokafka's buffers leaves partitions half-drained, so its next fetch request names
only the drained ones, is held by the broker for Faust's 1.5 s ``fetch_max_wait_ms`` when they
have nothing new, and the busy partition's next records wait behind it (the worker ran 25% slower
at 256 records a message).

The records waiting here are past aiokafka's position: they are dropped when the group changes
the assignment (the new one seeks every partition to its committed offset) and when a seek moves a
partition's position (the worker reading it again), never otherwise. This reaches into Faust's
aiokafka driver and aiokafka's fetcher (their versions are pinned together in pyproject.toml);
``tests/integration/test_worker_fetching.py`` holds the poll to its rules on the real broker.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka.errors import ConsumerStoppedError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from stream.worker.joining import NO_JOINING, BatchedRecord, JoinedRecord, RunJoining, batched_message
from stream.worker.joining import to_message as joined_message

__all__ = ["FairPoll", "FairShareTransport", "HeldBack", "install"]


class HeldBack:
    """The input partitions the worker does not read for now: their records wait in Kafka.

    The runtime sets :attr:`partitions` (a partition's merge holds as many of its records as it
    may); the consumer's polls leave them out, so aiokafka, which fetches a partition again only
    once its last fetch was handed on, keeps at most one fetch of each. Read from the consumer's
    thread: the attribute is replaced, never changed in place.
    """

    def __init__(self) -> None:
        self.partitions: frozenset[Any] = frozenset()


#: A poll that finds every partition held back waits this long (or its timeout) before the next.
_HELD_BACK_WAIT_SECONDS = 0.05


def _size(record: Any) -> int:
    return int(record.serialized_value_size) + max(int(record.serialized_key_size), 0)


@dataclass
class _Waiting:
    """A partition's records drained from aiokafka's fetcher and not handed on yet."""

    assignment: Any  # aiokafka's assignment they were fetched under
    position: int  # the partition's position right after them (a seek moves it)
    records: deque[Any] = field(default_factory=deque)


class FairPoll:
    """The polls of one aiokafka consumer, in fair shares of about ``budget`` bytes, each share's
    runs of records joined as ``joining`` says (:mod:`stream.worker.joining`)."""

    def __init__(
        self, budget: int, joining: RunJoining = NO_JOINING, held_back: HeldBack | None = None
    ) -> None:
        self.budget = budget
        self.joining = joining
        self.held_back = held_back if held_back is not None else HeldBack()
        self.waiting: dict[Any, _Waiting] = {}

    async def __call__(
        self, fetcher: Any, partitions: Set[Any], timeout: float | None
    ) -> dict[Any, list[Any]]:
        """One poll of the ``partitions`` Faust reads now (all when empty): what aiokafka fetched
        joins what waits here (waiting up to ``timeout`` seconds only when nothing does), and each
        partition with records waiting gives its share. A fetch error is raised as aiokafka's own
        poll raises it; what waits here stays for the next poll. Partitions held back
        (:class:`HeldBack`) are not read: what was fetched of them stays where it is."""
        held_back = self.held_back.partitions
        if held_back:
            if not partitions:
                subscription = fetcher._subscriptions.subscription
                partitions = subscription.assignment.tps if subscription is not None else frozenset()
            partitions = frozenset(tp for tp in partitions if tp not in held_back)
            if not partitions:  # every partition held back: wait for the agents to release some
                await asyncio.sleep(min(timeout or 0.0, _HELD_BACK_WAIT_SECONDS))
                return {}
        self._drop_moved(fetcher)
        readable = any(not partitions or tp in partitions for tp in self.waiting)
        fresh = await fetcher.fetched_records(partitions, timeout=0 if readable else timeout)
        self._drop_moved(fetcher, fresh.keys())  # a rebalance or a seek while it waited
        if fresh:
            assignment = fetcher._subscriptions.subscription.assignment
            for tp, records in fresh.items():
                waiting = self.waiting.get(tp)
                if (
                    waiting is None
                    or waiting.assignment is not assignment
                    or records[0].offset < waiting.position
                ):
                    waiting = self.waiting[tp] = _Waiting(assignment, 0)
                waiting.records.extend(records)
                waiting.position = assignment.state_value(tp).position
        return self._shares(partitions)

    def _drop_moved(self, fetcher: Any, just_drained: Set[Any] = frozenset()) -> None:
        """Forget what waits for partitions the consumer no longer reads from where it ends (the
        ``just_drained`` ones moved by the drain itself: their records tell)."""
        if not self.waiting:
            return
        subscription = fetcher._subscriptions.subscription
        assignment = subscription.assignment if subscription is not None else None
        for tp, waiting in list(self.waiting.items()):
            state = assignment.state_value(tp) if assignment is not None and assignment.active else None
            if (
                state is None
                or waiting.assignment is not assignment
                or not state.has_valid_position
                or (state.position != waiting.position and tp not in just_drained)
            ):
                del self.waiting[tp]

    def _shares(self, partitions: Set[Any]) -> dict[Any, list[Any]]:
        ready = [tp for tp in self.waiting if not partitions or tp in partitions]
        if not ready:
            return {}
        share = self.budget // len(ready)
        polled: dict[Any, list[Any]] = {}
        for tp in ready:
            records = self.waiting[tp].records
            first = records.popleft()
            taken, size = [first], _size(first)
            while records and size < share:
                record = records.popleft()
                taken.append(record)
                size += _size(record)
            polled[tp] = self.joining.runs(tp.topic, taken)
            if not records:
                del self.waiting[tp]
        return polled


class FairShareConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, polling through a :class:`FairPoll`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        transport = self.consumer.transport
        self.fair_poll = FairPoll(transport.poll_bytes, transport.joining, transport.held_back)

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
            return await self.fair_poll(fetcher, active_partitions, timeout)


class FairShareConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> FairShareConsumerThread:
        return FairShareConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _to_message(self, tp: TP, record: Any) -> Any:
        if type(record) is JoinedRecord:
            return joined_message(tp, record, self.app.consumer_generation_id)
        if type(record) is BatchedRecord:
            return batched_message(tp, record, self.app.consumer_generation_id)
        return super()._to_message(tp, record)


class FairShareTransport(faust_aiokafka.Transport):
    Consumer = FairShareConsumer

    def __init__(
        self, url: Any, app: faust.App, *, poll_bytes: int, joining: RunJoining, held_back: HeldBack
    ) -> None:
        super().__init__(url, app)
        self.poll_bytes = poll_bytes
        self.joining = joining
        self.held_back = held_back


def install(
    app: faust.App, poll_bytes: int, joining: RunJoining = NO_JOINING, held_back: HeldBack | None = None
) -> HeldBack:
    """Make ``app``'s consumer hand on about ``poll_bytes`` a poll, in fair shares, its runs of
    records joined as ``joining`` says, leaving out the partitions ``held_back`` names; returns it."""
    held_back = held_back if held_back is not None else HeldBack()
    app.transport = FairShareTransport(
        app.conf.broker_consumer, app, poll_bytes=poll_bytes, joining=joining, held_back=held_back
    )
    return held_back
