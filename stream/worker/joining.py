"""One-record messages fetched together, handed to the agents as one message of many lines.

Faust's path costs ~150 µs a message whatever the message holds (docs/performance.md): a producer
that sends one record a message (a log shipper, an exporter of its own) held a worker to ~3,000
records/s, where publishers that batch (``replay --to``) reach ten times that. The fair poll
(:mod:`stream.worker.fetching`) therefore joins each run of consecutive offsets of an input
partition whose values are one line each into one :class:`JoinedRecord`: the values joined by
``\\n``, the run's last offset as its offset (the worker's position and its commits move past the
whole run at once) and its first offset kept, so that each line is located at its own offset
(``offset O``, in dead letters and in the sources of records) exactly as had it come alone.

Nothing waits to be joined: a run is made of records already fetched and handed on in the same
poll, so no record is later than it would have been. A value that holds a newline (a batch of its
producer's own), a tombstone, or a gap in the offsets ends a run; keys and headers are dropped (the
worker reads neither on its input topics; the jobs-by-node copies, whose headers it reads, are never
joined). A crash redoes the whole joined message, as it redoes any message: ids are deterministic.

>>> from aiokafka.structs import ConsumerRecord
>>> def record(offset, value):
...     return ConsumerRecord("ecc", 0, offset, 1_000 + offset, 0, None, value, None, 0, len(value), ())
>>> joined = join_one_line_runs([record(5, b"a"), record(6, b"b"), record(7, b"c\\nd"), record(8, b"e")], 256)
>>> [(r.offset, getattr(r, "first_offset", None), r.value) for r in joined]
[(6, 5, b'a\\nb'), (7, None, b'c\\nd'), (8, None, b'e')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faust.types import TP
from faust.types.tuples import Message

__all__ = ["JoinedMessage", "JoinedRecord", "join_one_line_runs", "joined_from", "skip_applied_lines"]


@dataclass(slots=True)
class JoinedRecord:
    """Consecutive one-line records of a partition as one: an aiokafka ``ConsumerRecord``'s fields
    (those of the run's last record, its values joined, sizes summed) and ``first_offset``."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    timestamp_type: int
    key: bytes | None
    value: bytes
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    headers: tuple[tuple[str, bytes], ...]
    first_offset: int


class JoinedMessage(Message):
    """Faust's message of a :class:`JoinedRecord`: ``offset`` is the last, ``first_offset`` the
    first of the offsets its lines came at (line ``i`` from 0: ``first_offset + i``)."""

    __slots__ = ("first_offset",)

    def __init__(self, *args: Any, first_offset: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_offset = first_offset


def joined_from(message: Any) -> int | None:
    """The first offset of a joined message's lines; None for a message as the broker sent it."""
    return message.first_offset if type(message) is JoinedMessage else None


def to_message(tp: TP, record: JoinedRecord, generation_id: int) -> JoinedMessage:
    """Faust's message of a joined record (what its aiokafka driver makes of a record, plus
    ``first_offset``)."""
    return JoinedMessage(
        record.topic,
        record.partition,
        record.offset,
        record.timestamp / 1000.0 if record.timestamp is not None else None,
        record.timestamp_type,
        record.headers,
        record.key,
        record.value,
        record.checksum,
        record.serialized_key_size,
        record.serialized_value_size,
        tp,
        generation_id=generation_id,
        first_offset=record.first_offset,
    )


def join_one_line_runs(records: list[Any], most: int) -> list[Any]:
    """``records`` (one partition's, in offset order) with each run of consecutive one-line records
    joined into a :class:`JoinedRecord` of at most ``most`` lines; a run of one is left as it was."""
    joined: list[Any] = []
    run: list[Any] = []
    for record in records:
        value = record.value
        if value is not None and b"\n" not in value:
            if run and (record.offset != run[-1].offset + 1 or len(run) >= most):
                joined.append(_joined(run))
                run = []
            run.append(record)
            continue
        if run:
            joined.append(_joined(run))
            run = []
        joined.append(record)
    if run:
        joined.append(_joined(run))
    return joined


def _joined(run: list[Any]) -> Any:
    if len(run) == 1:
        return run[0]
    last = run[-1]
    return JoinedRecord(
        topic=last.topic,
        partition=last.partition,
        offset=last.offset,
        timestamp=last.timestamp,
        timestamp_type=last.timestamp_type,
        key=None,
        value=b"\n".join([record.value for record in run]),
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=sum(record.serialized_value_size for record in run),
        headers=(),
        first_offset=run[0].offset,
    )


def skip_applied_lines(value: bytes, first_offset: int, next_offset: int) -> tuple[bytes, int]:
    """A joined message's value and first offset without the lines before ``next_offset`` (applied
    already: a partition read again from a commit older than its checkpoint, where a run can begin
    before the checkpoint's offset and end past it).

    >>> skip_applied_lines(b"a\\nb\\nc", 10, 12)
    (b'c', 12)
    """
    skipped = next_offset - first_offset
    return value.split(b"\n", skipped)[skipped], next_offset
