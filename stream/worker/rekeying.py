"""Where a re-keyed copy came from, so that a copy sent again is recognised and skipped.

Said of the jobs here; the kernel-log lines re-keyed to ``kernel-log-by-node``
(:mod:`stream.worker.rekeyed`) follow the same rules, their header naming ``kernel/<partition>``.

The worker that owns a ``jobs`` partition copies each of its messages to ``jobs-by-node``, one
message per partition that holds a node of the message's jobs, and commits the ``jobs`` offset once
every copy was delivered. A worker that dies (or loses the partition in a rebalance) between the
delivery and the commit leaves copies behind that its successor sends again: after eight kills in
a replay some 1,500 extra copies, and the extras that arrived behind their partition's watermark
would be ``late event`` dead letters.

So each copy carries its source in a header, ``faultstream-rekeyed-from: <jobs partition>:<offset>``
(a copy of a message of several lines: they share its offset), or ``<jobs partition>:<o1>,<o2>,...``
with one offset a line when the copy's lines came at offsets of their own (one-record messages the
fetch joined, :mod:`stream.worker.joining`). Copies of one source partition reach a
``jobs-by-node`` partition in the source's offset order: one re-keyer sends them in order and its
successor starts at the committed offset, which is never past a copy already delivered. A copy's
line whose source offset is not past the highest one the partition has applied is therefore one it
has had already. :class:`CopiesApplied` keeps those highest offsets per ``jobs-by-node`` partition,
in its checkpoint, so the rule holds across restarts: a repeat is skipped before the event-time
merge and the watermark see it (and counted, ``faultstream_rekey_repeats_total``), never
dead-lettered as late. A successor may join its one-record messages otherwise than the worker
before it did, so a copy can repeat only its first lines: those are skipped, the rest applied.

The repeats a partition skipped are counted in its checkpoint too (:attr:`CopiesApplied.repeats`,
one a source offset), so the newest checkpoint says how many copies the partition's history
skipped, each once, however many workers were killed while redoing parts of it (the per-process
counter loses a killed worker's count, and counts again a repeat that a successor skips again).

>>> copies = CopiesApplied()
>>> header = copy_headers(0, [41, 41])  # two lines of the message at offset 41
>>> copies.fresh_from(header), copies.fresh_from(header), copies.fresh_from(copy_headers(0, [42]))
(0, None, 0)
>>> copies.fresh_from(copy_headers(0, [40, 42, 43, 45]))  # its first two lines were applied
2
>>> copies.repeats
3
>>> copies.fresh_from(None)  # a copy without the header (a producer of another version): used
0
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["APP_HEADER", "COPY_HEADER", "CopiesApplied", "copy_deployment", "copy_headers", "copy_source"]

#: The header of a jobs-by-node copy naming the jobs message it was made from.
COPY_HEADER = "faultstream-rekeyed-from"
#: The header naming the deployment (application id) that made the copy.
APP_HEADER = "faultstream-app"

Headers = Iterable[tuple[str, bytes]] | None


def copy_headers(
    partition: int, offsets: Sequence[int], app: str = "", input_kind: str = "job"
) -> list[tuple[str, bytes]]:
    """The headers of a copy of partition ``partition`` of the ``input_kind`` input (``job``: the
    jobs topic; ``kernel``: the kernel-log topic) made by deployment ``app``: ``offsets`` has each
    line's offset there, in order (the lines of one message share its offset: then it is said
    once). A job copy names its partition alone, any other its input too.

    >>> copy_headers(2, [17, 17])
    [('faultstream-rekeyed-from', b'2:17')]
    >>> copy_headers(2, [17, 19], "prod")
    [('faultstream-rekeyed-from', b'2:17,19'), ('faultstream-app', b'prod')]
    >>> copy_headers(0, [5], input_kind="kernel")
    [('faultstream-rekeyed-from', b'kernel/0:5')]
    """
    said = offsets[-1:] if offsets[0] == offsets[-1] else offsets
    named = f"{partition}" if input_kind == "job" else f"{input_kind}/{partition}"
    headers = [(COPY_HEADER, f"{named}:{','.join(map(str, said))}".encode())]
    if app:
        headers.append((APP_HEADER, app.encode()))
    return headers


def copy_deployment(headers: Headers) -> str:
    """The application id that made a copy ("" when it does not say).

    >>> copy_deployment([("faultstream-app", b"prod")]), copy_deployment(None)
    ('prod', '')
    """
    for key, value in headers or ():
        if key == APP_HEADER:
            return bytes(value).decode("utf-8", "replace")
    return ""


def copy_source(headers: Headers) -> tuple[int | str, tuple[int, ...]] | None:
    """(source partition, offsets) a copy was made from, or None if it does not say: one offset
    for every line, or one a line. A jobs partition is its number, another input's
    ``<kind>/<number>``.

    >>> copy_source([("other", b"x"), (COPY_HEADER, b"2:17")])
    (2, (17,))
    >>> copy_source([(COPY_HEADER, b"2:17,19")])
    (2, (17, 19))
    >>> copy_source([(COPY_HEADER, b"kernel/0:5")])
    ('kernel/0', (5,))
    >>> copy_source([(COPY_HEADER, b"garbage")]) is None
    True
    """
    for key, value in headers or ():
        if key == COPY_HEADER:
            partition, _, offsets = bytes(value).partition(b":")
            try:
                said = tuple(int(offset) for offset in offsets.split(b","))
                if b"/" in partition:
                    kind, _, number = partition.decode("ascii").partition("/")
                    return f"{kind}/{int(number)}", said
                return int(partition), said
            except (ValueError, UnicodeDecodeError):
                return None
    return None


@dataclass(slots=True)
class CopiesApplied:
    """Per source partition (a jobs partition's number, or ``kernel/<number>``), the highest source
    offset of a copy this partition applied."""

    highest: dict[int | str, int] = field(default_factory=dict)
    #: Copies found to be repeats (and skipped) over the partition's history, checkpoint included:
    #: one a source offset (a copy with an offset a line: one a line).
    repeats: int = 0

    def fresh_from(self, headers: Headers) -> int | None:
        """How many of a copy's first lines were applied already (0: none), or None when all were:
        skip those; the rest is recorded as applied."""
        source = copy_source(headers)
        if source is None:
            return 0
        partition, offsets = source
        highest = self.highest.get(partition, -1)
        if offsets[-1] <= highest:
            self.repeats += len(offsets)
            return None
        applied = bisect.bisect_right(offsets, highest)  # a per-line header's offsets increase
        self.repeats += applied
        self.highest[partition] = offsets[-1]
        return applied
