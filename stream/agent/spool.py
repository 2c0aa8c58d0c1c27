"""The agent's on-disk spool: every record goes here first, then to Kafka.

Records are appended to segment files (``<number>.seg`` in the spool folder) and sent from the
oldest not yet acknowledged; ``delivered.json`` (written atomically) holds how far Kafka has
acknowledged, and segments wholly behind it are deleted. So records read while the broker is
away wait on disk, and a restart sends what the previous run had not got acknowledged.

Each append writes its records and then a *marker* holding the source's position after them (the
file's inode and offset, the journal's cursor), in one ``write``, flushed to disk before it
returns: the newest marker is where reading resumes after a crash, so no line is spooled twice.

Size bound: the segments stay under ``max_bytes``. When an append would pass it, the oldest
segments are deleted, unsent records and all: those records are *dropped* (counted by the caller's
metric, said in a loud log line). Within the bound nothing is lost.

Repeats: before a batch is sent, ``delivered.json`` records how far it reaches (``sending``).
After a crash, the records between ``delivered`` and ``sending`` may already be in Kafka: sending
them again is harmless (the worker's ids are deterministic) and :meth:`Spool.take_in_doubt` says
how many there were, for the repeats metric. A batch that failed part-way and is sent again
repeats the records of it that had been acknowledged, counted the same way.

Entry layout (little-endian): ``crc32 u32 | kind u8 | appended_ms u64 | topic_len u16 | key_len u16
| value_len u32`` then topic, key and value; ``crc32`` covers everything after itself. A torn entry
at the end of the newest segment (a crash mid-write) is cut off at start.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stream.agent.state_file import read_state, write_state

__all__ = ["Dropped", "Spool", "SpoolEntry", "SpoolPosition"]

_log = logging.getLogger("faultstream.agent")

_HEADER = struct.Struct("<IBQHHI")
_RECORD = 0
_MARKER = 1


@dataclass(frozen=True, slots=True, order=True)
class SpoolPosition:
    """A place in the spool: segment number and byte offset in it."""

    segment: int
    offset: int


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One record waiting for Kafka, and where the next entry starts."""

    topic: str
    key: bytes
    value: bytes
    appended_ms: int
    end: SpoolPosition


@dataclass(frozen=True, slots=True)
class Dropped:
    """Records an append had to drop to keep the spool under its bound."""

    records: int
    bytes: int


def _encode(kind: int, topic: str, key: bytes, value: bytes, appended_ms: int) -> bytes:
    topic_bytes = topic.encode()
    body = _HEADER.pack(0, kind, appended_ms, len(topic_bytes), len(key), len(value))[4:]
    body += topic_bytes + key + value
    return struct.pack("<I", zlib.crc32(body)) + body


def _entries(handle: BinaryIO, offset: int) -> Iterable[tuple[int, int, str, bytes, bytes, int]]:
    """(kind, appended_ms, topic, key, value, end offset) of each whole entry from ``offset`` on."""
    handle.seek(offset)
    while True:
        header = handle.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        crc, kind, appended_ms, topic_len, key_len, value_len = _HEADER.unpack(header)
        payload = handle.read(topic_len + key_len + value_len)
        if len(payload) < topic_len + key_len + value_len or zlib.crc32(header[4:] + payload) != crc:
            return  # torn or damaged: nothing after it is trusted
        offset += _HEADER.size + len(payload)
        topic = payload[:topic_len].decode()
        key = payload[topic_len : topic_len + key_len]
        yield kind, appended_ms, topic, key, payload[topic_len + key_len :], offset


