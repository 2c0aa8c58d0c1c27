"""The worker's event-time merge: order across sources, idle sources, what a checkpoint carries over."""

from __future__ import annotations

import heapq
import random
import weakref
from collections.abc import Callable

import pytest

from stream.worker.merge import EventTimeMerger
from tests.services.clock import Clock


def test_records_come_out_in_event_time_order_across_sources() -> None:
    clock = Clock()
    merger: EventTimeMerger[str] = EventTimeMerger(["ecc", "job", "xid"], idle_after=5, clock=clock)
    for source, ts in [("xid", 30), ("ecc", 10), ("job", 20), ("ecc", 40), ("job", 35), ("xid", 50)]:
        merger.add(source, ts, f"{source}{ts}")
    assert list(merger.release()) == ["ecc10", "job20", "xid30", "job35"]  # job is at 35
    assert len(merger) == 2


def test_a_silent_source_stops_holding_back_only_once_nothing_of_it_is_left_to_read() -> None:
    clock = Clock()
    backlog = {"job": 3}  # messages of the source still waiting in Kafka
    merger: EventTimeMerger[str] = EventTimeMerger(
        ["ecc", "job"],
        idle_after=2,
        clock=clock,
        drained=lambda source: None if backlog.get(source, 0) else clock.now,  # asked just now
    )
    merger.add("job", 5, "job5")
    merger.add("ecc", 10, "ecc10")
    merger.add("ecc", 20, "ecc20")
    assert list(merger.release()) == ["job5"]
    clock.now = 60.0  # the job source has been silent for a minute, but it is only behind
    assert list(merger.release()) == []
    backlog["job"] = 0  # now it has nothing left: idle, no longer holds the ECC samples back
    assert list(merger.release()) == ["ecc10", "ecc20"]


def test_held_records_added_to_a_fresh_merger_come_out_the_same() -> None:
    clock = Clock()
    first: EventTimeMerger[str] = EventTimeMerger(["ecc", "xid"], idle_after=2, clock=clock)
    for source, ts in [("xid", 7), ("ecc", 3), ("ecc", 7), ("xid", 3), ("ecc", 9)]:
        first.add(source, ts, f"{source}{ts}")
    assert list(first.release()) == ["ecc3", "xid3", "ecc7", "xid7"]
    first.add("ecc", 8, "ecc8")
    held = first.held()
    assert [item for _, _, item in held] == ["ecc8", "ecc9"]
    second: EventTimeMerger[str] = EventTimeMerger(["ecc", "xid"], idle_after=2, clock=clock)
    for source, ts, item in held:
        second.add(source, ts, item)
    clock.now = 10.0  # both sources silent (and drained): everything held is released, in order
    assert list(second.release()) == ["ecc8", "ecc9"]


def test_an_item_passes_an_idle_source_only_if_it_came_before_the_source_was_found_drained() -> None:
    """The race of a replay published into running workers: the jobs source was found drained by
    a progress answer from before an ECC record came; job copies published before that record
    may still be on their way, so the record waits for a newer answer."""
    clock = Clock()
    answered_at: dict[str, float | None] = {"job": None}
    merger: EventTimeMerger[str] = EventTimeMerger(
        ["ecc", "job"], idle_after=2, clock=clock, drained=lambda source: answered_at.get(source, 0.0)
    )
    merger.add("job", 5, "job5")
    merger.add("ecc", 10, "ecc10")  # arrives at 0.0
    clock.now = 3.0
    answered_at["job"] = 2.5  # the broker, asked at 2.5: nothing of the jobs source left
    merger.add("ecc", 20, "ecc20")  # arrives at 3.0, after that answer
    assert list(merger.release()) == ["job5", "ecc10"]  # ecc20 might pass a job copy still coming
    merger.add("job", 15, "job15")  # it was: re-keyed after 2.5
    clock.now = 6.0
    answered_at["job"] = 5.5  # asked again: drained as of 5.5, after ecc20 came
    assert list(merger.release()) == ["job15", "ecc20"]


