"""Kernel logs -> :class:`~schemas.records.XidEvent`: GPU ``NVRM: Xid`` and NVSwitch ``SXid`` lines.

Read, per line (one file can mix shapes: a syslog file with a pasted ``dmesg``):

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, name=python, GPU has fallen off the bus.`` -> a GPU
  XID. The id may also be ``0000:3b:00`` or ``00000000:3B:00.0``; the two-field id of old drivers,
  ``Xid (0000:05)``, is read as domain and bus with device ``00`` (a GPU is device 0 of its bus);
  a redacted id (``PCI:...``, ``PCI:xxxx:xx:xx``, ``<redacted>``) gives an event with no PCI id.
* ``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33 ...`` -> an NVSwitch
  event (``device="nvswitch"``, ``xid`` the SXid code, ``pci_bus_id`` the switch's, ``gpu``
  None). The ``Severity ...`` and ``Data {...}`` lines the driver prints after it for the same
  switch and code are folded into its message, not counted again.
* ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` (also ``NVRM: GPU at PCI:...`` and
  ``NVRM: The NVIDIA GPU ... has fallen off the bus``), which carries no Xid number -> XID 79,
  the code NVIDIA's XID catalog gives "GPU has fallen off the bus"; the driver usually prints
  it next to the ``Xid 79`` line of the same failure, so it is dropped when an XID 79 of the same
  node and GPU is within 30 s of it in the file (before it, or on the next event line).
* A message that continues on following lines (``dmesg`` and ``journalctl`` indent them under
  the message; the driver repeats ``NVRM:``) is joined into one message.

Pasted lines are unwrapped first: ``> `` quote markers, a markdown code fence glued to the line
(with or without a language tag), backticks and ``**`` bold markers.

The time stamp before the message is read by :class:`~stream.inputs.parsers.kernel_times.KernelTimes`
(every ``dmesg``, ``journalctl -o`` and syslog shape; see there). Lines without a driver marker
are skipped silently (a kernel log is mostly other lines). A driver line that cannot be used is
an :class:`~schemas.records.InvalidRecord` with the reason; when the cause is the file (no
``--year``, no ``--boot-time``, no time stamps at all, a month name of an unknown language) it
is reported ONCE per file and cause, naming how many lines it covers, after the file's records.
Invalid UTF-8 is replaced (U+FFFD) in the message and process name; it dead-letters the line when
it falls in the time stamp, the host or the XID header.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from schemas.records import InvalidRecord, XidEvent, normalize_pci_bus_id
from stream.inputs.parsers.kernel_times import FileCause, KernelTimes
from stream.inputs.parsers.options import ParseOptions, default_node, invalid, strip_eol

__all__ = ["GONE_XID", "parse_kernel_log"]

#: The XID a "GPU has fallen off the bus" message without a number is read as (NVIDIA's catalog).
GONE_XID: Final = 79
#: The largest XID or SXid code a record holds (the schemas' limit: NVIDIA's codes are far below).
_MAX_CODE: Final = 65535
#: An XID 79 and a fallen-off message of the same GPU this close (ms) are one failure.
_GONE_WINDOW_MS: Final = 30_000

_NVRM: Final = b"NVRM:"
_SXID: Final = b"SXid"

# The XID header and the rest of the payload. The id is read by _device_id.
_XID_RE: Final = re.compile(
    r"NVRM: Xid\s*\(\s*(?P<id>[^()]*?)\s*\)\s*:\s*(?P<xid>\d+)\s*(?:,\s*(?P<rest>.*?))?\s*$"
)
_SXID_RE: Final = re.compile(
    r"SXid\s*\(\s*(?P<id>[^()]*?)\s*\)\s*:\s*(?P<xid>\d+)\s*(?:,\s*(?P<rest>.*?))?\s*$"
)
_SWITCH_TAG_RE: Final = re.compile(r"nvidia-nvswitch\d*\s*:\s*$")
_SXID_DETAIL: Final = ("Severity ", "Data {", "Data{")
_GONE_RE: Final = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?"
    r"(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)"
)
_GONE_TEXT: Final = "fallen off the bus"
_TWO_FIELD_RE: Final = re.compile(r"(?:PCI:)?(?P<domain>[0-9A-Fa-f]{4}):(?P<bus>[0-9A-Fa-f]{2})")
# What people put in place of an id they hide: dots, x's, stars, a word in brackets.
_REDACTED_RE: Final = re.compile(
    r"(?:PCI:?)?[\s.xX*#?_:-]*(?:<?(?:redacted|hidden|removed|id)>?)?[\s.xX*#?_:-]*", re.IGNORECASE
)
# ``pid=1234, name=python, `` (each part optional, quotes and <unknown> tolerated).
_PID_RE: Final = re.compile(r"pid\s*=\s*'?(?P<pid><unknown>|\d+)'?\s*(?:,\s*|$)")
_NAME_RE: Final = re.compile(r"name\s*=\s*(?P<name>[^,]*?)\s*(?:,\s*|$)")

# Pasting wrappers.
_QUOTE_RE: Final = re.compile(rb"^[ \t]*(?:>[ \t]?)+")
_FENCE_RE: Final = re.compile(rb"^[ \t]*(?:```|~~~)(?P<tag>[A-Za-z0-9_+.-]*)[ \t]*")
_TRAILING_FENCE_RE: Final = re.compile(rb"[ \t]*(?:```|~~~)[ \t]*$")
# Language tags seen on fences; a glued word that is not one is kept (``\x60\x60\x60Jan 15 ...``).
_FENCE_TAGS: Final = frozenset(
    b"text txt log logs console shell sh bash zsh shell-session plaintext plain output none nohighlight "
    b"dmesg syslog journal journalctl kernel code ini c".split()
)
# A line that starts a new record, so cannot be the continuation of the previous one.
_RECORD_START_RE: Final = re.compile(rb"^(?:\[|<\d|\d{4}-\d\d-\d\d|\d{9,11}\.|[^\W\d_]{2,7}\.? +\d{1,2} +\d)")


_INDENTS: Final = (b" ", b"\t")
# The first byte of a line that may continue a message: indentation, or a paste's quote or backtick.
_CONTINUATION_STARTS: Final = (b" ", b"\t", b">", b"`")


def _unwrap(line: bytes) -> bytes:
    """The line without what pasting into markdown adds around it."""
    if b">" in line[:16]:
        line = _QUOTE_RE.sub(b"", line, count=1)
    if b"```" in line or b"~~~" in line:
        match = _FENCE_RE.match(line)
        if match is not None:
            tag = match["tag"]
            line = line[match.end() if tag.lower() in _FENCE_TAGS or not tag else match.start("tag") :]
        line = _TRAILING_FENCE_RE.sub(b"", line)
    if b"`" in line:
        line = line.replace(b"`", b"")
    if b"**" in line:
        line = line.replace(b"**", b"")
    return line


def _device_id(text: str) -> str | None:
    """The canonical PCI id, ``""`` for a redacted one, None for one that is malformed."""
    try:
        return normalize_pci_bus_id(text)
    except ValueError:
        pass
    match = _TWO_FIELD_RE.fullmatch(text)
    if match is not None:
        return f"{match['domain'].lower()}:{match['bus'].lower()}:00"
    if _REDACTED_RE.fullmatch(text) is not None:
        return ""
    return None


@dataclass(slots=True)
class _Payload:
    """What the driver's message says: the code, the device, and the blamed process."""

    xid: int
    pci: str
    device: str = "gpu"
    pid: int | None = None
    process: str = ""
    message: str = ""
    gone: bool = False  # a "fallen off the bus" message without a number (read as GONE_XID)


