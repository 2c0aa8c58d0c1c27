"""DCGM exporter scrapes (Prometheus text format) -> ECC samples and XID events.

Read metrics (everything else, ``# HELP``/``# TYPE`` and comments are skipped silently):

=============================================  ===============================
metric                                         EccSample counter
=============================================  ===============================
``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``              ``sbe_volatile``
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``              ``dbe_volatile``
``DCGM_FI_DEV_ECC_SBE_AGG_TOTAL``              ``sbe_aggregate``
``DCGM_FI_DEV_ECC_DBE_AGG_TOTAL``              ``dbe_aggregate``
``DCGM_FI_DEV_RETIRED_SBE``                    ``retired_pages_sbe``
``DCGM_FI_DEV_RETIRED_DBE``                    ``retired_pages_dbe``
``DCGM_FI_DEV_RETIRED_PENDING``                ``retired_pages_pending``
``DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS``      ``remapped_rows_correctable``
``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``    ``remapped_rows_uncorrectable``
``DCGM_FI_DEV_ROW_REMAP_PENDING``              ``remap_pending``
``DCGM_FI_DEV_ROW_REMAP_FAILURE``              ``remap_failure``
``DCGM_FI_DEV_XID_ERRORS`` (field 230)         an :class:`XidEvent` (see below)
=============================================  ===============================

All counters of one ``(Hostname, gpu, ts)`` become ONE :class:`EccSample`. A scrape lists every
GPU for one metric, then the next metric, so samples are grouped over the whole scrape and
emitted (sorted by time, node, GPU) when a metric family comes back (a new scrape began) or at
the end of the input. A sample's ``source`` is the line of its first counter. Dead letters are
yielded as their line is read, so before the records of their scrape.

Field 230 holds the *last* XID code the GPU reported, and keeps it scrape after scrape. An
:class:`XidEvent` is therefore emitted when the value is > 0 and differs from the previous value
seen for that GPU in the same input (the first value > 0 counts as a change; a 0 resets it).
A repeat of the same code without a 0 in between is not seen: the kernel log is the complete
source of XIDs, DCGM the fallback. The event's ``since_ms`` is the time of the GPU's previous
sample of field 230 (0 for its first): the XID happened after it. The detection core takes the
kernel line and this change of one XID as one XID (:mod:`detectors.xid_reports`).

DCGM's "blank" values are not counts: a field the GPU does not support, that was not found or
that the exporter may not read holds a sentinel (``dcgm_structs.h``: ``DCGM_INT64_BLANK`` =
0x7ffffffffffffff0, then ``_NOT_FOUND``, ``_NOT_SUPPORTED``, ``_NOT_PERMISSIONED`` at +1, +2, +3;
the same for ``DCGM_INT32_BLANK`` = 0x7ffffff0 and ``DCGM_FP64_BLANK`` = 2**47 = 140737488355328.0;
DCGM's own ``DCGM_*_IS_BLANK`` test is ``value >= BLANK``). Such a value leaves its counter out of
the sample (as nvidia-smi's ``N/A`` does), and a blank field 230 is no XID; a sample left with no
counter is not emitted. Nothing is dead-lettered: the exporter did what it should.

The time stamp (ms) after the value is optional; without it ``options.scrape_time_ms`` is used (a
file falls back to its modification time: :func:`stream.inputs.parsers.scrape_time_fallback`);
else the samples are ONE dead letter for the file, at its end.
Values must be non-negative integers (``3``, ``3.0``, ``3e0``);
NaN, negative or garbage values, a missing or non-integer ``gpu`` label and a bad
``pci_bus_id`` are dead letters. The node is the ``Hostname`` label, else ``options.node``,
else the file name's stem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

from schemas.records import ECC_COUNTERS, EccSample, InvalidRecord, XidEvent, normalize_pci_bus_id
from stream.inputs.parsers.options import ParseOptions, default_node, invalid

__all__ = [
    "DCGM_BLANKS",
    "METRIC_COUNTERS",
    "XID_METRIC",
    "DcgmItem",
    "DcgmState",
    "PendingXid",
    "gpu_of_labels",
    "is_dcgm_blank",
    "parse_dcgm",
    "samples_lack_time_stamps",
    "untimed_dead_letter",
]

#: DCGM's blank sentinels (``dcgm_structs.h``), by name. Any value at or above a BLANK of its width
#: is blank (``DCGM_INT64_IS_BLANK(v)`` is ``v >= DCGM_INT64_BLANK``); these are the named ones.
DCGM_BLANKS: Final[dict[str, int | float]] = {
    "DCGM_INT32_BLANK": 0x7FFFFFF0,
    "DCGM_INT32_NOT_FOUND": 0x7FFFFFF0 + 1,
    "DCGM_INT32_NOT_SUPPORTED": 0x7FFFFFF0 + 2,
    "DCGM_INT32_NOT_PERMISSIONED": 0x7FFFFFF0 + 3,
    "DCGM_INT64_BLANK": 0x7FFFFFFFFFFFFFF0,
    "DCGM_INT64_NOT_FOUND": 0x7FFFFFFFFFFFFFF0 + 1,
    "DCGM_INT64_NOT_SUPPORTED": 0x7FFFFFFFFFFFFFF0 + 2,
    "DCGM_INT64_NOT_PERMISSIONED": 0x7FFFFFFFFFFFFFF0 + 3,
    "DCGM_FP64_BLANK": 140737488355328.0,
    "DCGM_FP64_NOT_FOUND": 140737488355328.0 + 1.0,
    "DCGM_FP64_NOT_SUPPORTED": 140737488355328.0 + 2.0,
    "DCGM_FP64_NOT_PERMISSIONED": 140737488355328.0 + 3.0,
}
_INT32_BLANK: Final = 0x7FFFFFF0
_INT32_MAX: Final = 0x7FFFFFFF
# 2**47: below the INT64 blanks too, so one test covers the FP64 and INT64 families. No real ECC
# counter comes near it (it would be 1.4e14 errors).
_FP64_BLANK: Final = 140737488355328


def is_dcgm_blank(value: int) -> bool:
    """Whether an integral exporter value is one of DCGM's blank sentinels, not a count.

    >>> is_dcgm_blank(9223372036854775794), is_dcgm_blank(2147483634), is_dcgm_blank(140737488355330)
    (True, True, True)
    >>> is_dcgm_blank(0), is_dcgm_blank(2147483631)
    (False, False)
    """
    return value >= _FP64_BLANK or _INT32_BLANK <= value <= _INT32_MAX


#: Metric name -> EccSample counter name.
METRIC_COUNTERS: Final[dict[str, str]] = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "sbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "sbe_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "dbe_aggregate",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remap_failure",
}
assert set(METRIC_COUNTERS.values()) == set(ECC_COUNTERS)
#: The metric of DCGM field 230, the last XID code.
XID_METRIC: Final = "DCGM_FI_DEV_XID_ERRORS"
XID_MESSAGE: Final = "reported by DCGM field 230"

# Metric name (bytes) -> counter name, or "" for the XID metric.
_WANTED: Final[dict[bytes, str]] = {name.encode(): counter for name, counter in METRIC_COUNTERS.items()}
_WANTED[XID_METRIC.encode()] = ""

_LABEL_RE: Final = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES: Final = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE: Final = re.compile(r"\\[\\\"n]")
_LABEL_CACHE_LIMIT: Final = 50_000

# (node, gpu, pci_bus_id) of a label set, or the reason it is unusable.
_Labels = tuple[str, int, str] | str


def gpu_of_labels(labels: dict[str, str]) -> tuple[int, str] | str:
    """(GPU index, PCI id) of dcgm-exporter's labels (``gpu``, ``pci_bus_id`` in any case and
    width: the kernel's form), or the reason they give none.

    >>> gpu_of_labels({"gpu": "3", "pci_bus_id": "00000000:3B:00.0"}), gpu_of_labels({"gpu": "x"})
    ((3, '0000:3b:00'), "'gpu' label must be an integer, got 'x'")
    """
    gpu_text = labels.get("gpu")
    if gpu_text is None:
        return "no 'gpu' label"
    if not gpu_text.isdigit():
        return f"'gpu' label must be an integer, got {gpu_text!r}"
    pci = labels.get("pci_bus_id", "")
    if pci:
        try:
            pci = normalize_pci_bus_id(pci)
        except ValueError as exc:
            return f"label 'pci_bus_id': {exc}"
    return int(gpu_text), pci


def _parse_labels(text: str, fallback_node: str) -> _Labels:
    labels: dict[str, str] = {}
    position = 0
    size = len(text)
    while position < size:
        match = _LABEL_RE.match(text, position)
        if match is None:
            if text[position:].strip():
                return f"malformed labels near {text[position : position + 30]!r}"
            break
        value = match.group(2)
        if "\\" in value:
            value = _ESCAPE_RE.sub(lambda found: _ESCAPES[found.group(0)], value)
        labels[match.group(1)] = value
        position = match.end()
    gpu = gpu_of_labels(labels)
    if isinstance(gpu, str):
        return gpu
    node = labels.get("Hostname") or labels.get("hostname") or fallback_node
    if not node:
        return "no 'Hostname' label and no node name from the file name: pass --node"
    return node, *gpu


def _value(text: bytes) -> int | str:
    """A non-negative integral value, or the reason it is not one."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return f"value {text.decode('utf-8', 'replace')!r} is not a number"
        if math.isfinite(number) and number >= _FP64_BLANK:
            return int(number)  # a blank printed as a float (9.223372036854776e+18): the caller skips it
        if not math.isfinite(number) or number != int(number):
            return f"value {text.decode('utf-8', 'replace')!r} is not a non-negative integer"
        value = int(number)
    if value < 0:
        return f"value {value} is negative"
    return value


