"""Kernel logs -> :class:`~schemas.records.XidEvent`: one event per ``NVRM: Xid`` line.

The line's shape is recognised per line, because one file can mix them (a syslog file with
a pasted ``dmesg``). The prefix before ``NVRM: Xid`` may be:

* plain ``dmesg``: ``[ 1234.567890]``, optionally after a ``<4>`` priority or followed by a host
  and tag (``journalctl -o short-monotonic``); seconds since boot, so ``boot_time_ms`` is needed;
* ``dmesg -T``: ``[Mon Jan 15 10:23:45 2024]``, read in ``options.timezone``;
* RFC 3164 / ``journalctl -k`` short: ``<4>Jan 15 10:23:45[.123456] node001 kernel: [12345.678901]``
  (priority, fraction and uptime optional); UTC, and ``year`` is needed;
* ISO 8601 (``journalctl -o short-iso``, rsyslog, ``dmesg --time-format iso``):
  ``2024-01-15T10:23:45.123456+00:00 node001 kernel:`` (``+0000``, ``Z``, a decimal comma; host
  and tag optional); the offset is honoured, none means UTC;
* RFC 5424: ``<4>1 2024-01-15T10:23:45.123Z node001 kernel - - [sd] `` (``-`` for NILVALUE
  fields; a ``-`` host falls back to the option or file name).

Year roll-over for RFC 3164: ``options.year`` is the year of the first such line; when the
month then goes back by more than six (December -> January), the year is incremented.

Lines without ``NVRM: Xid`` are skipped silently (a kernel log is mostly other lines); an
``NVRM: Xid`` line that cannot be parsed becomes an :class:`~schemas.records.InvalidRecord`.
Invalid UTF-8 is replaced (U+FFFD) in the message and process name; it dead-letters the line when
it falls in the time stamp, the host or the XID header.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Final

from schemas.records import InvalidRecord, XidEvent, normalize_pci_bus_id
from stream.inputs.parsers.options import ParseOptions, default_node, invalid, strip_eol

__all__ = ["parse_kernel_log"]

_MARKER: Final = b"NVRM: Xid"

_MONTHS: Final = {
    name: index
    for index, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}

# The XID header and the rest of the payload.
_PAYLOAD_RE: Final = re.compile(
    r"NVRM: Xid\s*\(\s*(?P<pci>(?:PCI:)?[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)"
    r"\s*\)\s*:\s*(?P<xid>\d+)\s*(?:,\s*(?P<rest>.*?))?\s*$"
)
# ``pid=1234, name=python, `` (each part optional, quotes and <unknown> tolerated).
_PID_RE: Final = re.compile(r"pid\s*=\s*'?(?P<pid><unknown>|\d+)'?\s*(?:,\s*|$)")
_NAME_RE: Final = re.compile(r"name\s*=\s*(?P<name>[^,]*?)\s*(?:,\s*|$)")

_PRI: Final = r"(?:<\d{1,3}>)?"
_UPTIME: Final = r"\[\s*(?P<up>\d+\.\d+)\s*\]"
_HOST_TAG: Final = r"(?P<host>\S+)\s+(?P<tag>[^\s:\[]+)(?:\[\d+\])?:"

# Each prefix regex is matched against the text before "NVRM: Xid".
_DMESG_RE: Final = re.compile(rf"^\s*{_PRI}{_UPTIME}\s*(?:{_HOST_TAG}\s*)?$")
_DMESG_T_RE: Final = re.compile(
    rf"^\s*{_PRI}\[\s*[A-Z][a-z]{{2}}\s+(?P<mon>[A-Z][a-z]{{2}})\s+(?P<day>\d{{1,2}})\s+"
    rf"(?P<hh>\d{{1,2}}):(?P<mm>\d{{2}}):(?P<ss>\d{{2}})\s+(?P<year>\d{{4}})\s*\]\s*$"
)
_RFC3164_RE: Final = re.compile(
    rf"^\s*{_PRI}(?P<mon>[A-Z][a-z]{{2}})\s+(?P<day>\d{{1,2}})\s+"
    rf"(?P<hh>\d{{1,2}}):(?P<mm>\d{{2}}):(?P<ss>\d{{2}})(?:\.(?P<frac>\d{{1,9}}))?\s+"
    rf"{_HOST_TAG}\s*(?:{_UPTIME}\s*)?$"
)
_ISO: Final = r"(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}(?::?\d{2})?)?)"
_ISO_RE: Final = re.compile(rf"^\s*{_PRI}{_ISO}\s+(?:{_HOST_TAG}\s*)?(?:{_UPTIME}\s*)?$")
_RFC5424_RE: Final = re.compile(
    r"^\s*<\d{1,3}>1\s+(?P<ts>\S+)\s+(?P<host>\S+)\s+(?P<app>\S+)\s+\S+\s+\S+\s+"
    r"(?P<sd>-|(?:\[(?:[^\]\"\\]|\\.|\"(?:[^\"\\]|\\.)*\")*\])+)\s*\ufeff?\s*"
    rf"(?:{_UPTIME}\s*)?$"
)


def _uptime_us(text: str) -> int:
    seconds, _, fraction = text.partition(".")
    return int(seconds) * 1_000_000 + int((fraction + "000000")[:6])


def _frac_ms(frac: str | None) -> int:
    if not frac:
        return 0
    return round(int((frac + "000000")[:6]) / 1000)


def _iso_ms(text: str) -> int:
    """Epoch ms of an ISO 8601 time; no offset means UTC. Raises ValueError."""
    parsed = datetime.fromisoformat(text.replace(",", ".", 1))
    if parsed.tzinfo is None:
        return round((parsed - _EPOCH_NAIVE) / _ONE_MS)
    return round(parsed.timestamp() * 1000)


_EPOCH_NAIVE: Final = datetime(1970, 1, 1)
_ONE_MS: Final = timedelta(milliseconds=1)


class _KernelTimes:
    """Per-file state of time stamp conversion (year roll-over of RFC 3164 lines)."""

    __slots__ = ("boot_time_ms", "last_month", "year", "zone")

    def __init__(self, options: ParseOptions) -> None:
        self.year = options.year
        self.boot_time_ms = options.boot_time_ms
        self.zone = options.zone()
        self.last_month = 0

    def prefix(self, prefix: str) -> tuple[int, str | None] | str:
        """Return ``(ts_ms, host or None)`` from the text before ``NVRM: Xid``, or a reason."""
        match = _DMESG_RE.match(prefix)
        if match is not None:
            if self.boot_time_ms is None:
                return (
                    "plain dmesg time stamp counts seconds since boot: pass --boot-time "
                    "(the node's boot time) to place it"
                )
            return self.boot_time_ms + (_uptime_us(match["up"]) + 500) // 1000, match["host"]
        match = _DMESG_T_RE.match(prefix)
        if match is not None:
            return self._dmesg_t(match)
        match = _RFC3164_RE.match(prefix)
        if match is not None:
            return self._rfc3164(match)
        match = _ISO_RE.match(prefix)
        if match is not None:
            try:
                return _iso_ms(match["iso"]), match["host"]
            except ValueError:
                return f"bad time stamp {match['iso']!r}"
        match = _RFC5424_RE.match(prefix)
        if match is not None:
            host = match["host"]
            if match["ts"] == "-":
                return "RFC 5424 record has no time stamp (NILVALUE '-')"
            try:
                return _iso_ms(match["ts"]), None if host == "-" else host
            except ValueError:
                return f"bad RFC 5424 time stamp {match['ts']!r}"
        if not prefix.strip():
            return "'NVRM: Xid' line has no time stamp"
        return "unrecognised time stamp or syslog header before 'NVRM: Xid'"

    def _dmesg_t(self, match: re.Match[str]) -> tuple[int, str | None] | str:
        month = _MONTHS.get(match["mon"])
        if month is None:
            return f"bad month {match['mon']!r} in dmesg -T time stamp"
        try:
            moment = datetime(
                int(match["year"]),
                month,
                int(match["day"]),
                int(match["hh"]),
                int(match["mm"]),
                int(match["ss"]),
                tzinfo=self.zone,
            )
        except ValueError as exc:
            return f"bad dmesg -T time stamp: {exc}"
        return round(moment.timestamp() * 1000), None

    def _rfc3164(self, match: re.Match[str]) -> tuple[int, str | None] | str:
        month = _MONTHS.get(match["mon"])
        if month is None:
            return f"bad month {match['mon']!r} in syslog time stamp"
        if self.year is None:
            return "syslog/journalctl time stamp has no year: pass --year"
        if self.last_month and month < self.last_month - 6:
            self.year += 1
        self.last_month = month
        try:
            moment = datetime(
                self.year, month, int(match["day"]), int(match["hh"]), int(match["mm"]), int(match["ss"])
            )
        except ValueError as exc:
            return f"bad syslog time stamp: {exc}"
        return round((moment - _EPOCH_NAIVE) / _ONE_MS) + _frac_ms(match["frac"]), match["host"]


def _payload(text: str) -> tuple[int, str, int | None, str, str] | str:
    """Return ``(xid, pci_bus_id, pid, process, message)`` of the ``NVRM: Xid ...`` text, or a reason."""
    match = _PAYLOAD_RE.match(text)
    if match is None:
        return "truncated or malformed 'NVRM: Xid' line (expected 'NVRM: Xid (PCI:dddd:bb:dd): CODE, ...')"
    xid = int(match["xid"])
    if xid < 1:
        return f"XID code must be >= 1, got {xid}"
    pci = normalize_pci_bus_id(match["pci"])
    rest = match["rest"] or ""
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
    return xid, pci, pid, process, rest.strip()


def parse_kernel_log(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[XidEvent | InvalidRecord]:
    """Parse kernel log lines into XID events and dead letters.

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
        One event per ``NVRM: Xid`` line, in file order, or its dead letter.

    Examples
    --------
    >>> line = b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, name=python, "
    >>> line += b"GPU has fallen off the bus."
    >>> event = next(parse_kernel_log([line], ParseOptions(year=2024), "syslog"))
    >>> event.node, event.xid, event.pci_bus_id, event.pid, event.process, event.message
    ('node001', 79, '0000:3b:00', 1101, 'python', 'GPU has fallen off the bus.')
    """
    times = _KernelTimes(options)
    fallback_node = default_node(options, source)
    cluster = options.cluster
    marker = _MARKER
    for line_no, line in enumerate(lines, 1):
        at = line.find(marker)
        if at < 0:
            continue
        raw = strip_eol(line)
        prefix_bytes = raw[:at]
        payload_bytes = raw[at:]
        try:
            payload = _payload(payload_bytes.decode("utf-8"))
        except UnicodeDecodeError:
            payload = _payload(payload_bytes.decode("utf-8", "replace"))
            if isinstance(payload, str):
                payload = f"invalid UTF-8 in an 'NVRM: Xid' line: {payload}"
        if isinstance(payload, str):
            yield invalid(payload, raw, source, line_no)
            continue
        try:
            prefix = prefix_bytes.decode("utf-8")
        except UnicodeDecodeError:
            yield invalid(
                "invalid UTF-8 in the time stamp or host of an 'NVRM: Xid' line", raw, source, line_no
            )
            continue
        stamp = times.prefix(prefix)
        if isinstance(stamp, str):
            yield invalid(stamp, raw, source, line_no)
            continue
        ts_ms, host = stamp
        node = host or fallback_node
        if not node:
            yield invalid("no node name in the line or the file name: pass --node", raw, source, line_no)
            continue
        xid, pci, pid, process, message = payload
        yield XidEvent(
            ts_ms=ts_ms,
            cluster=cluster,
            node=node,
            xid=xid,
            pci_bus_id=pci,
            pid=pid,
            process=process,
            message=message,
            source=f"{source}:{line_no}",
        )