def _pid_name(rest: str) -> tuple[int | None, str, str]:
    pid: int | None = None
    process = ""
    if rest.startswith("pid"):
        pid_match = _PID_RE.match(rest)
        if pid_match is not None:
            if pid_match["pid"] != "<unknown>":
                pid = int(pid_match["pid"])
            rest = rest[pid_match.end() :]
    if rest.startswith("name"):
        name_match = _NAME_RE.match(rest)
        if name_match is not None:
            name = name_match["name"].strip("'\"")
            if name != "<unknown>":
                process = name
            rest = rest[name_match.end() :]
    return pid, process, rest.strip()


def _code(digits: str) -> int:
    """An XID or SXid code's digits as a number; more digits than any code has: past every code
    (``int`` of a million digits is refused, and slow well before that)."""
    return int(digits) if len(digits) <= 9 else _MAX_CODE + 1


def _shown(digits: str) -> str:
    return digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits)} digits)"


def _xid_payload(text: str) -> _Payload | str:
    """The ``NVRM: Xid ...`` text read, or a reason."""
    match = _XID_RE.match(text)
    if match is None:
        return "truncated or malformed 'NVRM: Xid' line (expected 'NVRM: Xid (PCI:dddd:bb:dd): CODE, ...')"
    pci = _device_id(match["id"])
    if pci is None:
        return f"truncated or malformed 'NVRM: Xid' line: {match['id']!r} is not a PCI id"
    xid = _code(match["xid"])
    if not 1 <= xid <= _MAX_CODE:
        return f"XID code must be 1 to {_MAX_CODE}, got {_shown(match['xid'])}"
    pid, process, message = _pid_name(match["rest"] or "")
    return _Payload(xid, pci, pid=pid, process=process, message=message)


