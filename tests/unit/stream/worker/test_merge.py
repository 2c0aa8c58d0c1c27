"""The worker's event-time merge: order across sources, idle sources, what a checkpoint carries over."""

from __future__ import annotations

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
        ["ecc", "job"], idle_after=2, clock=clock, drained=lambda source: backlog.get(source, 0) == 0
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
