"""Merging several input partitions into one event-time ordered stream (the worker's reorder buffer).

A worker reads the XID, ECC and job partitions of the same nodes concurrently; Kafka orders each
partition, not the three together. The detection core wants event-time order, so items are held
until every source has moved past them: the *low watermark* is the smallest newest-event-time
over the sources. A source that has said nothing for ``idle_after`` seconds of wall time (a quiet
topic, or the end of a replay) stops holding the others back until it speaks again, provided
``drained(source)`` says nothing of it is waiting to be read: a source that is merely behind (the
reader was paused, a fetch is slow) is not idle, however long it has been silent.

``drained`` answers with the clock time *as of which* nothing was left (the moment the broker was
asked), and an item may pass an idle source only if it arrived before then. Publishers send each
topic's records no later than later records of the other topics, so whatever of the idle source
was published before the item was, was already known, and read, at that moment. Without that
rule a progress answer older than the item let it pass records of the idle source still on
their way (job copies still being re-keyed while a replay was published into running workers:
"late event" dead letters and missing attributions).

Ties are released by (event time, source name, arrival order): deterministic whatever the
interleaving of the partitions was.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["EventTimeMerger"]

T = TypeVar("T")


@dataclass(slots=True)
class _Source:
    newest_ms: int = -(2**63)
    last_seen: float = 0.0


@dataclass(slots=True)
class EventTimeMerger(Generic[T]):
    """Buffer of items from several sources, released in event-time order.

    Examples
    --------
    >>> now = [0.0]
    >>> merger = EventTimeMerger(["ecc", "xid"], idle_after=5.0, clock=lambda: now[0])
    >>> merger.add("xid", 30, "x30"); merger.add("ecc", 10, "e10"); merger.add("ecc", 40, "e40")
    >>> list(merger.release())        # xid is at 30, ecc at 40: up to 30
    ['e10', 'x30']
    >>> now[0] = 10.0                 # xid silent for 10 s: idle, no longer holds ecc back
    >>> merger.add("ecc", 41, "e41")
    >>> list(merger.release())
    ['e40', 'e41']
    """

    sources: list[str]
    idle_after: float = 2.0
    clock: Callable[[], float] = field(default=lambda: 0.0)
    drained: Callable[[str], float | None] = field(default=lambda source: float("inf"))
    _heap: list[tuple[int, str, int, float, T]] = field(default_factory=list)
    _state: dict[str, _Source] = field(default_factory=dict)
    _arrivals: Iterator[int] = field(default_factory=itertools.count)
    _started: bool = False

    def __post_init__(self) -> None:
        now = self.clock()
        self._state = {name: _Source(last_seen=now) for name in self.sources}

    def add(self, source: str, ts_ms: int, item: T) -> None:
        """Hold ``item`` of ``source`` at event time ``ts_ms``."""
        now = self.clock()
        if not self._started:
            # The idle clock starts with the first record: a merger made before any arrived (the
            # fleet stage's partition) must not find the other sources long silent at once.
            self._started = True
            for other in self._state.values():
                other.last_seen = now
        state = self._state[source]
        state.newest_ms = max(state.newest_ms, ts_ms)
        state.last_seen = now
        heapq.heappush(self._heap, (ts_ms, source, next(self._arrivals), now, item))

    def add_many(self, source: str, items: list[tuple[int, T]]) -> None:
        """Hold ``(event time, item)`` pairs of ``source``, in order: :meth:`add` for each (one
        message's records arrive together, so the clock is read once).

        >>> merger = EventTimeMerger(["ecc"], idle_after=5.0)
        >>> merger.add_many("ecc", [(20, "e20"), (10, "e10")]); list(merger.release())
        ['e10', 'e20']
        """
        if not items:
            return
        now = self.clock()
        if not self._started:
            self._started = True
            for other in self._state.values():
                other.last_seen = now
        state = self._state[source]
        state.newest_ms = max(state.newest_ms, max(ts_ms for ts_ms, _ in items))
        state.last_seen = now
        heap, arrivals, push = self._heap, self._arrivals, heapq.heappush
        for ts_ms, item in items:
            push(heap, (ts_ms, source, next(arrivals), now, item))

    def _progress(self) -> tuple[int | None, list[tuple[int, float]]]:
        """The low watermark of the active sources (None: all are idle), and (newest event time,
        drained as of) of each idle one."""
        now = self.clock()
        active: list[int] = []
        idle: list[tuple[int, float]] = []
        for name, state in self._state.items():
            drained_at = None if now - state.last_seen < self.idle_after else self.drained(name)
            if drained_at is None:
                active.append(state.newest_ms)
            else:
                idle.append((state.newest_ms, drained_at))
        return (min(active) if active else None), idle

    def __len__(self) -> int:
        return len(self._heap)

    def held(self) -> list[tuple[str, int, T]]:
        """The items not yet released, as (source, event time, item) in release order.

        Adding them to a fresh merger in this order holds them exactly as this one does (a
        checkpoint does that); the sources' progress starts afresh there.
        """
        return [(source, ts_ms, item) for ts_ms, source, _, _, item in sorted(self._heap)]

    def release(self, ready: Callable[[int, T], bool] | None = None) -> Iterator[T]:
        """Items whose event time is at or before the low watermark, in order; with ``ready``,
        only as long as ``ready(event time, item)`` says the next one may go (the rest stay held,
        in their order)."""
        active, idle = self._progress()
        heap = self._heap
        if active is None:
            active = heap[0][0] + 2**62 if heap else 0  # all idle: everything that arrived in time
        while heap and heap[0][0] <= active:
            ts_ms, _, _, arrived, item = heap[0]
            for newest_ms, drained_at in idle:
                if newest_ms < ts_ms and arrived > drained_at:
                    return  # past an idle source, known idle only from before it arrived: wait
            if ready is not None and not ready(ts_ms, item):
                return
            yield heapq.heappop(heap)[4]