def _sxid_payload(text: str) -> _Payload | str:
    """The ``SXid ...`` text read, or a reason."""
    match = _SXID_RE.match(text)
    if match is None:
        return "truncated or malformed 'SXid' line (expected 'SXid (PCI:dddd:bb:dd.f): CODE, ...')"
    pci = _device_id(match["id"])
    if pci is None:
        return f"truncated or malformed 'SXid' line: {match['id']!r} is not a PCI id"
    code = _code(match["xid"])
    if not 1 <= code <= _MAX_CODE:
        return f"SXid code must be 1 to {_MAX_CODE}, got {_shown(match['xid'])}"
    return _Payload(code, pci, device="nvswitch", message=(match["rest"] or "").strip())


def _gone_payload(text: str) -> _Payload | None:
    """A ``NVRM: GPU <id>`` message that may say the GPU fell off the bus (maybe on a later line)."""
    match = _GONE_RE.match(text)
    if match is None:
        return None
    try:
        pci = normalize_pci_bus_id(match["pci"])
    except ValueError:
        return None
    return _Payload(GONE_XID, pci, message=text.removeprefix("NVRM:").strip(), gone=True)


@dataclass(slots=True)
class _Pending:
    """An event read but not yet yielded: the next lines may continue its message."""

    payload: _Payload
    ts_ms: int
    node: str
    line_no: int
    indent: int
    more: list[str] = field(default_factory=list)

    def message(self) -> str:
        if not self.more:
            return self.payload.message
        return " ".join(part for part in (self.payload.message, *self.more) if part)


@dataclass(slots=True)
class _FileCauseCount:
    first_line: int
    raw: bytes
    last_line: int = 0
    lines: int = 0


def _decode(data: bytes) -> tuple[str, bool]:
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), False


