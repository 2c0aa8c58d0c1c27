"""Dead letters: where bad records go, and the limits that stop a bad deploy loudly.

After arroyo's DLQ: a bad record is an :class:`schemas.records.InvalidRecord` carrying its
reason, source, location and raw bytes; it becomes a :class:`schemas.outputs.DeadLetter`, which
goes to the ``dead_letters`` table (through the ClickHouse sink, like every row) and to one
:class:`DeadLetterProducer`: a JSON Lines file in embedded mode (:class:`DeadLetterFile`), the
dead-letter topic on Kafka (:class:`KafkaDeadLetters`), or nowhere else (:class:`NoDeadLetters`).

:class:`DeadLetterPolicy` counts them: if more than ``max_ratio`` of a source's records are bad
(after ``min_records`` of them), or ``max_consecutive`` records in a row are, the run stops with
:class:`DeadLetterLimitExceeded`. The ratio catches a wrong input from the start; the consecutive
count catches a producer that breaks after millions of good records, whose ratio would take as
many bad ones to cross the limit.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from schemas.outputs import DeadLetter
from schemas.records import InvalidRecord
from stream.settings import Settings

__all__ = [
    "DeadLetterFile",
    "DeadLetterLimitExceeded",
    "DeadLetterPolicy",
    "DeadLetterProducer",
    "KafkaDeadLetters",
    "NoDeadLetters",
    "dead_letter_headers",
    "dead_letter_value",
    "reason_class",
    "to_dead_letter",
]


class DeadLetterLimitExceeded(RuntimeError):
    """Too large a share of one source's records were bad; the run stops with this message."""


def reason_class(reason: str) -> str:
    """The reason without its particulars, for counting: the text before the first ``" ("`` or
    ``", got "``, with quoted values (not field names) masked.

    It is a Prometheus label (``faultstream_dead_letters_total{reason}``): hostile input must not
    make one series per bad value.

    >>> reason_class("late event (event time 2024-01-01T00:00:00.000Z is older than ...)")
    'late event'
    >>> reason_class("field 'xid' must be <= 65535, got 99999")
    "field 'xid' must be <= 65535"
    >>> reason_class("unknown ECC counter 'x1' (known: sbe_volatile, ...)")
    "unknown ECC counter '…'"
    >>> reason_class("field 'pci_bus_id': not a PCI bus id: 'zz'")
    "field 'pci_bus_id': not a PCI bus id: '…'"
    >>> reason_class("field 'ts': not an ISO-8601 timestamp: '99999999… (1,000,016 characters, cut)")
    "field 'ts': not an ISO-8601 timestamp: '…'"
    """
    text = reason.split(" (", 1)[0].split(", got ", 1)[0]
    return _QUOTED.sub(lambda match: match[1] or "'…'", text)[:100]


#: A quoted field name (``field 'xid'``, kept) or a quoted value (masked; its end may have been
#: cut off with the rest of a long reason) in a reason.
_QUOTED = re.compile(r"(field '[^']*')|'[^']*(?:'|$)")


def to_dead_letter(
    error: InvalidRecord, record_kind: str = "unknown", event_ms: int | None = None
) -> DeadLetter:
    """Turn a rejected record into the dead-letter record that is stored."""
    return DeadLetter(
        source=error.source,
        location=error.location,
        reason=error.reason,
        raw=error.raw,
        record_kind=record_kind,
        event_ms=event_ms,
    )