def test_released_items_are_let_go_a_message_or_so_later() -> None:
    """The merge keeps nothing it released for long: a record it still referenced was not freed,
    and with thousands so kept each new record was decoded into memory out of the CPU's caches."""

    class Item:
        pass

    merger: EventTimeMerger[Item] = EventTimeMerger(["ecc"], idle_after=5)
    refs = []
    for message in range(40):  # 40 messages of 256 records, each released as it comes
        items = [Item() for _ in range(256)]
        refs += [weakref.ref(item) for item in items]
        merger.add_many("ecc", [(message * 256 + i, item) for i, item in enumerate(items)])
        del items
        assert len(list(merger.release())) == 256
    assert sum(ref() is not None for ref in refs) <= 2 * 256


class _HeapMerger:
    """The merge as a heap of every held item keyed (event time, source, arrival): the
    specification the per-source lists of EventTimeMerger must release exactly like."""

    def __init__(self, sources: list[str]) -> None:
        self.newest = dict.fromkeys(sources, -(2**63))
        self.heap: list[tuple[int, str, int, str]] = []
        self.arrivals = 0

    def add(self, source: str, ts: int, item: str) -> None:
        self.newest[source] = max(self.newest[source], ts)
        heapq.heappush(self.heap, (ts, source, self.arrivals, item))
        self.arrivals += 1

    def release(self, ready: Callable[[int, str], bool]) -> list[str]:
        low = min(self.newest.values())
        out = []
        while self.heap and self.heap[0][0] <= low and ready(self.heap[0][0], self.heap[0][3]):
            out.append(heapq.heappop(self.heap)[3])
        return out

    def held(self) -> list[tuple[str, int, str]]:
        return [(source, ts, item) for ts, source, _, item in sorted(self.heap)]


@pytest.mark.parametrize("seed", range(40))
def test_per_source_lists_release_as_one_heap_would(seed: int) -> None:
    """Out-of-order records within a source, ties across and within sources, a ``ready`` that
    stops releases part-way, checkpoints (held, restored into a fresh merger) in between."""
    rng = random.Random(seed)
    sources = ["xid", "ecc", "job"]
    merger: EventTimeMerger[str] = EventTimeMerger(sources, idle_after=1e9)
    reference = _HeapMerger(sources)
    clock = dict.fromkeys(sources, 0)
    released: list[str] = []
    expected: list[str] = []
    for step in range(400):
        source = rng.choice(sources)
        clock[source] += rng.choice([0, 0, 1, 2, 5])
        batch = [
            (max(clock[source] - rng.choice([0, 0, 0, 3]), 0), f"{source}{step}.{i}")
            for i in range(rng.randint(1, 4))
        ]
        if rng.random() < 0.5:
            merger.add_many(source, batch)
        else:
            for ts, item in batch:
                merger.add(source, ts, item)
        for ts, item in batch:
            reference.add(source, ts, item)
        if rng.random() < 0.3:
            # Records wait (for the fleet stage) from a random event time on, or none do.
            stop_at = rng.choice([None, min(clock.values()) - rng.randint(0, 6)])

            def ready(ts: int, item: str, stop_at: int | None = stop_at) -> bool:
                return stop_at is None or ts < stop_at

            released += merger.release(ready)
            expected += reference.release(ready)
        if rng.random() < 0.05:  # a checkpoint restored into a fresh merger
            assert merger.held() == reference.held()
            fresh: EventTimeMerger[str] = EventTimeMerger(sources, idle_after=1e9)
            for source_name, ts, item in merger.held():
                fresh.add(source_name, ts, item)
            for name, state in merger._state.items():
                fresh._state[name].newest_ms = state.newest_ms
            merger = fresh
        assert released == expected
        assert len(merger) == len(reference.heap)
    assert merger.held() == reference.held()