class _Group:
    __slots__ = ("counters", "line_no", "pci", "xid")

    def __init__(self, pci: str) -> None:
        self.pci = pci
        self.line_no = 0  # line of the first ECC counter
        self.counters: dict[str, int] = {}
        self.xid: tuple[int, int] | None = None  # (value, line_no)


class PendingXid:
    """An XID observation whose GPU's previous value lies before this part of the input.

    Only a reader of one part of a file (:attr:`DcgmState.part`) makes these, for the first value
    > 0 of a GPU in its part: the reader of the whole file turns it into :attr:`event`, with
    ``since_ms`` the time of the GPU's last sample before the part, when the value differs from the
    GPU's last value there (``0`` when none), else drops it.
    """

    __slots__ = ("event",)

    def __init__(self, event: XidEvent) -> None:
        self.event = event


#: What the reader of one DCGM input gives: records, dead letters and (reading a part) pending XIDs.
DcgmItem = EccSample | XidEvent | InvalidRecord | PendingXid


class DcgmState:
    """The reading of one DCGM input, line by line: what :func:`parse_dcgm` does with each line.

    :meth:`line` reads one physical line and appends what it gives to ``out``; :meth:`finish`
    ends the input. :class:`stream.inputs.parsers.dcgm_blocks.DcgmBlockParser` extends it to read
    whole blocks of lines at a time, with this class as the reference for every line it cannot
    read in bulk.

    ``part`` reads a part of a file that begins with a scrape (see :class:`PendingXid`); then
    :attr:`first_name` is the metric of the part's first read line and :attr:`xid_seen` the GPUs
    whose XID value the part has read.
    """

    def __init__(self, options: ParseOptions, source: str, *, part: bool = False) -> None:
        self.source = source
        self.fallback_node = default_node(options, source)
        self.cluster = options.cluster
        self.scrape_time_ms = options.scrape_time_ms
        self.label_cache: dict[bytes, _Labels] = {}
        self.groups: dict[tuple[int, str, int], _Group] = {}
        self.seen_metrics: set[bytes] = set()
        self.current_metric = b""
        # (node, GPU) -> (value, time) of field 230
        self.last_xid: dict[tuple[str, int], tuple[int, int]] = {}
        # [first line, last line, count, first raw] of untimed samples
        self.untimed: list[Any] | None = None
        self.part = part
        self.first_name: bytes | None = None
        self.xid_seen: set[tuple[str, int]] = set()

    def begin(self, name: bytes, out: list[DcgmItem]) -> None:
        """A read line of metric ``name`` comes: a family met again starts a new scrape."""
        if name != self.current_metric:
            if name in self.seen_metrics:
                self.flush(out)
                self.seen_metrics.clear()
            elif self.first_name is None:
                self.first_name = name
            self.seen_metrics.add(name)
            self.current_metric = name

    def labels(self, label_bytes: bytes) -> _Labels:
        """(node, gpu, pci) of a label set, or why it has none (cached)."""
        labels = self.label_cache.get(label_bytes)
        if labels is None:
            try:
                label_text = label_bytes.decode("utf-8")
            except UnicodeDecodeError:
                labels = "invalid UTF-8 in the labels"
            else:
                labels = _parse_labels(label_text, self.fallback_node)
            if len(self.label_cache) >= _LABEL_CACHE_LIMIT:
                self.label_cache.clear()
            self.label_cache[label_bytes] = labels
        return labels

    def line(self, physical: bytes, line_no: int, out: list[DcgmItem]) -> None:
        """Read one physical line (with or without its terminator)."""
        if not physical.startswith(b"DCGM_"):
            return
        brace = physical.find(b"{")
        name = physical.split(None, 1)[0] if brace < 0 else physical[:brace]
        counter = _WANTED.get(name)
        if counter is None:
            return
        line = physical.rstrip(b"\r\n")
        self.begin(name, out)
        if brace < 0:
            out.append(invalid(f"{name.decode()} has no labels: no 'gpu' label", line, self.source, line_no))
            return
        close = line.rfind(b"}")
        if close < brace:
            out.append(invalid("unterminated label set", line, self.source, line_no))
            return
        labels = self.labels(line[brace + 1 : close])
        if isinstance(labels, str):
            out.append(invalid(f"{name.decode()}: {labels}", line, self.source, line_no))
            return
        parts = line[close + 1 :].split()
        if not parts or len(parts) > 2:
            out.append(
                invalid(
                    f"{name.decode()}: expected 'VALUE [TIMESTAMP_MS]' after the labels",
                    line,
                    self.source,
                    line_no,
                )
            )
            return
        value = int(parts[0]) if parts[0].isdigit() else _value(parts[0])
        if isinstance(value, str):
            out.append(invalid(f"{name.decode()}: {value}", line, self.source, line_no))
            return
        if value >= _INT32_BLANK and is_dcgm_blank(value):
            return  # "no value": never a count
        if len(parts) == 2:
            try:
                ts_ms = int(parts[1])
            except ValueError:
                out.append(
                    invalid(
                        f"{name.decode()}: time stamp {parts[1].decode('utf-8', 'replace')!r} "
                        "is not integer ms",
                        line,
                        self.source,
                        line_no,
                    )
                )
                return
        elif self.scrape_time_ms is not None:
            ts_ms = self.scrape_time_ms
        else:
            # The cause is the file (saved without time stamps), so it is said once, at the end.
            if self.untimed is None:
                self.untimed = [line_no, line_no, 0, line]
            self.untimed[1] = line_no
            self.untimed[2] += 1
            return
        self.apply(ts_ms, labels, counter, value, line_no)

    def apply(self, ts_ms: int, labels: tuple[str, int, str], counter: str, value: int, line_no: int) -> None:
        """Add one read value to its sample (``counter`` "" for the XID metric)."""
        node, gpu, pci = labels
        key = (ts_ms, node, gpu)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(pci)
        elif not group.pci:
            group.pci = pci
        if counter:
            if not group.counters:
                group.line_no = line_no
            group.counters[counter] = value
        else:
            group.xid = (value, line_no)

    def xid(
        self, ts_ms: int, node: str, gpu: int, pci: str, value: int, line_no: int, out: list[DcgmItem]
    ) -> None:
        """Field 230 of one GPU read at ``ts_ms``: an event when it changed to a code."""
        key = (node, gpu)
        previous, previous_ms = self.last_xid.get(key, (0, 0))
        self.last_xid[key] = (value, ts_ms)
        unknown = self.part and key not in self.xid_seen
        if unknown:
            self.xid_seen.add(key)
        if value > 0 and (unknown or value != previous):
            event = XidEvent(
                ts_ms=ts_ms,
                cluster=self.cluster,
                node=node,
                xid=value,
                pci_bus_id=pci,
                gpu=gpu,
                message=XID_MESSAGE,
                source=f"{self.source}:{line_no}",
                since_ms=previous_ms,
            )
            out.append(PendingXid(event) if unknown else event)

    def flush(self, out: list[DcgmItem]) -> None:
        """Emit the samples of the scrape read so far, sorted by time, node and GPU."""
        groups = self.groups
        for key in sorted(groups):
            ts_ms, node, gpu = key
            group = groups[key]
            if group.xid is not None:
                value, xid_line = group.xid
                self.xid(ts_ms, node, gpu, group.pci, value, xid_line, out)
            if group.counters:
                out.append(
                    EccSample(
                        ts_ms=ts_ms,
                        cluster=self.cluster,
                        node=node,
                        gpu=gpu,
                        pci_bus_id=group.pci,
                        counters=group.counters,
                        source=f"{self.source}:{group.line_no}",
                    )
                )
        groups.clear()

    def finish(self, out: list[DcgmItem]) -> None:
        """The input ended: its last scrape, and the dead letter of samples without a time stamp."""
        self.flush(out)
        if self.untimed is not None:
            out.append(untimed_dead_letter(self.untimed, self.source))


