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

Publishers keep that order only to within milliseconds across partitions: Kafka orders each
partition, and a producer's requests to several partitions (several brokers, or one broker's
batches of different partitions) become readable a few milliseconds out of the order they were
sent in — a jobs record of a paced replay was read 2 to 7 ms after an answer asked once later
ECC records had arrived, with the producer not lingering. A drained answer therefore covers what
was published up to :data:`PUBLISH_SKEW_SECONDS` before it was asked (the runtime gives the merge
the time asked minus that): a record behind an idle source waits that much longer, and a few
milliseconds of skew never let it pass a record still on its way.

Ties are released by (event time, source name, arrival order): deterministic whatever the
interleaving of the partitions was.

Each source's items are kept in a list sorted by (event time, arrival), which a partition's
records, in event-time order or nearly, extend at its end (one that comes out of order is inserted
in place); a release takes the smallest head of the sources. A backlog makes the merge hold tens
of thousands of records (the ECC partition is read well ahead of the job copies the re-keying
makes): a heap of them all cost a few microseconds a record to push and pop, and sorting it for
each checkpoint tens of milliseconds.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["PUBLISH_SKEW_SECONDS", "EventTimeMerger"]

#: How far out of their send order records of different partitions may become readable: an idle
#: source's drained answer covers what was published this long before it was asked (seven times
#: the largest skew measured on one broker, 6.7 ms; brokers side by side add their requests' spread).
PUBLISH_SKEW_SECONDS = 0.05

T = TypeVar("T")

#: Released items a source's list keeps before it is compacted (once they are half of it). Few:
#: a released record is freed only then, and while thousands stayed (4,096) the decoder's next
#: records went to memory out of the CPU's caches and the core read them there: decoding took
#: 1.5x and the release into the core 1.7x what they take now (benchmarks/worker_path.py).
_COMPACT_AFTER = 64
#: A source's newest event time before it delivered anything.
_NOTHING_YET = -(2**63)
#: An event time past every real one (the low watermark when every source is idle).
_END_OF_TIME = 2**63


