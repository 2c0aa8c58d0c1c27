"""Dead letters: where bad records go, and the ratio limit that stops a bad deploy loudly.

After arroyo's DLQ: a bad record is an :class:`schemas.records.InvalidRecord` carrying its
reason, source, location and raw bytes; it becomes a :class:`schemas.outputs.DeadLetter`, is
written to the dead-letter sink and counted. If more than ``max_ratio`` of a source's records
are bad (after ``min_records`` of them), :class:`DeadLetterLimitExceeded` stops the run: a wrong
file format or a broken producer must not quietly drain everything into the dead letters.
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from schemas.outputs import DeadLetter
from schemas.records import InvalidRecord

__all__ = ["DeadLetterFile", "DeadLetterLimitExceeded", "DeadLetterPolicy", "reason_class", "to_dead_letter"]


class DeadLetterLimitExceeded(RuntimeError):
    """Too large a share of one source's records were bad; the run stops with this message."""


def reason_class(reason: str) -> str:
    """The reason without its particulars, for counting: the text before the first ``" ("``.

    >>> reason_class("late event (event time 2024-01-01T00:00:00.000Z is older than ...)")
    'late event'
    """
    return reason.split(" (", 1)[0][:100]


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
    """Counts good and bad records per source and enforces the ratio limit.

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
    """  # noqa: E501

    max_ratio: float = 0.5
    min_records: int = 200
    hint: str = "Is this the right input (see --format)?"
    good_by_source: Counter[str] = field(default_factory=Counter)
    bad_by_source: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    late: int = 0

    def good(self, source: str) -> None:
        """Count a record that was used."""
        self.good_by_source[source] += 1

    def bad(self, source: str, reason: str) -> None:
        """Count a dead letter."""
        self.bad_by_source[source] += 1
        self.reasons[reason_class(reason)] += 1

    def check(self, source: str) -> None:
        """Raise :class:`DeadLetterLimitExceeded` if ``source`` is over the limit."""
        bad = self.bad_by_source[source]
        total = bad + self.good_by_source[source]
        if total >= self.min_records and bad > self.max_ratio * total:
            common = self.reasons.most_common(1)[0][0] if self.reasons else "?"
            raise DeadLetterLimitExceeded(
                f"{source}: {bad} of {total} records ({bad / total:.0%}) are dead letters, above the limit "
                f"of {self.max_ratio:.0%} (FAULTSTREAM_DEAD_LETTER_MAX_RATIO); most common reason: {common}. "
                f"{self.hint}"
            )

    @property
    def total_bad(self) -> int:
        """Dead letters counted so far."""
        return sum(self.bad_by_source.values())


class DeadLetterFile:
    """Appends dead letters as JSON Lines (embedded mode's dead-letter "topic").

    The raw bytes are kept exactly, base64-encoded, next to a readable (lossy) text form.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = path.open("ab")

    def write(self, letter: DeadLetter) -> None:
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