def untimed_dead_letter(untimed: list[Any], source: str) -> InvalidRecord:
    """The one dead letter of an input's samples without a time stamp: ``[first, last, count, raw]``."""
    first, last, count, raw = untimed
    return InvalidRecord(
        f"{count} samples have no time stamp (a scrape saved with curl?): pass --scrape-time with "
        "the time it was taken",
        raw=raw,
        source=source,
        location=f"line {first}" if count == 1 else f"lines {first}-{last} ({count} lines)",
    )


def parse_dcgm(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[EccSample | XidEvent | InvalidRecord]:
    """Parse DCGM exporter scrapes into ECC samples, XID events and dead letters.

    The reference reading, one line at a time; files are read in blocks by
    :func:`stream.inputs.parsers.dcgm_blocks.parse_dcgm_file`, with the same items.

    Parameters
    ----------
    lines
        Physical lines of Prometheus text format, with or without their line terminator.
    options
        ``scrape_time_ms``, ``node`` and ``cluster`` are used.
    source
        The file path, for the records' ``source`` and the dead letters.

    Yields
    ------
    EccSample | XidEvent | InvalidRecord
        Dead letters as they are met; records per scrape, ordered by time.

    Examples
    --------
    >>> labels = b'{gpu="0",pci_bus_id="00000000:3B:00.0",Hostname="n1"}'
    >>> scrape = [
    ...     b"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + labels + b" 3 1705312800000",
    ...     b"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + labels + b" 12 1705312800000",
    ... ]
    >>> sample = next(parse_dcgm(scrape, ParseOptions(), "dcgm.prom"))
    >>> sample.node, sample.gpu, sample.pci_bus_id, dict(sample.counters)
    ('n1', 0, '0000:3b:00', {'dbe_volatile': 3, 'sbe_volatile': 12})
    """
    state = DcgmState(options, source)
    out: list[DcgmItem] = []
    for line_no, physical in enumerate(lines, 1):
        if physical.startswith(b"DCGM_"):
            state.line(physical, line_no, out)
            if out:
                yield from out  # type: ignore[misc]  # no PendingXid: not reading a part
                out.clear()
    state.finish(out)
    yield from out  # type: ignore[misc]


def samples_lack_time_stamps(lines: Iterable[bytes], limit: int = 10_000) -> bool:
    """Whether the first metric sample of these lines has no time stamp (``curl .../metrics > f``).

    An exporter prints all samples of a scrape alike, so the first one tells. False when no
    sample is found within ``limit`` lines.
    """
    for count, physical in enumerate(lines):
        if count >= limit:
            break
        if not physical.startswith(b"DCGM_"):
            continue
        close = physical.rfind(b"}")
        fields = physical[close + 1 :].split() if close >= 0 else physical.split()[1:]
        return len(fields) < 2
    return False