class Spool:
    """Segments of records on disk, appended at one end and acknowledged from the other."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        if max_bytes < 64 * 1024:
            raise ValueError(f"the spool needs at least 64 KiB, got {max_bytes} bytes")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.max_bytes = max_bytes
        #: A segment is closed and a new one begun past this size (so a drop loses an eighth at most).
        self.segment_bytes = max(32 * 1024, max_bytes // 8)
        self._state_path = folder / "delivered.json"
        state = read_state(self._state_path) or {}
        segments = self._segments()
        first = segments[0] if segments else 1
        self.delivered = SpoolPosition(*state.get("delivered", (first, 0)))
        sending = SpoolPosition(*state.get("sending", (0, 0)))
        if self.delivered.segment < first:  # its segment was deleted (all of it acknowledged)
            self.delivered = SpoolPosition(first, 0)
        self._active = segments[-1] if segments else max(first, self.delivered.segment)
        self._writer = self._open_active()
        self._sizes = {number: self._path(number).stat().st_size for number in self._segments()}
        self.undelivered = sum(1 for _ in self._records_from(self.delivered))
        self._in_doubt_end = sending if sending > self.delivered else None

    # --- files

    def _path(self, number: int) -> Path:
        return self.folder / f"{number:012d}.seg"

    def _segments(self) -> list[int]:
        return sorted(int(path.stem) for path in self.folder.glob("*.seg") if path.stem.isdigit())

    def _open_active(self) -> BinaryIO:
        path = self._path(self._active)
        if path.exists():
            with path.open("rb") as handle:  # cut a torn last entry off
                end = max((entry[-1] for entry in _entries(handle, 0)), default=0)
            if end < path.stat().st_size:
                _log.warning("spool %s: cutting a torn entry at byte %d (a crash mid-write)", path, end)
                os.truncate(path, end)
        return path.open("ab")

    @property
    def bytes(self) -> int:
        """Bytes the segments hold on disk."""
        return sum(self._sizes.values())

    # --- appending

    def append(self, records: list[tuple[str, bytes, bytes]], position: dict[str, Any] | None) -> Dropped:
        """Append ``(topic, key, value)`` records and the source ``position`` after them, and flush
        them to disk; returns what had to be dropped to stay under the bound."""
        now_ms = int(time.time() * 1000)
        chunks: list[tuple[int, bytes]] = []  # (records, bytes), each at most about a segment
        data, count = b"", 0
        for topic, key, value in records:
            data += _encode(_RECORD, topic, key, value, now_ms)
            count += 1
            if len(data) >= self.segment_bytes // 2:
                chunks.append((count, data))
                data, count = b"", 0
        if position is not None:
            data += _encode(_MARKER, "", b"", json.dumps(position, sort_keys=True).encode(), now_ms)
        if data:
            chunks.append((count, data))
        dropped = Dropped(0, 0)
        for count, data in chunks:
            if self._sizes.get(self._active, 0) >= self.segment_bytes:
                self._roll()
            more = self._make_room(len(data))
            dropped = Dropped(dropped.records + more.records, dropped.bytes + more.bytes)
            self._writer.write(data)
            self._sizes[self._active] = self._sizes.get(self._active, 0) + len(data)
            self.undelivered += count
        self._writer.flush()
        os.fdatasync(self._writer.fileno())
        return dropped

    def _roll(self) -> None:
        self._writer.close()
        self._active += 1
        self._writer = self._path(self._active).open("ab")
        self._sizes[self._active] = 0

    def _make_room(self, incoming: int) -> Dropped:
        """Delete the oldest segments until ``incoming`` more bytes fit under the bound."""
        records = size = 0
        while self.bytes + incoming > self.max_bytes and self.bytes > 0:
            oldest = min(self._sizes)
            if oldest == self._active:
                self._roll()  # the active segment alone is too big: start another, drop this one
            start = self.delivered.offset if self.delivered.segment == oldest else 0
            lost = sum(1 for _ in self._records_in(oldest, start)) if oldest >= self.delivered.segment else 0
            records += lost
            size += self._sizes.pop(oldest)
            self._path(oldest).unlink(missing_ok=True)
            if self.delivered.segment <= oldest:
                self.delivered = SpoolPosition(oldest + 1, 0)
                self._save_state()
        self.undelivered -= records
        return Dropped(records, size)

    # --- reading and acknowledging

    def _records_in(self, number: int, offset: int) -> Iterable[SpoolEntry]:
        if number == self._active:
            self._writer.flush()
        try:
            handle = self._path(number).open("rb")
        except FileNotFoundError:
            return
        with handle:
            for kind, appended_ms, topic, key, value, end in _entries(handle, offset):
                if kind == _RECORD:
                    yield SpoolEntry(topic, key, value, appended_ms, SpoolPosition(number, end))

    def _records_from(self, start: SpoolPosition) -> Iterable[SpoolEntry]:
        for number in sorted(self._sizes):
            if number >= start.segment:
                yield from self._records_in(number, start.offset if number == start.segment else 0)

    def pending(self, limit: int, max_bytes: int = 900 * 1024) -> list[SpoolEntry]:
        """Up to ``limit`` unacknowledged records (and about ``max_bytes``), oldest first."""
        out: list[SpoolEntry] = []
        size = 0
        for entry in self._records_from(self.delivered):
            out.append(entry)
            size += len(entry.value)
            if len(out) >= limit or size >= max_bytes:
                break
        return out

    def oldest_pending_ms(self) -> int | None:
        """When the oldest unacknowledged record was spooled (epoch ms), or None."""
        for entry in self._records_from(self.delivered):
            return entry.appended_ms
        return None

    def sending(self, end: SpoolPosition) -> None:
        """Note that records up to ``end`` are being sent (those are in doubt after a crash)."""
        self._save_state(sending=end)

    def take_in_doubt(self, batch: list[SpoolEntry]) -> int:
        """How many records of ``batch`` (about to be sent) a previous attempt may have delivered."""
        if self._in_doubt_end is None:
            return 0
        count = sum(1 for entry in batch if entry.end <= self._in_doubt_end)
        if batch and batch[-1].end >= self._in_doubt_end:
            self._in_doubt_end = None
        return count

    def doubt(self, end: SpoolPosition) -> None:
        """Records up to ``end`` were sent and some may be in Kafka: resending them repeats them."""
        if self._in_doubt_end is None or end > self._in_doubt_end:
            self._in_doubt_end = end

    def acknowledged(self, batch: list[SpoolEntry]) -> None:
        """Kafka has ``batch`` (the oldest pending records): move past it, delete spent segments."""
        if not batch:
            return
        self.delivered = batch[-1].end
        self.undelivered -= len(batch)
        self._save_state()
        for number in sorted(self._sizes):
            if number < self.delivered.segment and number != self._active:
                self._sizes.pop(number)
                self._path(number).unlink(missing_ok=True)
        if self.undelivered == 0 and self._sizes[self._active] >= self.segment_bytes:
            # Everything is sent: start a new segment (carrying the newest marker over) so that the
            # spent one can go.
            marker = self.last_position()
            self._roll()
            if marker is not None:
                self.append([], marker)
            self.delivered = SpoolPosition(self._active, 0)
            self._save_state()
            for number in [n for n in self._sizes if n < self._active]:
                self._sizes.pop(number)
                self._path(number).unlink(missing_ok=True)

    def _save_state(self, sending: SpoolPosition | None = None) -> None:
        state: dict[str, Any] = {"delivered": [self.delivered.segment, self.delivered.offset]}
        if sending is not None:
            state["sending"] = [sending.segment, sending.offset]
        write_state(self._state_path, state)

    # --- the source's position

    def last_position(self) -> dict[str, Any] | None:
        """The source position of the newest marker, or None when no segment holds one."""
        for number in sorted(self._sizes, reverse=True):
            if number == self._active:
                self._writer.flush()
            found = None
            with self._path(number).open("rb") as handle:
                for kind, _ms, _topic, _key, value, _end in _entries(handle, 0):
                    if kind == _MARKER:
                        found = value
            if found is not None:
                state = json.loads(found)
                return state if isinstance(state, dict) else None
        return None

    def close(self) -> None:
        self._writer.close()
