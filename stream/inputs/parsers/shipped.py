"""Kernel-log values as log shippers put them into Kafka -> XID events, through the file parser.

A site's kernel logs reach Kafka through the shipper it already runs, one kernel message a
Kafka record, in the shipper's own shape (``docs/collecting.md`` has each one's configuration):

=======================================  =====================================================
value                                    read as
=======================================  =====================================================
rsyslog ``RSYSLOG_FileFormat`` (its      a kernel-log line: ``2025-03-04T17:22:31.512345+00:00
omkafka default),                        host kernel: [uptime] NVRM: Xid ...``; the syslog time
``RSYSLOG_SyslogProtocol23Format``       of the traditional format has no year: the Kafka
(RFC 5424), ``RSYSLOG_Traditional-       record's time gives it (a line of December shipped in
FileFormat`` (RFC 3164)                  January is the year before); a trailing newline is
                                         dropped
``journalctl -o json``                   ``MESSAGE`` (a byte array when it is not UTF-8),
                                         ``_HOSTNAME``, ``_SOURCE_REALTIME_TIMESTAMP`` or
                                         ``__REALTIME_TIMESTAMP`` (µs, a string)
Vector journald -> kafka (``codec:       ``message``, ``host``, ``timestamp`` (RFC 3339)
json``)
Fluent Bit systemd -> kafka              ``MESSAGE`` / ``_HOSTNAME`` (or their
                                         ``strip_underscores`` and ``lowercase`` forms),
                                         ``@timestamp`` (epoch seconds as a float, or ISO 8601)
rsyslog JSON template                    ``message``, ``host``, ``@timestamp``
=======================================  =====================================================

A JSON envelope becomes the line ``<time> <host> kernel: <message>`` (further lines of a
message indented under it, as ``journalctl`` prints them, so the parser joins them); every line
then goes through :func:`~stream.inputs.parsers.kernel_log.parse_kernel_log`, as a file's would.

Most of a kernel log is other drivers' messages: a value naming neither ``NVRM`` nor ``SXid`` is
skipped before anything is decoded (:func:`names_the_driver`), and a driver line the parser does
not use gives nothing. A value that names the driver but cannot be read (not JSON where JSON
starts, no message, host or time, an Xid line the parser rejects) is an
:class:`~schemas.records.InvalidRecord` with its reason.

Each record is read alone: a message the driver printed on several kernel lines that the shipper
sent as several records (an NVSwitch ``SXid``'s ``Severity`` and ``Data`` lines) is not folded
into one, and a ``GPU has fallen off the bus`` line without an Xid number is not matched with the
``Xid 79`` of the same failure.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Final

import orjson

from schemas.records import InvalidRecord, XidEvent
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.options import ParseOptions, strip_eol

__all__ = ["names_the_driver", "parse_shipped_kernel_line"]

_NVRM: Final = b"NVRM"
_SXID: Final = b"SXid"

#: The fields a JSON envelope's message, host and time may be in, most specific first.
_MESSAGE_FIELDS: Final = ("MESSAGE", "message", "msg", "log")
_HOST_FIELDS: Final = ("_HOSTNAME", "HOSTNAME", "hostname", "host", "_hostname")
#: journald's times: epoch microseconds, as a decimal string (or a number).
_MICROSECOND_FIELDS: Final = (
    "_SOURCE_REALTIME_TIMESTAMP",
    "__REALTIME_TIMESTAMP",
    "SOURCE_REALTIME_TIMESTAMP",
    "REALTIME_TIMESTAMP",
    "source_realtime_timestamp",
    "realtime_timestamp",
)
#: Shippers' own times: RFC 3339 / ISO 8601, or epoch seconds (Fluent Bit's ``double`` format).
_TIME_FIELDS: Final = ("@timestamp", "timestamp", "time", "date")

#: How far past its Kafka record a year-less syslog time may lie before it is read as last
#: year's (a line of 31 December shipped on 1 January; clocks of nodes a little ahead).
_YEAR_SLACK_MS: Final = 2 * 24 * 3600 * 1000

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def names_the_driver(value: bytes) -> bool:
    """Whether a value may hold a GPU or NVSwitch driver message (a few scans in C): the rest of
    a kernel log is skipped without being decoded. A JSON value with an array may be journald's
    message that is not UTF-8 (an array of its bytes): it is decoded to be sure.

    >>> names_the_driver(b"kernel: NVRM: Xid (PCI:0000:3b:00): 79, ..."), names_the_driver(b"eth0: up")
    (True, False)
    >>> names_the_driver(b'{"MESSAGE":[78,86,82,77,58,32,255],"_HOSTNAME":"n"}')
    True
    """
    return _NVRM in value or _SXID in value or (b'":[' in value and value.lstrip()[:1] == b"{")


def parse_shipped_kernel_line(
    value: bytes, record_ms: int | None, cluster: str, source: str, location: str
) -> list[XidEvent | InvalidRecord]:
    """The XID and SXid events of one shipped kernel-log value, or its dead letter.

    Parameters
    ----------
    value
        The Kafka record's value, as the shipper sent it.
    record_ms
        The Kafka record's timestamp (epoch ms; None when it has none): the year of a syslog time
        that prints none.
    cluster
        Stamped on the events.
    source, location
        Where the value was (``topic/partition``, ``offset O``), for the events and dead letters.

    Examples
    --------
    >>> line = (b"2025-03-04T17:22:31.512345+00:00 gpu-node-17 kernel: [1234567.890123] "
    ...         b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, name=python, GPU has fallen off the bus.\\n")
    >>> [event] = parse_shipped_kernel_line(line, None, "c", "k/0", "offset 1")
    >>> [(event.node, event.xid, event.pci_bus_id, event.ts_ms)]
    [('gpu-node-17', 79, '0000:3b:00', 1741108951512)]
    >>> journal = (b'{"__REALTIME_TIMESTAMP":"1741108951512345","_HOSTNAME":"gpu-node-17",'
    ...            b'"MESSAGE":"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable ECC error"}')
    >>> [(e.node, e.xid, e.ts_ms) for e in parse_shipped_kernel_line(journal, None, "c", "k/0", "offset 2")]
    [('gpu-node-17', 48, 1741108951512)]
    >>> parse_shipped_kernel_line(b'{"MESSAGE": "NVRM: Xid ..."}', None, "c", "k/0", "offset 3")[0].reason
    'no host: a JSON kernel-log record needs one of _HOSTNAME, HOSTNAME, hostname, host, _hostname'
    """
    if not names_the_driver(value):
        return []
    body = value.lstrip()
    if body[:1] == b"{":
        try:
            line = _envelope_line(body)
        except ValueError as exc:
            return [InvalidRecord(str(exc), raw=value, source=source, location=location)]
        if line is None:
            return []
        lines = line.split(b"\n")
    else:
        lines = [line for line in strip_eol(value).split(b"\n") if line.strip()]
    year = None if record_ms is None or record_ms < 0 else datetime.fromtimestamp(record_ms / 1000, UTC).year
    out = _parse(lines, cluster, year, source, location)
    if year is not None and any(
        isinstance(item, XidEvent) and item.ts_ms > record_ms + _YEAR_SLACK_MS  # type: ignore[operator]
        for item in out
    ):
        # Only a year-less time can lie that far ahead of its record: it is last year's.
        out = _parse(lines, cluster, year - 1, source, location)
    return out


def _parse(
    lines: list[bytes], cluster: str, year: int | None, source: str, location: str
) -> list[XidEvent | InvalidRecord]:
    """Run the file parser over one value's lines; locate what it gives at the value."""
    out: list[XidEvent | InvalidRecord] = []
    # No source for the parser: it would take a node name from the file name when a line has no
    # host, and a topic's name is none.
    for item in parse_kernel_log(lines, ParseOptions(cluster=cluster, year=year), ""):
        if isinstance(item, InvalidRecord):
            reason = item.reason
            if reason.startswith("no node name"):
                reason = "no host in the line"
            elif "--year" in reason:
                reason = "a syslog time without a year, and the Kafka record has no timestamp to take it from"
            out.append(InvalidRecord(reason, raw=item.raw, source=source, location=location))
        else:
            out.append(dataclasses.replace(item, source=f"{source}:{location}"))
    return out


def _envelope_line(body: bytes) -> bytes | None:
    """The kernel-log line of a JSON envelope: ``<ISO time> <host> kernel: <message>`` (None: its
    message is another driver's)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ValueError(f"a JSON kernel-log record must be an object, not {type(document).__name__}")
    message = _text(document, _MESSAGE_FIELDS, "message")
    if _NVRM not in message and _SXID not in message:
        return None
    host = _text(document, _HOST_FIELDS, "host").decode("utf-8", "replace").strip()
    if not host or any(char.isspace() for char in host):
        raise ValueError(f"host {host!r} is not a host name")
    stamp = datetime.fromtimestamp(_time_us(document) / 1_000_000, UTC).isoformat(timespec="microseconds")
    first, *more = strip_eol(message).split(b"\n")
    line = f"{stamp} {host} kernel: ".encode() + first
    for part in more:
        line += b"\n    " + part  # further lines of the message, indented: the parser joins them
    return line


def _text(document: dict[str, object], fields: tuple[str, ...], what: str) -> bytes:
    """A text field as bytes: a string, or journald's byte array (text that is not UTF-8); a
    field given several times (journald's list of values) gives its first."""
    for name in fields:
        if name not in document:
            continue
        value = document[name]
        if isinstance(value, list) and value and not all(isinstance(item, int) for item in value):
            value = value[0]
        if isinstance(value, str):
            return value.encode("utf-8", "surrogateescape")
        if isinstance(value, list) and all(isinstance(item, int) and 0 <= item < 256 for item in value):
            return bytes(value)  # type: ignore[arg-type]
        raise ValueError(f"{what} field {name!r} is {type(value).__name__}, not text")
    raise ValueError(f"no {what}: a JSON kernel-log record needs one of {', '.join(fields)}")


def _time_us(document: dict[str, object]) -> int:
    """The envelope's time in epoch microseconds."""
    for name in _MICROSECOND_FIELDS:
        value = document.get(name)
        if value is None:
            continue
        try:
            return int(value)  # type: ignore[call-overload, no-any-return]
        except (TypeError, ValueError):
            raise ValueError(f"time field {name!r} is {value!r}, not epoch microseconds") from None
    for name in _TIME_FIELDS:
        value = document.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            break
        if isinstance(value, int | float):
            return _epoch_us(float(value))
        if isinstance(value, str):
            try:
                return _epoch_us(float(value))
            except ValueError:
                pass
            try:
                return _iso_us(value)
            except ValueError:
                raise ValueError(f"time field {name!r} is {value!r}, not a time") from None
        raise ValueError(f"time field {name!r} is {type(value).__name__}, not a time")
    fields = ", ".join((*_MICROSECOND_FIELDS[:2], *_TIME_FIELDS))
    raise ValueError(f"no time: a JSON kernel-log record needs one of {fields}")


def _epoch_us(number: float) -> int:
    """Epoch seconds, milliseconds or microseconds (told apart by size) in microseconds."""
    if abs(number) < 1e11:
        return round(number * 1_000_000)
    if abs(number) < 1e14:
        return round(number * 1000)
    return round(number)


def _iso_us(text: str) -> int:
    """Epoch microseconds of an ISO 8601 time (digits past the microsecond dropped, a decimal
    comma allowed); no offset means UTC."""
    parsed = datetime.fromisoformat(text.replace(",", ".", 1))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // timedelta(microseconds=1)
