"""One-record messages fetched together, handed to the agents as one message of many lines.

Faust's path costs ~150 µs a message whatever the message holds (docs/performance.md): a producer
that sends one record a message (a log shipper, an exporter of its own) held a worker to ~3,000
records/s, where publishers that batch (``replay --to``) reach ten times that. The fair poll
(:mod:`stream.worker.fetching`) therefore joins each run of consecutive offsets of an input
partition whose values are one line each into one :class:`JoinedRecord`: the values joined by
``\\n``, the run's last offset as its offset (the worker's position and its commits move past the
whole run at once) and its first offset kept, so that each line is located at its own offset
(``offset O``, in dead letters and in the sources of records) exactly as had it come alone.

Messages of several lines (a publisher's batches, ``replay --to``'s 256 records) cost Faust the same
~150 µs each and the worker its per-message checks (~70 µs), ~1 µs a record: in the input topics
the worker applies (not the jobs topic, which it re-keys line by line), each run of consecutive such
messages is handed on as one :class:`BatchedRecord` of up to ``batch_most`` messages, each message
kept whole with its offset (``parts``), so that its lines are located ``offset O line i`` as before
and the worker decodes and releases them message by message.

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

__all__ = [
    "NO_JOINING",
    "BatchedMessage",
    "BatchedRecord",
    "JoinedMessage",
    "JoinedRecord",
    "RunJoining",
    "batched_parts",
    "join_one_line_runs",
    "joined_from",
    "skip_applied_lines",
    "skip_applied_parts",
]


@dataclass(slots=True)
class _RunRecord:
    """An aiokafka ``ConsumerRecord``'s fields, for a run of consecutive records of a partition
    handed on as one: those of the run's last record, its key and headers dropped, sizes summed."""

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


@dataclass(slots=True)
class JoinedRecord(_RunRecord):
    """Consecutive one-line records of a partition as one: their values joined, and
    ``first_offset``."""

    first_offset: int


@dataclass(slots=True)
class BatchedRecord(_RunRecord):
    """Consecutive messages of several lines each of a partition as one: no value of its own, and
    ``parts``, each message's ``(offset, value)`` in order."""

    parts: tuple[tuple[int, bytes], ...]


class JoinedMessage(Message):
    """Faust's message of a :class:`JoinedRecord`: ``offset`` is the last, ``first_offset`` the
    first of the offsets its lines came at (line ``i`` from 0: ``first_offset + i``)."""

    __slots__ = ("first_offset",)

    def __init__(self, *args: Any, first_offset: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_offset = first_offset


class BatchedMessage(Message):
    """Faust's message of a :class:`BatchedRecord`: ``offset`` is its last message's, ``parts`` each
    message's ``(offset, value)``."""

    __slots__ = ("parts",)

    def __init__(self, *args: Any, parts: tuple[tuple[int, bytes], ...], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts = parts


def batched_parts(message: Any) -> tuple[tuple[int, bytes], ...] | None:
    """The ``(offset, value)`` of each message of a batched one; None for any other message."""
    return message.parts if type(message) is BatchedMessage else None


def joined_from(message: Any) -> int | None:
    """The first offset of a joined message's lines; None for a message as the broker sent it."""
    return message.first_offset if type(message) is JoinedMessage else None


def _message_args(tp: TP, record: _RunRecord) -> tuple[Any, ...]:
    """The positional arguments of Faust's ``Message`` for a run's record (what its aiokafka
    driver makes of a record)."""
    return (
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
    )


def to_message(tp: TP, record: JoinedRecord, generation_id: int) -> JoinedMessage:
    """Faust's message of a joined record, with ``first_offset``."""
    return JoinedMessage(
        *_message_args(tp, record), generation_id=generation_id, first_offset=record.first_offset
    )


def batched_message(tp: TP, record: BatchedRecord, generation_id: int) -> BatchedMessage:
    """Faust's message of a batched record, with ``parts``."""
    return BatchedMessage(*_message_args(tp, record), generation_id=generation_id, parts=record.parts)


@dataclass(frozen=True, slots=True)
class RunJoining:
    """What the worker's fetch joins: in ``topics``, runs of one-line records by up to ``most``
    lines, and in ``batch_topics`` (some of them) runs of records of several lines by up to
    ``batch_most`` messages (0 or 1: never)."""

    topics: frozenset[str] = frozenset()
    most: int = 0
    batch_topics: frozenset[str] = frozenset()
    batch_most: int = 0

    def runs(self, topic: str, records: list[Any]) -> list[Any]:
        """``records`` (one partition of ``topic``, in offset order) with its runs joined."""
        if topic not in self.topics or (self.most <= 1 and self.batch_most <= 1):
            return records
        return join_one_line_runs(records, self.most, self.batch_most if topic in self.batch_topics else 0)


#: Nothing joined: every record is handed on as it was fetched.
NO_JOINING = RunJoining()


def join_one_line_runs(records: list[Any], most: int, batch_most: int = 0) -> list[Any]:
    """``records`` (one partition's, in offset order) with each run of consecutive one-line records
    joined into a :class:`JoinedRecord` of at most ``most`` lines, and with ``batch_most`` > 1 each
    run of consecutive records of several lines into a :class:`BatchedRecord` of at most that many;
    a run of one is left as it was."""
    joined: list[Any] = []
    run: list[Any] = []
    run_of_lines = False  # the run's records hold several lines each
    for record in records:
        value = record.value
        if value is None:
            several = None  # a tombstone: as it came
        else:
            several = b"\n" in value
            if several and batch_most <= 1:
                several = None
        if several is not None:
            if run and (
                several is not run_of_lines
                or record.offset != run[-1].offset + 1
                or len(run) >= (batch_most if several else most)
            ):
                joined.append(_joined(run, run_of_lines))
                run = []
            run_of_lines = several
            run.append(record)
            continue
        if run:
            joined.append(_joined(run, run_of_lines))
            run = []
        joined.append(record)
    if run:
        joined.append(_joined(run, run_of_lines))
    return joined


def _joined(run: list[Any], of_lines: bool) -> Any:
    if len(run) == 1:
        return run[0]
    last = run[-1]
    fields = {
        "topic": last.topic,
        "partition": last.partition,
        "offset": last.offset,
        "timestamp": last.timestamp,
        "timestamp_type": last.timestamp_type,
        "key": None,
        "checksum": None,
        "serialized_key_size": 0,
        "serialized_value_size": sum(record.serialized_value_size for record in run),
        "headers": (),
    }
    if of_lines:
        return BatchedRecord(
            **fields, value=b"", parts=tuple((record.offset, record.value) for record in run)
        )
    return JoinedRecord(
        **fields, value=b"\n".join([record.value for record in run]), first_offset=run[0].offset
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


def skip_applied_parts(
    parts: tuple[tuple[int, bytes], ...], next_offset: int
) -> tuple[tuple[int, bytes], ...]:
    """A batched message's parts without those before ``next_offset`` (applied already, as for
    :func:`skip_applied_lines`).

    >>> skip_applied_parts(((10, b"a\\nb"), (11, b"c\\nd"), (12, b"e\\nf")), 11)
    ((11, b'c\\nd'), (12, b'e\\nf'))
    """
    return tuple(part for part in parts if part[0] >= next_offset)