@dataclass(slots=True)
class DeadLetterPolicy:
    """Counts good and bad records per source and enforces the ratio and the consecutive limits.

    Examples
    --------
    >>> policy = DeadLetterPolicy(max_ratio=0.5, min_records=4)
    >>> for _ in range(3):
    ...     policy.bad("f.log", "unparseable")
    >>> policy.good("f.log")
    >>> policy.check("f.log")
    Traceback (most recent call last):
    ...
    stream.sinks.dead_letters.DeadLetterLimitExceeded: f.log: 3 of 4 records (75%) are dead letters, above the limit of 50% (FAULTSTREAM_DEAD_LETTER_MAX_RATIO); most common reason: unparseable. Is this the right input (see --format)?
    >>> policy = DeadLetterPolicy(max_consecutive=3)
    >>> for _ in range(3):
    ...     policy.bad("xid/0", "not JSON")
    >>> policy.check("xid/0")
    Traceback (most recent call last):
    ...
    stream.sinks.dead_letters.DeadLetterLimitExceeded: xid/0: the last 3 records in a row are dead letters (FAULTSTREAM_DEAD_LETTER_MAX_CONSECUTIVE); most common reason: not JSON. Is this the right input (see --format)?
    """  # noqa: E501

    max_ratio: float = 0.5
    min_records: int = 200
    #: This many bad records in a row from one source stop the run (0: no limit).
    max_consecutive: int = 0
    hint: str = "Is this the right input (see --format)?"
    good_by_source: Counter[str] = field(default_factory=Counter)
    bad_by_source: Counter[str] = field(default_factory=Counter)
    bad_in_a_row: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    def good(self, source: str, count: int = 1) -> None:
        """Count records that were used."""
        self.good_by_source[source] += count
        if self.bad_in_a_row[source]:
            self.bad_in_a_row[source] = 0

    def bad(self, source: str, reason: str) -> None:
        """Count a dead letter."""
        self.bad_by_source[source] += 1
        self.bad_in_a_row[source] += 1
        self.reasons[reason_class(reason)] += 1

    def check(self, source: str) -> None:
        """Raise :class:`DeadLetterLimitExceeded` if ``source`` is over a limit."""
        bad = self.bad_by_source[source]
        total = bad + self.good_by_source[source]
        common = self.reasons.most_common(1)[0][0] if self.reasons else "?"
        if total >= self.min_records and bad > self.max_ratio * total:
            raise DeadLetterLimitExceeded(
                f"{source}: {bad} of {total} records ({bad / total:.0%}) are dead letters, above the limit "
                f"of {self.max_ratio:.0%} (FAULTSTREAM_DEAD_LETTER_MAX_RATIO); most common reason: {common}. "
                f"{self.hint}"
            )
        in_a_row = self.bad_in_a_row[source]
        if self.max_consecutive and in_a_row >= self.max_consecutive:
            raise DeadLetterLimitExceeded(
                f"{source}: the last {in_a_row} records in a row are dead letters "
                f"(FAULTSTREAM_DEAD_LETTER_MAX_CONSECUTIVE); most common reason: {common}. {self.hint}"
            )

    @classmethod
    def from_settings(cls, settings: Settings, hint: str | None = None) -> DeadLetterPolicy:
        """The limits configured by ``FAULTSTREAM_DEAD_LETTER_*``; ``hint`` ends the stop message."""
        policy = cls(
            settings.dead_letter_max_ratio,
            settings.dead_letter_min_records,
            settings.dead_letter_max_consecutive,
        )
        if hint is not None:
            policy.hint = hint
        return policy

    @property
    def total_bad(self) -> int:
        """Dead letters counted so far."""
        return sum(self.bad_by_source.values())


class DeadLetterProducer(Protocol):
    """Where dead letters go besides the ``dead_letters`` table (arroyo's DLQ producer).

    ``batch`` names the unit of work the letter belongs to (a worker's input partition): a
    producer that delivers at commit points delivers a batch's letters with that batch.
    """

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        """Take one dead letter."""


class NoDeadLetters:
    """Dead letters go to the ``dead_letters`` table only."""

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        """Drop the copy: the table has the letter."""


#: Raw bytes a dead-letter message carries at most: an input message may be as large as the
#: broker takes (1 MiB by default), and its letter adds a key and headers, so a letter of the
#: largest input would be refused (and the worker would stop on it). Longer raw values are cut
#: on the topic, with their full size in a ``raw_bytes`` header; the ``dead_letters`` table keeps
#: them whole.
MAX_TOPIC_RAW_BYTES = 900 * 1024


