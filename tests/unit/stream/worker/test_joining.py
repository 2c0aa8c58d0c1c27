"""One-record messages fetched together are joined into one message of lines, each kept at its offset."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord
from faust.types import TP

from stream.kafka.codec import message_lines
from stream.worker.joining import (
    BatchedRecord,
    JoinedRecord,
    batched_message,
    batched_parts,
    join_one_line_runs,
    joined_from,
    skip_applied_lines,
    skip_applied_parts,
    to_message,
)


def _record(offset: int, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()) -> ConsumerRecord:
    size = len(value) if value is not None else -1
    return ConsumerRecord(
        "ecc", 2, offset, 1_700_000_000_000 + offset, 0, b"k", value, None, 1, size, headers
    )


def _spans(records: list[object]) -> list[tuple[int | None, int]]:
    return [(getattr(record, "first_offset", None), record.offset) for record in records]  # type: ignore[attr-defined]


def test_runs_of_consecutive_one_line_values_are_joined_and_anything_else_ends_a_run() -> None:
    records = [
        _record(10, b"a"),
        _record(11, b"b", headers=(("trace", b"x"),)),  # headers: the worker reads none on inputs
        _record(12, b"c\nd"),  # a batch of its producer's own: as it came
        _record(13, b"e"),
        _record(14, b""),  # an empty value is a line too (a dead letter, at its own offset)
        _record(16, b"f"),  # a gap (a compacted or transactional topic): a new run
        _record(17, None),  # a tombstone: as it came
        _record(18, b"g"),
    ]
    joined = join_one_line_runs(records, most=256)
    assert _spans(joined) == [(10, 11), (None, 12), (13, 14), (None, 16), (None, 17), (None, 18)]
    first = joined[0]
    assert isinstance(first, JoinedRecord)
    assert (first.value, first.headers, first.key, first.timestamp) == (
        b"a\nb",
        (),
        None,
        records[1].timestamp,
    )
    assert first.serialized_value_size == 2
    assert joined[1] is records[2] and joined[3] is records[5]
    assert [line for _, line in message_lines(joined[2].value, 14, joined[2].first_offset)] == [b"e", b""]


def test_a_run_is_cut_at_most_lines_and_nothing_is_lost_or_reordered() -> None:
    records = [_record(offset, str(offset).encode()) for offset in range(100, 1100)]
    joined = join_one_line_runs(records, most=256)
    assert [record.offset - record.first_offset + 1 for record in joined] == [256, 256, 256, 232]
    lines = [
        line
        for record in joined
        for _, line in message_lines(record.value, record.offset, record.first_offset)
    ]
    assert lines == [record.value for record in records]


def test_the_message_of_a_joined_record_says_where_its_lines_came_from() -> None:
    record = join_one_line_runs([_record(5, b"x"), _record(6, b"y")], most=8)[0]
    message = to_message(TP("ecc", 2), record, generation_id=3)
    assert (message.offset, joined_from(message), message.generation_id, message.value) == (6, 5, 3, b"x\ny")
    assert message.timestamp == record.timestamp / 1000


def test_lines_applied_already_are_skipped_from_the_partition_position_on() -> None:
    assert skip_applied_lines(b"a\nb\n\nd", 20, 22) == (b"\nd", 22)
    assert skip_applied_lines(b"a\nb", 20, 21) == (b"b", 21)


def test_runs_of_messages_of_several_lines_are_batched_whole_and_anything_else_ends_a_run() -> None:
    records = [
        _record(20, b"a\nb"),
        _record(21, b"c\nd\n"),
        _record(22, b"e\nf"),  # cut here: batch_most is 3
        _record(23, b"g\nh"),
        _record(24, b"i"),  # a one-line message: a run of its own kind
        _record(25, b"j"),
        _record(26, b"k\nl"),
        _record(28, b"m\nn"),  # a gap: a new run
        _record(29, None),  # a tombstone: as it came
        _record(30, b"o\np"),
    ]
    joined = join_one_line_runs(records, most=256, batch_most=3)
    assert [type(record).__name__ for record in joined] == [
        "BatchedRecord", "ConsumerRecord", "JoinedRecord", "ConsumerRecord", "ConsumerRecord", "ConsumerRecord",
        "ConsumerRecord",
    ]  # fmt: skip
    first = joined[0]
    assert isinstance(first, BatchedRecord)
    assert first.parts == ((20, b"a\nb"), (21, b"c\nd\n"), (22, b"e\nf"))
    assert (first.offset, first.headers, first.key, first.value) == (22, (), None, b"")
    assert first.serialized_value_size == sum(len(r.value) for r in records[:3])
    assert joined[1] is records[3]  # a run of one: as it came
    assert joined[3] is records[6] and joined[4] is records[7] and joined[6] is records[9]
    # Without batching, messages of several lines come as they were.
    assert [r.offset for r in join_one_line_runs(records[:3], most=256)] == [20, 21, 22]
    assert all(type(r) is ConsumerRecord for r in join_one_line_runs(records[:3], most=256))


def test_a_batched_message_carries_its_parts_to_faust_and_keeps_every_line_located() -> None:
    records = [_record(offset, b"%d a\n%d b" % (offset, offset)) for offset in range(40, 45)]
    [batched] = join_one_line_runs(records, most=256, batch_most=32)
    message = batched_message(TP("ecc", 2), batched, generation_id=4)
    assert batched_parts(message) == tuple((r.offset, r.value) for r in records)
    assert (message.offset, message.generation_id, joined_from(message)) == (44, 4, None)
    assert (
        batched_parts(
            to_message(TP("ecc", 2), join_one_line_runs([_record(1, b"x"), _record(2, b"y")], 256)[0], 4)
        )
        is None
    )
    located = [loc for offset, value in batched_parts(message) for loc, _ in message_lines(value, offset)]
    assert located[:3] == ["offset 40 line 1", "offset 40 line 2", "offset 41 line 1"] and len(located) == 10
    assert skip_applied_parts(batched.parts, 43) == batched.parts[3:]