@pytest.mark.parametrize("seed", range(3))
def test_long_runs_of_one_source_release_as_one_heap_would(seed: int) -> None:
    """A backlog's shape: one source thousands of items ahead of the others, released in long
    runs (past the lists' compaction), ties between the run and the other heads, stops part-way."""
    rng = random.Random(seed)
    sources = ["xid", "ecc", "job"]
    merger: EventTimeMerger[str] = EventTimeMerger(sources, idle_after=1e9)
    reference = _HeapMerger(sources)
    released: list[str] = []
    expected: list[str] = []
    for step in range(30):
        for source, count in (
            ("ecc", rng.randint(200, 900)),
            ("xid", rng.randint(0, 9)),
            ("job", rng.randint(0, 3)),
        ):
            start = step * 1000
            batch = sorted((start + rng.randint(0, 999), f"{source}{step}.{i}") for i in range(count))
            merger.add_many(source, batch)
            for ts, item in batch:
                reference.add(source, ts, item)
        stop_at = rng.choice([None, step * 1000 + rng.randint(0, 999)])

        def ready(ts: int, item: str, stop_at: int | None = stop_at) -> bool:
            return stop_at is None or ts < stop_at

        released += merger.release(ready)
        expected += reference.release(ready)
        assert released == expected
    assert len(released) > 3 * 4096  # past several compactions of the ECC list
    assert merger.held() == reference.held()


def test_items_of_unchecked_sources_go_without_asking_ready_in_the_same_order() -> None:
    """``release(ready, unchecked)``: the named sources' items are not asked about (the worker's
    ECC samples), the others are, and a refusal still stops the release where it is."""
    merger: EventTimeMerger[str] = EventTimeMerger(["ecc", "xid"])
    merger.add_many("ecc", [(t, f"ecc{t}") for t in (1, 2, 5, 6)])
    merger.add_many("xid", [(t, f"xid{t}") for t in (3, 4)])
    merger.add_many("ecc", [(10, "ecc10")])
    merger.add_many("xid", [(10, "xid10")])
    asked: list[str] = []

    def ready(ts_ms: int, item: str) -> bool:
        asked.append(item)
        return item != "xid4"

    assert list(merger.release(ready, unchecked={"ecc"})) == ["ecc1", "ecc2", "xid3"]
    assert asked == ["xid3", "xid4"]
    assert list(merger.release(None, unchecked={"ecc"})) == ["xid4", "ecc5", "ecc6", "ecc10", "xid10"]


def test_an_unchecked_sources_items_come_in_runs_asked_ones_alone_and_a_runs_tail_can_go_back() -> None:
    merger: EventTimeMerger[str] = EventTimeMerger(["ecc", "xid"], idle_after=5, clock=Clock())
    merger.add_many("ecc", [(10, "e10"), (20, "e20"), (30, "e30"), (50, "e50")])
    merger.add_many("xid", [(40, "x40"), (45, "x45"), (60, "x60")])
    asked: list[str] = []

    def ready(ts_ms: int, item: str) -> bool:
        asked.append(item)
        return True

    runs = merger.release_runs(ready, unchecked={"ecc"})
    assert next(runs) == ["e10", "e20", "e30"]  # one list, nothing asked
    assert next(runs) == ["x40"] and next(runs) == ["x45"]  # asked, one at a time
    assert asked == ["x40", "x45"]
    assert list(runs) == [["e50"]]  # the low watermark (ecc's newest), x60 past it
    merger.add_many("ecc", [(70, "e70"), (80, "e80"), (90, "e90")])
    merger.add("xid", 100, "x100")
    runs = merger.release_runs(ready, unchecked={"ecc"})
    assert next(runs) == ["x60"]
    assert next(runs) == ["e70", "e80", "e90"]
    runs.close()
    merger.hold_back(2)  # the caller could use e70 only
    with pytest.raises(RuntimeError):
        merger.hold_back(1)  # given back already: nothing was released since
    assert list(merger.release()) == ["e80", "e90"]


