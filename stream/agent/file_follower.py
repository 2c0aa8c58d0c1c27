"""Following a kernel-log file (``/var/log/kern.log``) across rotations, from a cursor.

The follower is polled (:meth:`FileFollower.poll`): each call returns the complete lines written
since the last one and the position after them, ``{"kind": "file", "path", "inode", "offset"}``,
which the agent stores (in its spool, then its cursor file) once the lines are safely spooled. A
line is complete when its newline is written; an unfinished last line waits for the next poll.

Rotation, as logrotate does it:

- **rename and create** (the default): ``kern.log`` is renamed ``kern.log.1`` and a new
  ``kern.log`` created. The path then names another inode: the old file (still open here) is read
  to its end, its unfinished last line included, and the new one from its start.
- **copytruncate**: the file is copied and truncated in place. The inode is the same but the file
  is shorter than the offset: it is read again from its start. (Lines written between logrotate's
  copy and its truncation are in the copy only: copytruncate's own loss, which no reader avoids.)
- the path missing for a while (between rename and create): the open file is read on; the new one
  is picked up when it appears.

The follower looks every ``agent_poll_seconds``: a file that is created *and* rotated between two
looks (before the follower ever opened it) is not seen, as with ``tail -F``. Once it has opened
a file, no rotation loses its lines.

A restart resumes from the stored position: the same inode is read on from the offset; another
inode means the file rotated while the agent was away, so the rotated file is looked for beside it
(a name that starts with the log's, holding that inode: ``kern.log.1``) and its rest is read first.
With no position, an existing file is read from its end (or its start with ``from_start``), and a
file that appears later is read whole.

A line longer than ``max_line_bytes`` is cut to that length (the rest up to its newline is skipped
and :attr:`FileFollower.truncated` counted); bytes are passed on as they are (invalid UTF-8, NULs):
the worker decides what they are.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["FileFollower", "FilePosition", "Rotation"]

_log = logging.getLogger("faultstream.agent")

#: How much is read at once; a line longer than this (and than max_line_bytes) is cut.
_READ_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class FilePosition:
    """Where the next line starts: the file's inode and the byte offset in it."""

    inode: int
    offset: int

    def to_state(self, path: Path) -> dict[str, Any]:
        return {"kind": "file", "path": str(path), "inode": self.inode, "offset": self.offset}

    @staticmethod
    def from_state(state: dict[str, Any] | None) -> FilePosition | None:
        """The position in a stored cursor; None for no cursor or another source's cursor."""
        if not state or state.get("kind") != "file":
            return None
        inode, offset = state.get("inode"), state.get("offset")
        if not isinstance(inode, int) or not isinstance(offset, int) or offset < 0:
            return None
        return FilePosition(inode, offset)


@dataclass(slots=True)
class Rotation:
    """What a poll noticed, for the agent's metrics and log."""

    renamed: int = 0
    truncated: int = 0
    notes: list[str] = field(default_factory=list)


