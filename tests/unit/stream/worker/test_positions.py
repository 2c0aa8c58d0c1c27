"""Input positions: contiguous offsets applied once, gaps and stalls read again."""

from __future__ import annotations

from stream.worker.positions import Delivery, InputPositions
from tests.services.clock import Clock


def test_the_first_message_sets_the_position_and_repeats_are_recognised() -> None:
    positions: InputPositions[str] = InputPositions(Clock())
    assert positions.next_offset("p") is None
    assert positions.check("p", 40) is Delivery.NEXT
    assert positions.check("p", 41) is Delivery.NEXT
    assert positions.check("p", 41) is Delivery.REPEAT
    assert positions.next_offset("p") == 42


def test_a_gap_asks_for_one_read_from_the_first_missing_offset() -> None:
    positions: InputPositions[str] = InputPositions(Clock())
    positions.expect("p", 5)
    assert positions.check("p", 8) is Delivery.GAP
    assert positions.seek_to("p") == 5
    assert positions.check("p", 9) is Delivery.GAP  # the rest of the old batch
    assert positions.seek_to("p") is None
    assert positions.check("p", 5) is Delivery.NEXT  # the read from 5 arrived
    assert positions.check("p", 7) is Delivery.GAP
    assert positions.seek_to("p") == 6  # a new gap asks again


def test_a_partition_with_more_to_read_and_nothing_delivered_is_stalled() -> None:
    clock = Clock()
    positions: InputPositions[str] = InputPositions(clock)
    positions.expect("p", 100)
    clock.now = 14.0
    assert positions.stalled("p", end_offset=150, after_s=15) is None
    clock.now = 16.0
    assert positions.stalled("p", end_offset=100, after_s=15) is None  # nothing left to read
    assert positions.stalled("p", end_offset=150, after_s=15) == 100
    assert positions.stalled("p", end_offset=150, after_s=15) is None  # asked; wait again
    clock.now = 32.0
    assert positions.stalled("p", end_offset=150, after_s=15) == 100
    positions.check("p", 100)
    clock.now = 40.0
    assert positions.stalled("p", end_offset=150, after_s=15) is None  # it moves again


def test_a_partition_that_never_delivered_is_read_from_its_committed_offset() -> None:
    clock = Clock()
    positions: InputPositions[str] = InputPositions(clock)
    assert positions.stalled("p", end_offset=10, after_s=5, start=3) is None  # starts the clock
    clock.now = 6.0
    assert positions.stalled("p", end_offset=10, after_s=5, start=3) == 3
    assert positions.stalled("q", end_offset=10, after_s=5) is None  # nowhere to start from


def test_forgotten_partitions_start_over() -> None:
    positions: InputPositions[str] = InputPositions(Clock())
    positions.expect("p", 7)
    positions.forget(["p"])
    assert positions.next_offset("p") is None
    assert positions.check("p", 3) is Delivery.NEXT