class _KernelLogParser:
    """The state of one file's parse: pending event, XID 79s seen, causes that are the file's."""

    def __init__(self, options: ParseOptions, source: str) -> None:
        self.times = KernelTimes(options)
        self.fallback_node = default_node(options, source)
        self.cluster = options.cluster
        self.source = source
        self.pending: _Pending | None = None
        self.recent_gone: dict[tuple[str, str], int] = {}  # (node, pci) -> time of its last XID 79
        self.file_causes: dict[str, _FileCauseCount] = {}

    def feed(self, line_no: int, line: bytes) -> list[XidEvent | InvalidRecord]:
        """Read one line (after :meth:`KernelTimes.observe`); return what it completes.

        A list, not a generator: this runs for every driver line, and most return nothing.
        """
        pending = self.pending
        if pending is not None and self._continues(line, pending):
            return []
        has_nvrm = _NVRM in line
        if not has_nvrm and _SXID not in line:
            return self._flushed()
        raw = strip_eol(line)
        # Pasting wrappers are rare: a few scans in C decide whether to look for them at all.
        text = _unwrap(raw) if b"`" in raw or b"*" in raw or b">" in raw[:16] or b"~~~" in raw else raw
        marker = text.find(_NVRM) if has_nvrm else -1
        if marker < 0:
            marker = text.find(_SXID)
            if marker < 0:
                return self._flushed()
        payload_text, clean = _decode(text[marker:])
        payload: _Payload | str | None
        if text.startswith(b"NVRM: Xid", marker):
            payload = _xid_payload(payload_text)
        elif text.startswith(_SXID, marker):
            payload = _sxid_payload(payload_text)
        else:
            payload = _gone_payload(payload_text)
            if payload is None:  # another driver message: irrelevant
                return self._flushed()
        if isinstance(payload, str):
            if not clean:
                payload = f"invalid UTF-8 in a driver line: {payload}"
            return [*self._flushed(), invalid(payload, raw, self.source, line_no)]
        prefix_bytes = text[:marker]
        try:
            prefix = prefix_bytes.decode("utf-8")
        except UnicodeDecodeError:
            reason = "invalid UTF-8 in the time stamp or host of a driver line"
            return [*self._flushed(), invalid(reason, raw, self.source, line_no)]
        if payload.device == "nvswitch":
            prefix = _SWITCH_TAG_RE.sub("", prefix)
        stamp = self.times.prefix(prefix)
        if isinstance(stamp, str):
            out = self._flushed()
            if payload.gone and _GONE_TEXT not in payload.message:
                return out  # only a GPU's name: nothing to place
            if isinstance(stamp, FileCause):
                self._count_file_cause(stamp, line_no, raw)
            else:
                out.append(invalid(stamp, raw, self.source, line_no))
            return out
        ts_ms, host = stamp
        node = host or self.fallback_node
        if not node:
            reason = "no node name in the line or the file name: pass --node"
            return [*self._flushed(), invalid(reason, raw, self.source, line_no)]
        if pending is not None and self._folds_into(pending, payload, node):
            pending.more.append(payload.message)
            return []
        if pending is not None and pending.payload.gone and self._same_failure(pending, payload, node, ts_ms):
            self.pending = None  # the fallen-off message of this XID 79, printed just before it
        out = self._flushed()
        indent = len(text) - len(text.lstrip(b" \t")) if text[:1] in _INDENTS else 0
        self.pending = _Pending(payload, ts_ms, node, line_no, indent)
        return out

    def finish(self) -> Iterator[XidEvent | InvalidRecord]:
        """What the end of the file completes: the pending event, then the file's causes."""
        yield from self._flushed()
        for reason, count in self.file_causes.items():
            if count.lines == 1:
                yield invalid(reason, count.raw, self.source, count.first_line)
                continue
            yield InvalidRecord(
                f"{reason} ({count.lines} driver lines of this file, reported once; the first is kept)",
                raw=count.raw,
                source=self.source,
                location=f"lines {count.first_line}-{count.last_line} ({count.lines} lines)",
            )

    def _count_file_cause(self, reason: str, line_no: int, raw: bytes) -> None:
        count = self.file_causes.get(reason)
        if count is None:
            count = self.file_causes[reason] = _FileCauseCount(line_no, raw)
        count.lines += 1
        count.last_line = line_no

    @staticmethod
    def _continues(line: bytes, pending: _Pending) -> bool:
        """Whether ``line`` continues the pending message (indented under it), and if so take it."""
        if line[:1] not in _CONTINUATION_STARTS:  # most lines: a new record, at once
            return False
        text = strip_eol(line)
        if b">" in text[:16] or b"`" in text:
            text = _unwrap(text)
        body = text.lstrip(b" \t")
        if not body or len(text) - len(body) <= pending.indent or _RECORD_START_RE.match(body) is not None:
            return False
        if b"Xid" in body:  # a driver line of its own, only indented
            return False
        part = body.decode("utf-8", "replace").strip()
        pending.more.append(part.removeprefix("NVRM:").strip())
        return True

    @staticmethod
    def _folds_into(pending: _Pending, payload: _Payload, node: str) -> bool:
        """An SXid's ``Severity``/``Data`` line: details of the SXid before it, not a new one."""
        first = pending.payload
        return (
            payload.device == "nvswitch"
            and first.device == "nvswitch"
            and (first.xid, first.pci, pending.node) == (payload.xid, payload.pci, node)
            and payload.message.startswith(_SXID_DETAIL)
        )

    @staticmethod
    def _same_failure(pending: _Pending, payload: _Payload, node: str, ts_ms: int) -> bool:
        return (
            payload.xid == GONE_XID
            and payload.device == "gpu"
            and not payload.gone
            and (pending.node, pending.payload.pci) == (node, payload.pci)
            and abs(ts_ms - pending.ts_ms) <= _GONE_WINDOW_MS
        )

    def _flushed(self) -> list[XidEvent | InvalidRecord]:
        """The pending event as a new list (empty when there is none or it is dropped)."""
        pending = self.pending
        if pending is None:
            return []
        self.pending = None
        payload = pending.payload
        message = pending.message()
        key = (pending.node, payload.pci)
        if payload.gone:
            if _GONE_TEXT not in message:
                return []  # a GPU named for another reason (``NVRM: GPU at PCI:...: GPU-uuid``)
            last = self.recent_gone.get(key)
            if last is not None and abs(pending.ts_ms - last) <= _GONE_WINDOW_MS:
                return []  # the same failure as the XID 79 just before it
        if payload.xid == GONE_XID and payload.device == "gpu":
            self.recent_gone[key] = pending.ts_ms
        event = XidEvent(
            ts_ms=pending.ts_ms,
            cluster=self.cluster,
            node=pending.node,
            xid=payload.xid,
            pci_bus_id=payload.pci,
            pid=payload.pid,
            process=payload.process,
            message=message,
            source=f"{self.source}:{pending.line_no}",
            device=payload.device,
        )
        return [event]