class FileFollower:
    """Reads the complete lines appended to ``path``, following renames and truncations."""

    def __init__(
        self,
        path: Path,
        position: FilePosition | None,
        *,
        from_start: bool = False,
        max_line_bytes: int = 65536,
    ) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        #: Lines cut to max_line_bytes so far.
        self.truncated = 0
        self._handle: BinaryIO | None = None
        self._inode = 0
        self._offset = 0
        self._skipping = False  # inside an over-long line: drop bytes up to its newline
        #: A rotated file still to read to its end before the current one (restart after a rotation).
        self._left_over: tuple[BinaryIO, int] | None = None
        self._open_at_start(position, from_start)

    # --- start

    def _open_at_start(self, position: FilePosition | None, from_start: bool) -> None:
        try:
            status = self.path.stat()
        except FileNotFoundError:
            status = None
        if position is None:
            if status is not None:
                self._open(0 if from_start else status.st_size)
            return  # a file that appears later is read whole
        if status is not None and status.st_ino == position.inode:
            # The same file: on from the offset, unless it was truncated meanwhile.
            self._open(position.offset if status.st_size >= position.offset else 0)
            return
        rotated = self._find_rotated(position.inode)
        if rotated is not None:
            handle = rotated.open("rb")
            handle.seek(position.offset)
            self._left_over = (handle, position.offset)
            _log.info("%s rotated while the agent was away: reading the rest of %s first", self.path, rotated)
        else:
            _log.warning(
                "%s is not the file of the cursor (inode %d) and no rotated file beside it holds that inode: "
                "reading the current file from its start",
                self.path,
                position.inode,
            )
        if status is not None:
            self._open(0)

    def _find_rotated(self, inode: int) -> Path | None:
        try:
            candidates = list(self.path.parent.iterdir())
        except OSError:
            return None
        for candidate in candidates:
            if candidate.name.startswith(self.path.name) and candidate != self.path:
                try:
                    if candidate.stat().st_ino == inode:
                        return candidate
                except OSError:
                    continue
        return None

    def _open(self, offset: int) -> None:
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return
        self._handle = handle
        self._inode = os.fstat(handle.fileno()).st_ino
        self._offset = offset
        self._skipping = False

    # --- polling

    @property
    def position(self) -> FilePosition | None:
        """Where the next line starts in the current file (None while there is no file)."""
        if self._handle is None:
            return None
        return FilePosition(self._inode, self._offset)

    def behind_bytes(self) -> int:
        """Bytes written to the current file that are not read yet."""
        if self._handle is None:
            return 0
        try:
            return max(0, os.fstat(self._handle.fileno()).st_size - self._offset)
        except OSError:
            return 0

    def poll(self, rotation: Rotation | None = None) -> list[bytes]:
        """The complete lines written since the last poll (without their newline), in order."""
        rotation = rotation or Rotation()
        lines: list[bytes] = []
        if self._left_over is not None:
            handle, offset = self._left_over
            lines += self._read_to_end(handle, offset, final=True)
            handle.close()
            self._left_over = None
        try:
            status = self.path.stat()
        except FileNotFoundError:
            status = None
        if self._handle is None:
            if status is not None:
                self._open(0)  # appeared (after a rename, or for the first time): read it whole
        elif status is not None and status.st_ino != self._inode:
            # Renamed away and a new file created: finish the old one, then start the new one.
            lines += self._read_to_end(self._handle, self._offset, final=True)
            self._handle.close()
            rotation.renamed += 1
            rotation.notes.append(f"{self.path} was renamed and created again: following the new file")
            self._open(0)
        elif status is not None and status.st_size < self._offset:
            rotation.truncated += 1
            rotation.notes.append(f"{self.path} was truncated (copytruncate): reading it from its start")
            self._offset = 0
            self._skipping = False
        if self._handle is not None:
            lines += self._read(self._handle)
        return lines

    def _read(self, handle: BinaryIO) -> list[bytes]:
        """Complete lines from the offset on; the offset moves past them."""
        lines: list[bytes] = []
        while True:
            handle.seek(self._offset)
            data = handle.read(_READ_BYTES)
            if not data:
                return lines
            end = data.rfind(b"\n")
            if end < 0:
                if len(data) < _READ_BYTES and len(data) <= self.max_line_bytes:
                    return lines  # an unfinished line: wait for its newline
                # A line longer than we keep: keep its start, skip the rest up to its newline.
                if not self._skipping:
                    lines.append(data[: self.max_line_bytes])
                    self.truncated += 1
                    self._skipping = True
                self._offset += len(data)
                continue
            lines += self._split(data[:end])
            self._offset += end + 1
            if len(data) < _READ_BYTES:
                return lines

    def _split(self, block: bytes) -> list[bytes]:
        lines = block.split(b"\n")
        if self._skipping:  # the first piece ends the over-long line being skipped
            lines = lines[1:]
            self._skipping = False
        out = []
        for line in lines:
            if len(line) > self.max_line_bytes:
                line = line[: self.max_line_bytes]
                self.truncated += 1
            out.append(line)
        return out

    def _read_to_end(self, handle: BinaryIO, offset: int, *, final: bool) -> list[bytes]:
        """Every line left in a file that will not grow any more, its unfinished last one included."""
        saved = self._offset
        self._offset = offset
        lines = self._read(handle)
        handle.seek(self._offset)
        rest = handle.read()
        if final and rest and not self._skipping:
            lines.append(rest[: self.max_line_bytes])
        self._skipping = False
        self._offset = saved
        return lines

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._left_over is not None:
            self._left_over[0].close()
            self._left_over = None