@dataclass(slots=True)
class _Source:
    name: str
    newest_ms: int = _NOTHING_YET
    last_seen: float = 0.0
    #: Items held, ``(event time, arrival, arrived at, item)`` sorted; those before ``head`` are gone.
    held: list[tuple[int, int, float, Any]] = field(default_factory=list)
    head: int = 0

    def hold(self, entry: tuple[int, int, float, Any]) -> None:
        held = self.held
        if len(held) == self.head or entry[0] >= held[-1][0]:
            held.append(entry)  # in order: arrivals only grow
        else:
            bisect.insort(held, entry, lo=self.head)  # (event time, arrival) is unique: items never compared

    def hold_many(self, entries: list[tuple[int, int, float, Any]]) -> int:
        """:meth:`hold` each of ``entries`` (in arrival order): in one call when they come in order
        after what is held, as a source's records nearly always do. Returns their newest event
        time (the one pass over them finds it)."""
        held = self.held
        last_ms = held[-1][0] if len(held) > self.head else -(2**63)
        for entry in entries:
            if entry[0] < last_ms:
                break
            last_ms = entry[0]
        else:
            held.extend(entries)
            return entries[-1][0] if entries else last_ms
        for entry in entries:
            self.hold(entry)
        return max(entry[0] for entry in entries)

    def compact(self) -> None:
        """Drop the released items once they are many and half of the list."""
        if self.head >= _COMPACT_AFTER and 2 * self.head >= len(self.held):
            del self.held[: self.head]
            self.head = 0


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
    #: Sources a deployment may not use at all: idle from the start while drained.
    optional: frozenset[str] = frozenset()
    _state: dict[str, _Source] = field(default_factory=dict)
    #: The sources by name: a tie in event time goes to the first.
    _by_name: list[_Source] = field(default_factory=list)
    _arrivals: Iterator[int] = field(default_factory=itertools.count)
    _started: bool = False
    #: The source of the item :meth:`release` gave last (for :meth:`hold_back`).
    _last_released: _Source | None = None

    def __post_init__(self) -> None:
        now = self.clock()
        self._state = {name: _Source(name, last_seen=now) for name in self.sources}
        self._by_name = [self._state[name] for name in sorted(self._state)]

    def _arrive(self, source: str) -> tuple[_Source, float]:
        now = self.clock()
        if not self._started:
            # The idle clock starts with the first record: a merger made before any arrived (the
            # fleet stage's partition) must not find the other sources long silent at once.
            self._started = True
            for other in self._state.values():
                other.last_seen = now
        state = self._state[source]
        state.last_seen = now
        return state, now

    def add(self, source: str, ts_ms: int, item: T) -> None:
        """Hold ``item`` of ``source`` at event time ``ts_ms``."""
        state, now = self._arrive(source)
        state.newest_ms = max(state.newest_ms, ts_ms)
        state.hold((ts_ms, next(self._arrivals), now, item))

    def add_many(self, source: str, items: list[tuple[int, T]]) -> None:
        """Hold ``(event time, item)`` pairs of ``source``, in order: :meth:`add` for each (one
        message's records arrive together, so the clock is read once).

        >>> merger = EventTimeMerger(["ecc"], idle_after=5.0)
        >>> merger.add_many("ecc", [(20, "e20"), (10, "e10")]); list(merger.release())
        ['e10', 'e20']
        """
        if not items:
            return
        state, now = self._arrive(source)
        arrivals = self._arrivals
        newest_ms = state.hold_many([(ts_ms, next(arrivals), now, item) for ts_ms, item in items])
        if newest_ms > state.newest_ms:
            state.newest_ms = newest_ms

    def _progress(self) -> tuple[int | None, list[tuple[int, float]]]:
        """The low watermark of the active sources (None: all are idle), and (newest event time,
        drained as of) of each idle one."""
        now = self.clock()
        active: list[int] = []
        idle: list[tuple[int, float]] = []
        for name, state in self._state.items():
            # An optional source that has delivered nothing is idle as soon as nothing of it is left
            # to read: there is no silence between its records to wait out (the kernel log of a site
            # that ships none held every other source for ``idle_after`` at each start).
            unused = state.newest_ms == _NOTHING_YET and name in self.optional
            silent = unused or now - state.last_seen >= self.idle_after
            drained_at = self.drained(name) if silent else None
            if drained_at is None:
                active.append(state.newest_ms)
            else:
                idle.append((state.newest_ms, drained_at))
        return (min(active) if active else None), idle

    def __len__(self) -> int:
        return sum(len(state.held) - state.head for state in self._by_name)

    def peek(self) -> tuple[str, int, T] | None:
        """The item :meth:`release` would give first, were its sources past it: (source, event
        time, item); None when nothing is held.

        >>> merger = EventTimeMerger(["ecc", "xid"])
        >>> merger.add("xid", 30, "x30"); merger.add("ecc", 40, "e40"); merger.peek()
        ('xid', 30, 'x30')
        """
        best: _Source | None = None
        for state in self._by_name:
            if state.head < len(state.held) and (
                best is None or state.held[state.head][0] < best.held[best.head][0]
            ):
                best = state
        if best is None:
            return None
        ts_ms, _, _, item = best.held[best.head]
        return best.name, ts_ms, item

    def held_count(self, source: str) -> int:
        """How many items of ``source`` are held now."""
        state = self._state.get(source)
        return 0 if state is None else len(state.held) - state.head

    def oldest_arrival(self) -> float | None:
        """The clock time at which the earliest-arrived of the sources' next items arrived (how long
        the merge has held what it would release next); None when nothing is held."""
        arrivals = [state.held[state.head][2] for state in self._by_name if state.head < len(state.held)]
        return min(arrivals, default=None)

    def hold_back(self, count: int = 1) -> None:
        """Hold again the last ``count`` items of the run :meth:`release_runs` gave last, at the
        head of their source, as if they had not been released: for a caller that could not use
        them yet, right after they came (nothing added or released since).

        >>> merger = EventTimeMerger(["ecc", "xid"], idle_after=5.0)
        >>> merger.add_many("ecc", [(10, "e10"), (20, "e20"), (40, "e40")]); merger.add("xid", 30, "x30")
        >>> runs = merger.release_runs(unchecked={"ecc"})
        >>> next(runs)
        ['e10', 'e20']
        >>> runs.close(); merger.hold_back(1); list(merger.release())
        ['e20', 'x30']
        """
        last = self._last_released
        if last is None or not 0 < count <= last.head:
            raise RuntimeError(f"nothing to hold back ({count} asked)")
        last.head -= count
        self._last_released = None

    def held(self) -> list[tuple[str, int, T]]:
        """The items not yet released, as (source, event time, item) in release order.

        Adding them to a fresh merger in this order holds them exactly as this one does (a
        checkpoint does that); the sources' progress starts afresh there.
        """
        entries = [
            (ts_ms, state.name, arrival, item)
            for state in self._by_name
            for ts_ms, arrival, _, item in itertools.islice(state.held, state.head, None)
        ]
        # Sorted runs, merged by the tuples' own order: an arrival is unique, so an item is never
        # compared (a key function made this 80 ms of a commit point holding 69,000 records).
        entries.sort()
        return [(source, ts_ms, item) for ts_ms, source, _, item in entries]

    def release(
        self, ready: Callable[[int, T], bool] | None = None, unchecked: Collection[str] = ()
    ) -> Iterator[T]:
        """The items of :meth:`release_runs`, one at a time (a run's source is past it once its first
        item comes: a caller that may stop early uses :meth:`release_runs`)."""
        for run in self.release_runs(ready, unchecked):
            yield from run

    def release_runs(
        self, ready: Callable[[int, T], bool] | None = None, unchecked: Collection[str] = ()
    ) -> Iterator[list[T]]:
        """Items whose event time is at or before the low watermark, in order, in runs of one
        source's; with ``ready``, only as long as ``ready(event time, item)`` says the next one may
        go (the rest stay held, in their order), except the items of the sources named in
        ``unchecked``, which go without asking. Nothing is added while the items are being taken
        (the worker applies them, then adds the next message's).

        An asked item comes alone, once asked (its answer may depend on what the caller did with
        the one before); an unchecked source's items come as one run, the source's head already
        past them: a caller that cannot use the last ``n`` of a run gives them back with
        ``hold_back(n)``. A run is one list, not a generator's step an item: a worker's ECC
        partition releases thousands in a row.

        >>> merger = EventTimeMerger(["ecc", "xid"], idle_after=5.0)
        >>> merger.add_many("ecc", [(10, "e10"), (20, "e20"), (40, "e40")]); merger.add("xid", 30, "x30")
        >>> list(merger.release_runs(lambda ts_ms, item: True, unchecked={"ecc"}))
        [['e10', 'e20'], ['x30']]
        """
        active, idle = self._progress()
        limit = _END_OF_TIME if active is None else active  # all idle: everything that arrived in time
        # An item may not pass an idle source known drained only from before it arrived: the items
        # of one arrival (a message's) may go up to the newest time of the earliest such source,
        # worked out once an arrival (``idle`` does not change during a release).
        cut_for: float | None = None
        cut_ms = _END_OF_TIME
        sources = self._by_name
        while True:
            best: _Source | None = None
            best_ms = limit
            for state in sources:  # the smallest head, the first source by name on a tie
                if state.head < len(state.held):
                    ts_ms = state.held[state.head][0]
                    if ts_ms < best_ms or (best is None and ts_ms == best_ms):
                        best, best_ms = state, ts_ms
            if best is None:
                return
            # The best source's items go one after the other until another source's head is due
            # (a source before it by name wins a tie, one after it loses it): one look at the
            # other heads a run, not one an item (a backlog's ECC partition releases thousands).
            below, up_to = limit + 1, limit
            after_best = False
            for state in sources:
                if state is best:
                    after_best = True
                elif state.head < len(state.held):
                    if after_best:
                        up_to = min(up_to, state.held[state.head][0])
                    else:
                        below = min(below, state.held[state.head][0])
            held = best.held
            head, end = best.head, len(held)
            ask = None if best.name in unchecked else ready
            first = head
            waits = False
            while head < end:
                ts_ms, _, arrived, item = held[head]
                if ts_ms >= below or ts_ms > up_to:
                    break
                if arrived != cut_for:
                    cut_for = arrived
                    cut_ms = min(
                        (newest_ms for newest_ms, drained_at in idle if arrived > drained_at),
                        default=_END_OF_TIME,
                    )
                if ts_ms > cut_ms:
                    waits = True  # past an idle source, known drained only from before it arrived
                    break
                if ask is not None:
                    if not ask(ts_ms, item):
                        return
                    head += 1
                    best.head = head  # before the item goes: the caller may stop here
                    self._last_released = best
                    yield [item]
                    continue
                head += 1
            if ask is None and head > first:
                best.head = head
                self._last_released = best
                yield [entry[3] for entry in itertools.islice(held, first, head)]
            if waits:
                return
            best.compact()