def dead_letter_headers(letter: DeadLetter) -> list[tuple[str, bytes]]:
    """The Kafka headers of a dead-letter message; its value is the raw bytes, its key the source.

    >>> letter = DeadLetter("xid/0", "offset 1", "not JSON", b"x" * 2**20, "xid")
    >>> [name for name, _ in dead_letter_headers(letter)]
    ['reason', 'source', 'location', 'raw_bytes']
    """
    headers = [
        ("reason", letter.reason.encode()),
        ("source", letter.source.encode()),
        ("location", letter.location.encode()),
    ]
    if len(letter.raw) > MAX_TOPIC_RAW_BYTES:
        headers.append(("raw_bytes", str(len(letter.raw)).encode()))
    return headers


def dead_letter_value(letter: DeadLetter) -> bytes:
    """The value of a dead-letter message: the raw bytes, cut at :data:`MAX_TOPIC_RAW_BYTES`."""
    return letter.raw[:MAX_TOPIC_RAW_BYTES]


#: Sends one message ``(key, value, headers)`` to the dead-letter topic; awaiting the result
#: waits for the broker's ack (aiokafka's ``send`` and Faust's ``Topic.send`` both fit).
SendMessage = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[Awaitable[Any]]]


class KafkaDeadLetters:
    """The dead-letter topic: letters are held per batch and delivered at its commit point.

    Examples
    --------
    >>> import asyncio
    >>> sent = []
    >>> async def send(key, value, headers):
    ...     sent.append((key, value, dict(headers)["reason"]))
    ...     return asyncio.sleep(0)  # the "ack"
    >>> letters = KafkaDeadLetters(send)
    >>> letters.produce(DeadLetter("xid/0", "offset 7", "not JSON", b"{", "xid"), batch=0)
    >>> letters.pending(0)
    1
    >>> asyncio.run(letters.deliver(0)), sent
    (1, [(b'xid/0', b'{', b'not JSON')])
    """

    def __init__(self, send: SendMessage) -> None:
        self._send = send
        self._pending: dict[int, list[DeadLetter]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        """Hold ``letter`` until :meth:`deliver` of its batch."""
        self._pending.setdefault(batch, []).append(letter)

    def pending(self, batch: int) -> int:
        """Letters of ``batch`` not delivered yet."""
        return len(self._pending.get(batch, ()))

    async def deliver(self, batch: int) -> int:
        """Send the batch's letters and wait for the broker's acks; return how many.

        When it returns, every letter of the batch produced before the call is acknowledged. If
        sending fails, the letters not acknowledged stay pending for the next try. One delivery of
        a batch runs at a time: a second one (the publish timer beside a commit point) waits, then
        sends only what was produced since — before, both sent the same letters, and letters
        produced while the acks were awaited were dropped from the topic (the fuzz soak showed it).
        """
        async with self._locks.setdefault(batch, asyncio.Lock()):
            letters = self._pending.pop(batch, [])
            try:
                acks = [
                    await self._send(
                        letter.source.encode(), dead_letter_value(letter), dead_letter_headers(letter)
                    )
                    for letter in letters
                ]
                for ack in acks:
                    await ack
            except BaseException:
                self._pending[batch] = letters + self._pending.get(batch, [])
                raise
            return len(letters)

    def discard(self, batch: int) -> None:
        """Forget a batch's letters (its partition moved to a worker that redoes them)."""
        self._pending.pop(batch, None)


class DeadLetterFile:
    """Appends dead letters as JSON Lines (embedded mode's dead-letter "topic"); a
    :class:`DeadLetterProducer`.

    The raw bytes are kept exactly, base64-encoded, next to a readable (lossy) text form.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = path.open("ab")

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        """Append one dead letter."""
        record = {
            "source": letter.source,
            "location": letter.location,
            "reason": letter.reason,
            "record_kind": letter.record_kind,
            "event_ms": letter.event_ms,
            "raw_text": letter.raw.decode("utf-8", "replace"),
            "raw_base64": base64.b64encode(letter.raw).decode(),
        }
        self._file.write(orjson.dumps(record) + b"\n")

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()