class _IdleHeapMerger:
    """:class:`_HeapMerger` with idle sources: a source silent for ``idle_after`` seconds whose
    drain is known (``drained(source)``: as of when) no longer holds the low watermark back, and an
    item may pass it only if the source was known drained after the item arrived."""

    def __init__(self, sources: list[str], idle_after: float) -> None:
        self.sources = sources
        self.idle_after = idle_after
        self.newest = dict.fromkeys(sources, -(2**63))
        self.last_seen = dict.fromkeys(sources, 0.0)
        self.started = False
        self.heap: list[tuple[int, str, int, float, str]] = []
        self.arrivals = 0

    def add(self, source: str, ts: int, item: str, now: float) -> None:
        if not self.started:
            self.started = True
            self.last_seen = dict.fromkeys(self.sources, now)
        self.last_seen[source] = now
        self.newest[source] = max(self.newest[source], ts)
        heapq.heappush(self.heap, (ts, source, self.arrivals, now, item))
        self.arrivals += 1

    def release(self, now: float, drained: Callable[[str], float | None]) -> list[str]:
        idle = {}
        for source in self.sources:
            known = drained(source) if now - self.last_seen[source] >= self.idle_after else None
            if known is not None:
                idle[source] = known
        active = [self.newest[s] for s in self.sources if s not in idle]
        low = min(active) if active else 2**63
        out = []
        while self.heap and self.heap[0][0] <= low:
            ts, _, _, arrived, _ = self.heap[0]
            if any(self.newest[s] < ts and arrived > known for s, known in idle.items()):
                break  # it might pass a record of that source still on its way
            out.append(heapq.heappop(self.heap)[4])
        return out


@pytest.mark.parametrize("seed", range(30))
def test_idle_sources_hold_back_what_arrived_after_they_were_found_drained_as_one_heap_would(
    seed: int,
) -> None:
    """Sources fall silent and speak again, their drain known as of moments before or after the
    records of the others arrived (a message's records arrive together), unchecked runs and asked
    items mixed: the merge releases what the heap model releases, in its order."""
    rng = random.Random(seed)
    sources = ["ecc", "job", "xid"]
    clock = Clock()
    drained_as_of: dict[str, float | None] = dict.fromkeys(sources)
    merger: EventTimeMerger[str] = EventTimeMerger(
        sources, idle_after=2.0, clock=clock, drained=drained_as_of.get
    )
    reference = _IdleHeapMerger(sources, idle_after=2.0)
    event_time = dict.fromkeys(sources, 0)
    released: list[str] = []
    expected: list[str] = []
    for step in range(300):
        clock.now += rng.choice([0.0, 0.5, 1.0, 3.0])
        # Busy sources speak often, quiet ones rarely: they go idle and back.
        source = rng.choices(sources, weights=[6, 1, 1])[0]
        event_time[source] += rng.choice([0, 1, 2, 10])
        batch = [
            (max(event_time[source] - rng.choice([0, 0, 2]), 0), f"{source}{step}.{i}")
            for i in range(rng.randint(1, 5))
        ]
        merger.add_many(source, batch)
        for ts, item in batch:
            reference.add(source, ts, item, clock.now)
        for name in sources:  # a progress answer: drained as of a moment up to 4 s ago, or unknown
            if rng.random() < 0.3:
                drained_as_of[name] = rng.choice([None, clock.now - rng.choice([0.0, 0.5, 2.0, 4.0])])
        if rng.random() < 0.5:
            released += [item for run in merger.release_runs(lambda ts, item: True, {"ecc"}) for item in run]
            expected += reference.release(clock.now, drained_as_of.get)
        assert released == expected
    assert [item for _, _, item in merger.held()] == [entry[4] for entry in sorted(reference.heap)]