def parse_kernel_log(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[XidEvent | InvalidRecord]:
    """Parse kernel log lines into XID / SXid events and dead letters.

    Parameters
    ----------
    lines
        Physical lines, with or without their line terminator.
    options
        ``year``, ``boot_time_ms``, ``timezone``, ``node`` and ``cluster`` are used.
    source
        The file path, for the records' ``source`` (``path:line``) and the dead letters.

    Yields
    ------
    XidEvent | InvalidRecord
        One event per driver message, in file order, or its dead letter; then one dead letter
        per cause that is the file's.

    Examples
    --------
    >>> line = b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, name=python, "
    >>> line += b"GPU has fallen off the bus."
    >>> event = next(parse_kernel_log([line], ParseOptions(year=2024), "syslog"))
    >>> event.node, event.xid, event.pci_bus_id, event.pid, event.process, event.message
    ('node001', 79, '0000:3b:00', 1101, 'python', 'GPU has fallen off the bus.')
    >>> line = b"Jan 15 10:23:45 node001 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal"
    >>> event = next(parse_kernel_log([line], ParseOptions(year=2024), "syslog"))
    >>> event.device, event.xid, event.pci_bus_id, event.gpu, event.message
    ('nvswitch', 12028, '0000:05:00', None, 'Non-fatal')
    """
    parser = _KernelLogParser(options, source)
    observe = parser.times.observe
    for line_no, line in enumerate(lines, 1):
        if b"[" in line[:24]:  # dmesg --reltime stamps count on every line (cheap test first)
            observe(line)
        # Most kernel lines are someone else's: skip them here, without a call, unless they may
        # continue a pending message.
        if parser.pending is None and _NVRM not in line and _SXID not in line:
            continue
        out = parser.feed(line_no, line)
        if out:
            yield from out
    yield from parser.finish()
