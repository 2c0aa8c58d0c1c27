"""Where each input partition stands: the next offset the worker must apply, and when it moved.

The worker commits input offsets itself, at its commit points (see :mod:`stream.worker.app`), instead
of through Faust's acks: Faust's offset tracking can commit past messages its agents never saw (it
counts a jump in read offsets as acked, and without a committed offset it does not check the head
of its acked list). Our input topics are neither compacted nor transactional, so their offsets are
contiguous: a message past the next expected offset means messages were skipped on the way, and
the partition is read again from the expected offset. A partition that has more to read but has
delivered nothing for a while is read again from there too (a stalled fetch).

>>> positions = InputPositions(clock=lambda: 0.0)
>>> positions.expect("xid/0", 10)
>>> positions.check("xid/0", 9), positions.check("xid/0", 10), positions.check("xid/0", 12)
(<Delivery.REPEAT: 'repeat'>, <Delivery.NEXT: 'next'>, <Delivery.GAP: 'gap'>)
>>> positions.seek_to("xid/0")  # read again from the first offset not applied
11
>>> positions.seek_to("xid/0") is None  # once, until that offset arrives
True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from enum import Enum
from typing import Generic, TypeVar

__all__ = ["Delivery", "InputPositions"]

P = TypeVar("P", bound=Hashable)


class Delivery(Enum):
    """What a delivered message is, relative to the partition's position."""

    NEXT = "next"  #: the offset expected next (or the first one seen): apply it
    REPEAT = "repeat"  #: already applied (re-read after a restart, a rebalance or a seek)
    GAP = "gap"  #: past the expected offset: something in between was skipped


class InputPositions(Generic[P]):
    """Next expected offset and last delivery time per partition (``P``: any partition key)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._next: dict[P, int] = {}
        self._delivered_at: dict[P, float] = {}
        self._seeking: set[P] = set()

    def expect(self, partition: P, next_offset: int) -> None:
        """The next offset to apply is known (from a checkpoint)."""
        self._next[partition] = next_offset
        self._delivered_at[partition] = self._clock()

    def next_offset(self, partition: P) -> int | None:
        """The first offset not applied yet; None before anything was applied or expected."""
        return self._next.get(partition)

    def check(self, partition: P, offset: int, last: int | None = None) -> Delivery:
        """Classify a delivered message (one joining several, :mod:`stream.worker.joining`: its
        offsets ``offset`` to ``last``); a ``NEXT`` one moves the position past it."""
        self._delivered_at[partition] = self._clock()
        expected = self._next.get(partition)
        if expected is None or offset == expected:
            self._next[partition] = (offset if last is None else last) + 1
            self._seeking.discard(partition)
            return Delivery.NEXT
        return Delivery.REPEAT if offset < expected else Delivery.GAP

    def busy(self) -> None:
        """The reader has other messages queued ahead: no partition's silence counts as a stall
        until it has caught up with them (a message behind a backlog is late, not lost)."""
        now = self._clock()
        for partition in self._delivered_at:
            self._delivered_at[partition] = now

    def waited(self, partition: P) -> None:
        """The partition was not read on purpose until now (held back): its silence so far is no stall."""
        if partition in self._delivered_at:
            self._delivered_at[partition] = self._clock()

    def seek_to(self, partition: P) -> int | None:
        """The offset to read the partition again from after a gap; None if a read from there
        was asked for already and has not arrived yet (the rest of the old batch is ignored)."""
        if partition in self._seeking or partition not in self._next:
            return None
        self._seeking.add(partition)
        return self._next[partition]

    def stalled(
        self, partition: P, end_offset: int | None, after_s: float, start: int | None = None
    ) -> int | None:
        """The offset to read again from, if the partition has messages before ``end_offset``
        that have not come for ``after_s`` seconds; else None. ``start``: where reading begins
        when nothing was applied yet (the committed offset). Asked again only after another
        ``after_s`` without a delivery."""
        expected = self._next.get(partition, start)
        if expected is None or end_offset is None or end_offset <= expected:
            return None
        now = self._clock()
        since = self._delivered_at.setdefault(partition, now)
        if now - since < after_s:
            return None
        self._delivered_at[partition] = now
        self._seeking.add(partition)
        return expected

    def forget(self, partitions: Iterable[P]) -> None:
        """Partitions this worker no longer owns."""
        for partition in partitions:
            self._next.pop(partition, None)
            self._delivered_at.pop(partition, None)
            self._seeking.discard(partition)
