"""Following the kernel's messages in the systemd journal, with ``journalctl -o json`` and a cursor.

The agent runs ``journalctl -k -f -o json`` (``--file``/``--directory`` for a journal read from
disk instead of the live one) and publishes each entry as the JSON object ``journalctl -o json``
prints, cut to the fields the worker reads (``MESSAGE``, ``_HOSTNAME``, the times, ``_BOOT_ID``,
``PRIORITY``, ``SYSLOG_IDENTIFIER``): ``docs/collecting.md`` lists that shape among those the
kernel-log topic takes. A ``MESSAGE`` that is not UTF-8 stays journald's array of bytes.

The position stored after each batch is ``{"kind": "journal", "cursor", "boot_id"}``: the
``__CURSOR`` and ``_BOOT_ID`` of the last entry. ``-k`` means *this boot's* kernel messages, so a
cursor of an earlier boot cannot simply be passed with ``--after-cursor``. On start:

- same boot as the cursor's: ``journalctl -k -f --after-cursor CURSOR``;
- another boot (the node rebooted, maybe because of the GPU failure whose Xid is the last thing it
  logged): first the rest of that boot, ``journalctl _BOOT_ID=OLD _TRANSPORT=kernel
  --after-cursor CURSOR`` (nothing if the journal did not keep it: a volatile journal), then the
  current boot from its start, ``journalctl -k -f``: the cursor is reset to the new boot;
- no cursor: the current boot from its start.

The current boot is ``/proc/sys/kernel/random/boot_id`` for the live journal, and the boot of the
newest entry for a journal read from disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

__all__ = ["JournalSource", "current_boot_id", "journal_entry_value"]

_log = logging.getLogger("faultstream.agent")

#: The fields kept of each entry: what the worker reads (stream.inputs.parsers.shipped) and what
#: tells entries apart.
_KEPT_FIELDS = (
    "MESSAGE",
    "_HOSTNAME",
    "__REALTIME_TIMESTAMP",
    "_SOURCE_REALTIME_TIMESTAMP",
    "_BOOT_ID",
    "PRIORITY",
    "SYSLOG_IDENTIFIER",
    "_TRANSPORT",
)
#: The largest line journalctl may print (a 1 MB message is about 4 MB as a JSON byte array).
_LINE_LIMIT = 8 * 1024 * 1024


def journal_entry_value(entry: dict[str, Any], max_bytes: int) -> bytes:
    """The value published for one journal entry: its kept fields as JSON, cut to ``max_bytes``
    of message if need be.

    >>> journal_entry_value({"MESSAGE": "NVRM: Xid 79", "_HOSTNAME": "n1", "__CURSOR": "s=1",
    ...                      "__REALTIME_TIMESTAMP": "1741108951512345"}, 1000)
    b'{"MESSAGE":"NVRM: Xid 79","_HOSTNAME":"n1","__REALTIME_TIMESTAMP":"1741108951512345"}'
    """
    kept = {name: entry[name] for name in _KEPT_FIELDS if name in entry}
    value = orjson.dumps(kept)
    if len(value) > max_bytes:
        message = kept.get("MESSAGE")
        if isinstance(message, str):
            kept["MESSAGE"] = message[: max(0, max_bytes // 2)]
        elif isinstance(message, list):
            kept["MESSAGE"] = message[: max(0, max_bytes // 5)]
        value = orjson.dumps(kept)
    return value


def _source_arguments(journal_path: Path | None) -> list[str]:
    if journal_path is None:
        return []
    if journal_path.is_dir():
        return ["--directory", str(journal_path)]
    return ["--file", str(journal_path)]


async def current_boot_id(journal_path: Path | None, journalctl: str = "journalctl") -> str:
    """This machine's boot id (live journal), or the newest entry's (a journal read from disk)."""
    if journal_path is None:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    process = await asyncio.create_subprocess_exec(
        journalctl, *_source_arguments(journal_path), "-n", "1", "-o", "json", "--no-pager",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await process.communicate()
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            boot = orjson.loads(line).get("_BOOT_ID")
            if isinstance(boot, str):
                return boot
    return ""


class JournalSource:
    """Batches of published values and the position after them, read from journalctl."""

    def __init__(
        self,
        journal_path: Path | None,
        position: dict[str, Any] | None,
        *,
        max_bytes: int = 65536,
        journalctl: str = "journalctl",
        follow: bool = True,
    ) -> None:
        self.journal_path = journal_path
        self.max_bytes = max_bytes
        self.journalctl = journalctl
        self.follow = follow
        self.truncated = 0
        self.unreadable = 0
        self._cursor = None
        self._boot_id = None
        if position and position.get("kind") == "journal":
            self._cursor = position.get("cursor") if isinstance(position.get("cursor"), str) else None
            self._boot_id = position.get("boot_id") if isinstance(position.get("boot_id"), str) else None
        self._process: asyncio.subprocess.Process | None = None

    async def batches(self) -> AsyncIterator[tuple[list[bytes], dict[str, Any]]]:
        """Yield ``(values, position)`` as entries come; runs until cancelled (or, without
        ``follow``, until the journal's end)."""
        source = _source_arguments(self.journal_path)
        boot = await current_boot_id(self.journal_path, self.journalctl)
        if self._cursor and self._boot_id and self._boot_id != boot:
            _log.info("new boot %s (the cursor is of boot %s): reading the rest of that boot first",
                      boot, self._boot_id)  # fmt: skip
            rest = [*source, f"_BOOT_ID={self._boot_id}", "_TRANSPORT=kernel", "--after-cursor", self._cursor]
            async for batch in self._run(rest, follow=False):
                yield batch
            self._cursor = None  # the cursor resets to the new boot
        arguments = [*source, "-k"]
        if self._cursor:
            arguments += ["--after-cursor", self._cursor]
        async for batch in self._run(arguments, follow=self.follow):
            yield batch

    async def _run(
        self, arguments: list[str], *, follow: bool
    ) -> AsyncIterator[tuple[list[bytes], dict[str, Any]]]:
        command = [self.journalctl, *arguments, "-o", "json", "--no-pager", *(["-f"] if follow else [])]
        process = self._process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=_LINE_LIMIT
        )
        assert process.stdout is not None
        try:
            while True:
                values, position = await self._read_batch(process.stdout)
                if position is not None:
                    yield values, position
                elif process.stdout.at_eof():
                    break
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
            errors = (await process.stderr.read()).decode(errors="replace").strip() if process.stderr else ""
            await process.wait()
            if process.returncode not in (0, -15, None) and errors:
                _log.warning("%s: %s", " ".join(command), errors[:500])

    async def _read_batch(self, stdout: asyncio.StreamReader) -> tuple[list[bytes], dict[str, Any] | None]:
        """The entries journalctl has printed (at least one, unless it ended) and the position."""
        values: list[bytes] = []
        position: dict[str, Any] | None = None
        while True:
            try:
                line = await stdout.readline() if not values else await _ready_line(stdout)
            except ValueError:  # a line past the limit: skip it
                self.unreadable += 1
                continue
            if not line:
                break
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.unreadable += 1
                continue
            if not isinstance(entry, dict):
                continue
            value = journal_entry_value(entry, self.max_bytes)
            if len(value) > self.max_bytes:
                self.truncated += 1
            values.append(value)
            cursor, boot = entry.get("__CURSOR"), entry.get("_BOOT_ID")
            if isinstance(cursor, str):
                self._cursor = cursor
                self._boot_id = boot if isinstance(boot, str) else self._boot_id
                position = {"kind": "journal", "cursor": cursor, "boot_id": self._boot_id}
            if len(values) >= 1000:
                break
        if values and position is None and self._cursor:
            position = {"kind": "journal", "cursor": self._cursor, "boot_id": self._boot_id}
        return values, position if values else None

    def close(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()


async def _ready_line(stdout: asyncio.StreamReader) -> bytes:
    """A line journalctl has already printed, or b"" when none is waiting (ends a batch)."""
    if b"\n" not in stdout._buffer:  # type: ignore[attr-defined]  # what is buffered, without waiting
        return b""
    return await stdout.readline()
