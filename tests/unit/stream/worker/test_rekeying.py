"""Re-keyed job copies name their source, so a copy sent again is recognised and skipped."""

from __future__ import annotations

from detectors.core import CoreConfig, DetectionCore
from stream.worker.checkpoints import PartitionCheckpoint, decode, encode
from stream.worker.rekeying import COPY_HEADER, CopiesApplied, Headers, copy_headers, copy_source


def _repeat(target: CopiesApplied, headers: Headers) -> bool:
    return target.fresh_from(headers) is None


def test_a_successor_resending_from_the_committed_offset_repeats_only_what_was_applied() -> None:
    target = CopiesApplied()
    first_owner = [copy_headers(0, [offset]) for offset in range(10, 20)]
    assert [_repeat(target, h) for h in first_owner] == [False] * 10
    # Killed after delivering 10..19 but before committing past 14: its successor starts at 15.
    successor = [copy_headers(0, [offset]) for offset in range(15, 25)]
    assert [_repeat(target, h) for h in successor] == [True] * 5 + [False] * 5
    assert target.highest == {0: 24}
    assert target.repeats == 5


def test_a_successor_joining_its_messages_otherwise_repeats_the_first_lines_of_a_copy() -> None:
    """One-record messages joined in other runs by the successor (its fetches end elsewhere): a
    copy can begin before the highest offset applied and end past it."""
    target = CopiesApplied()
    assert target.fresh_from(copy_headers(0, [10, 11, 13])) == 0
    assert target.fresh_from(copy_headers(0, [14, 16])) == 0
    # The successor starts again at 12 (the last commit) and joins 12..18 into one message.
    assert target.fresh_from(copy_headers(0, [12, 13, 14, 17, 18])) == 3
    assert target.highest == {0: 18} and target.repeats == 3
    assert target.fresh_from(copy_headers(0, [16, 17, 18])) is None
    assert target.repeats == 6


def test_sources_are_kept_apart_and_unnamed_copies_are_used() -> None:
    target = CopiesApplied()
    assert not _repeat(target, copy_headers(1, [5]))
    assert not _repeat(target, copy_headers(0, [3]))  # another jobs partition: its own order
    assert _repeat(target, copy_headers(1, [5, 5]))
    assert not _repeat(target, None) and not _repeat(target, [])
    assert not _repeat(target, [(COPY_HEADER, b"not:a number")])
    assert copy_source([(COPY_HEADER, b"1:5")]) == (1, (5,))
    assert copy_source(copy_headers(1, [5, 6, 9])) == (1, (5, 6, 9))


def test_the_checkpoint_carries_the_copies_and_the_generation() -> None:
    checkpoint = PartitionCheckpoint(
        3, {"jobs_by_node": 7}, DetectionCore(CoreConfig()), copies={0: 41}, generation=5
    )
    restored = decode(encode(checkpoint))
    assert (restored.copies, restored.generation, restored.offsets) == ({0: 41}, 5, {"jobs_by_node": 7})


def test_the_repeats_skipped_ride_in_the_checkpoint_and_add_up_across_owners() -> None:
    """The newest checkpoint counts each repeat of the partition's history once: a successor
    restored from it continues the count (what the failover test compares with the extra copies)."""
    from stream.settings import Settings
    from stream.worker.partition import PartitionWorker

    def start(checkpoint: PartitionCheckpoint | None) -> PartitionWorker:
        return PartitionWorker.start(
            1, Settings(topic_partitions=2), ["ecc", "job", "xid"], checkpoint, lambda _: None,
            None, None,  # type: ignore[arg-type]  # neither is used here
        )  # fmt: skip

    first = start(None)
    assert [_repeat(first.copies, copy_headers(0, [o])) for o in (3, 4, 4)] == [False, False, True]
    successor = start(decode(encode(first.checkpoint())))
    assert successor.copies.repeats == 1
    assert [_repeat(successor.copies, copy_headers(0, [o])) for o in (3, 4, 5)] == [True, True, False]
    assert decode(encode(successor.checkpoint())).repeats == 3

    # A checkpoint pickled before repeats were counted has no such slot: it restores as 0.
    older = first.checkpoint()
    del older.repeats
    assert start(decode(encode(older))).copies.repeats == 0
