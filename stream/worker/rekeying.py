"""Where a re-keyed job copy came from, so that a copy sent again is recognised and skipped.

The worker that owns a ``jobs`` partition copies each of its messages to ``jobs-by-node``, one
message per partition that holds a node of the message's jobs, and commits the ``jobs`` offset once
every copy was delivered. A worker that dies (or loses the partition in a rebalance) between the
delivery and the commit leaves copies behind that its successor sends again: after eight kills in
a replay 1,514 to 1,538 extra copies, and the extras that arrived behind their partition's watermark
became ``late event`` dead letters (issue 17).

So each copy carries its source in a header, ``faultstream-rekeyed-from: <jobs partition>:<offset>``.
Copies of one source partition reach a ``jobs-by-node`` partition in the source's offset order:
one re-keyer sends them in order and its successor starts at the committed offset, which is
never past a copy already delivered. A copy whose source offset is not past the highest one the
partition has applied is therefore one it has had already. :class:`CopiesApplied` keeps those
highest offsets per ``jobs-by-node`` partition, in its checkpoint, so the rule holds across
restarts: a repeat is skipped before the event-time merge and the watermark see it (and counted,
``faultstream_rekey_repeats_total``), never dead-lettered as late.

The repeats a partition skipped are counted in its checkpoint too (:attr:`CopiesApplied.repeats`),
so the newest checkpoint says how many copies the partition's history skipped, each once, however
many workers were killed while redoing parts of it (the per-process counter loses a killed
worker's count, and counts again a repeat that a successor skips again).

>>> copies = CopiesApplied()
>>> header = copy_headers(0, 41)
>>> copies.repeat(header), copies.repeat(header), copies.repeat(copy_headers(0, 42))
(False, True, False)
>>> copies.repeats
1
>>> copies.repeat(None)  # a copy without the header (a producer of another version): used
False
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["COPY_HEADER", "CopiesApplied", "copy_headers", "copy_source"]

#: The header of a jobs-by-node copy naming the jobs message it was made from.
COPY_HEADER = "faultstream-rekeyed-from"

Headers = Iterable[tuple[str, bytes]] | None


def copy_headers(partition: int, offset: int) -> list[tuple[str, bytes]]:
    """The headers of a copy of message ``offset`` of jobs partition ``partition``."""
    return [(COPY_HEADER, f"{partition}:{offset}".encode())]


def copy_source(headers: Headers) -> tuple[int, int] | None:
    """(jobs partition, offset) a copy was made from, or None if it does not say.

    >>> copy_source([("other", b"x"), (COPY_HEADER, b"2:17")])
    (2, 17)
    >>> copy_source([(COPY_HEADER, b"garbage")]) is None
    True
    """
    for key, value in headers or ():
        if key == COPY_HEADER:
            partition, _, offset = value.partition(b":")
            try:
                return int(partition), int(offset)
            except ValueError:
                return None
    return None


@dataclass(slots=True)
class CopiesApplied:
    """Per jobs partition, the highest source offset of a copy this jobs-by-node partition applied."""

    highest: dict[int, int] = field(default_factory=dict)
    #: Copies found to be repeats (and skipped) over the partition's history, checkpoint included.
    repeats: int = 0

    def repeat(self, headers: Headers) -> bool:
        """Whether a copy was applied already (then skip it); a new one is recorded."""
        source = copy_source(headers)
        if source is None:
            return False
        partition, offset = source
        if offset <= self.highest.get(partition, -1):
            self.repeats += 1
            return True
        self.highest[partition] = offset
        return False
