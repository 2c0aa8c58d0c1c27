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
    "gpu_of_labels",
    "is_dcgm_blank",
    "parse_dcgm",
    "samples_lack_time_stamps",
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


def parse_dcgm(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[EccSample | XidEvent | InvalidRecord]:
    """Parse DCGM exporter scrapes into ECC samples, XID events and dead letters.

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
    fallback_node = default_node(options, source)
    cluster = options.cluster
    scrape_time_ms = options.scrape_time_ms
    wanted = _WANTED
    label_cache: dict[bytes, _Labels] = {}
    groups: dict[tuple[int, str, int], _Group] = {}
    seen_metrics: set[bytes] = set()
    current_metric = b""
    last_xid: dict[tuple[str, int], tuple[int, int]] = {}  # (node, GPU) -> (value, time) of field 230
    untimed: list[Any] | None = None  # [first line, last line, count, first raw] of untimed samples

    def flush() -> Iterator[EccSample | XidEvent]:
        for key in sorted(groups):
            ts_ms, node, gpu = key
            group = groups[key]
            if group.xid is not None:
                value, xid_line = group.xid
                previous, previous_ms = last_xid.get((node, gpu), (0, 0))
                last_xid[(node, gpu)] = (value, ts_ms)
                if value > 0 and value != previous:
                    yield XidEvent(
                        ts_ms=ts_ms,
                        cluster=cluster,
                        node=node,
                        xid=value,
                        pci_bus_id=group.pci,
                        gpu=gpu,
                        message=XID_MESSAGE,
                        source=f"{source}:{xid_line}",
                        since_ms=previous_ms,
                    )
            if group.counters:
                yield EccSample(
                    ts_ms=ts_ms,
                    cluster=cluster,
                    node=node,
                    gpu=gpu,
                    pci_bus_id=group.pci,
                    counters=group.counters,
                    source=f"{source}:{group.line_no}",
                )
        groups.clear()

    for line_no, physical in enumerate(lines, 1):
        if not physical.startswith(b"DCGM_"):
            continue
        brace = physical.find(b"{")
        name = physical.split(None, 1)[0] if brace < 0 else physical[:brace]
        counter = wanted.get(name)
        if counter is None:
            continue
        line = physical.rstrip(b"\r\n")
        if name != current_metric:
            if name in seen_metrics:
                yield from flush()
                seen_metrics.clear()
            seen_metrics.add(name)
            current_metric = name
        if brace < 0:
            yield invalid(f"{name.decode()} has no labels: no 'gpu' label", line, source, line_no)
            continue
        close = line.rfind(b"}")
        if close < brace:
            yield invalid("unterminated label set", line, source, line_no)
            continue
        label_bytes = line[brace + 1 : close]
        labels = label_cache.get(label_bytes)
        if labels is None:
            try:
                label_text = label_bytes.decode("utf-8")
            except UnicodeDecodeError:
                labels = "invalid UTF-8 in the labels"
            else:
                labels = _parse_labels(label_text, fallback_node)
            if len(label_cache) >= _LABEL_CACHE_LIMIT:
                label_cache.clear()
            label_cache[label_bytes] = labels
        if isinstance(labels, str):
            yield invalid(f"{name.decode()}: {labels}", line, source, line_no)
            continue
        parts = line[close + 1 :].split()
        if not parts or len(parts) > 2:
            yield invalid(
                f"{name.decode()}: expected 'VALUE [TIMESTAMP_MS]' after the labels", line, source, line_no
            )
            continue
        value = int(parts[0]) if parts[0].isdigit() else _value(parts[0])
        if isinstance(value, str):
            yield invalid(f"{name.decode()}: {value}", line, source, line_no)
            continue
        if value >= _INT32_BLANK and is_dcgm_blank(value):
            continue  # "no value": never a count
        if len(parts) == 2:
            try:
                ts_ms = int(parts[1])
            except ValueError:
                yield invalid(
                    f"{name.decode()}: time stamp {parts[1].decode('utf-8', 'replace')!r} is not integer ms",
                    line,
                    source,
                    line_no,
                )
                continue
        elif scrape_time_ms is not None:
            ts_ms = scrape_time_ms
        else:
            # The cause is the file (saved without time stamps), so it is said once, at the end.
            if untimed is None:
                untimed = [line_no, line_no, 0, line]
            untimed[1] = line_no
            untimed[2] += 1
            continue
        node, gpu, pci = labels
        key = (ts_ms, node, gpu)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(pci)
        elif not group.pci:
            group.pci = pci
        if counter:
            if not group.counters:
                group.line_no = line_no
            group.counters[counter] = value
        else:
            group.xid = (value, line_no)
    yield from flush()
    if untimed is not None:
        first, last, count, raw = untimed
        yield InvalidRecord(
            f"{count} samples have no time stamp (a scrape saved with curl?): pass --scrape-time with "
            "the time it was taken",
            raw=raw,
            source=source,
            location=f"line {first}" if count == 1 else f"lines {first}-{last} ({count} lines)",
        )


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
