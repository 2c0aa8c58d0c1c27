"""``nvidia-smi -q`` dumps -> :class:`~schemas.records.EccSample`, one per GPU section.

Read from each ``GPU 00000000:07:00.0`` section (the bus id names the GPU):

* ``Minor Number`` -> ``gpu``;
* ``ECC Errors`` / ``Volatile`` and ``Aggregate``: the newer ``SRAM Correctable``,
  ``SRAM Uncorrectable`` (also ``... Parity`` and ``... SEC-DED``), ``DRAM Correctable``,
  ``DRAM Uncorrectable`` lines are summed per kind (correctable -> ``sbe_*``, uncorrectable ->
  ``dbe_*``); the older ``Single Bit`` / ``Double Bit`` blocks give their ``Total``;
* ``Retired Pages``: ``Single Bit ECC``, ``Double Bit ECC``, ``Pending Page Blacklist`` (or
  ``Pending Page Retirement``, or the older ``Pending``; Yes/No -> 1/0);
* ``Remapped Rows``: ``Correctable Error``, ``Uncorrectable Error``, ``Pending``,
  ``Remapping Failure Occurred`` (Yes/No -> 1/0).

``N/A``, ``Not Supported``, ``Unknown`` and any bracketed value (``[N/A]``, ``[Not Supported]``,
``[Insufficient Permissions]``, ``[GPU requires reset]``: nvidia-smi's way of saying it has no
value) leave a counter out: "no value" never becomes a count. A GPU section without any
counter (ECC not supported) yields nothing. The time is the ``Timestamp`` line of the dump,
read in ``options.timezone``; several dumps may be concatenated, each starting with the
``==============NVSMI LOG==============`` banner. The node is ``options.node``, else the file
name's stem. A counter line with a value that is not a number is a dead letter, and that
counter is left out of its GPU's sample (the rest of the sample is kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Final

from schemas.records import EccSample, InvalidRecord, normalize_pci_bus_id
from stream.inputs.parsers.kernel_times import month_number
from stream.inputs.parsers.options import ParseOptions, default_node, invalid, strip_eol

__all__ = ["parse_nvidia_smi"]

_GPU_RE: Final = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)\s*$")
_KEY_VALUE_RE: Final = re.compile(r"^(.*?)\s+:(?:\s+(.*))?$")
# ctime-like, weekday and month in the machine's LC_TIME language (as in ``dmesg -T``).
_TIMESTAMP_RE: Final = re.compile(
    r"^\S+\s+(?P<mon>[^\W\d_]{2,7}\.?|\d{1,2}[月월])\s+(?P<day>\d{1,2})\s+"
    r"(?P<hh>\d{1,2}):(?P<mm>\d{2}):(?P<ss>\d{2})\s+(?P<year>\d{4})$"
)
_ABSENT: Final = frozenset(
    {"n/a", "[n/a]", "not supported", "[not supported]", "unknown", "unknown error", "[unknown error]"}
)
_FLAGS: Final = {"yes": 1, "no": 0}

# (section path, key) -> counter; the SRAM/DRAM lines are matched in _counter_of.
_DIRECT: Final[dict[tuple[str, ...], str]] = {
    ("ECC Errors", "Volatile", "Single Bit", "Total"): "sbe_volatile",
    ("ECC Errors", "Volatile", "Double Bit", "Total"): "dbe_volatile",
    ("ECC Errors", "Aggregate", "Single Bit", "Total"): "sbe_aggregate",
    ("ECC Errors", "Aggregate", "Double Bit", "Total"): "dbe_aggregate",
    ("Retired Pages", "Single Bit ECC"): "retired_pages_sbe",
    ("Retired Pages", "Double Bit ECC"): "retired_pages_dbe",
    ("Retired Pages", "Pending Page Blacklist"): "retired_pages_pending",
    ("Retired Pages", "Pending Page Retirement"): "retired_pages_pending",
    ("Retired Pages", "Pending"): "retired_pages_pending",
    ("Remapped Rows", "Correctable Error"): "remapped_rows_correctable",
    ("Remapped Rows", "Uncorrectable Error"): "remapped_rows_uncorrectable",
    ("Remapped Rows", "Pending"): "remap_pending",
    ("Remapped Rows", "Remapping Failure Occurred"): "remap_failure",
}
_FLAG_COUNTERS: Final = frozenset({"retired_pages_pending", "remap_pending", "remap_failure"})
_KIND: Final = {"Volatile": "volatile", "Aggregate": "aggregate"}


def _counter_of(path: tuple[str, ...]) -> str | None:
    """Return the counter a ``(sections..., key)`` path feeds, or None."""
    counter = _DIRECT.get(path)
    if counter is not None:
        return counter
    if len(path) == 3 and path[0] == "ECC Errors" and path[1] in _KIND:
        key = path[2]
        if key.startswith(("SRAM ", "DRAM ")):
            if "Uncorrectable" in key:
                return "dbe_" + _KIND[path[1]]
            if "Correctable" in key:
                return "sbe_" + _KIND[path[1]]
    return None


class _Gpu:
    __slots__ = ("bad", "counters", "gpu", "line", "line_no", "pci", "summed")

    def __init__(self, pci: str, line: bytes, line_no: int) -> None:
        self.pci = pci
        self.line = line
        self.line_no = line_no
        self.gpu: int | None = None
        self.counters: dict[str, int] = {}
        self.summed: set[str] = set()
        self.bad: set[str] = set()


def _timestamp(text: str, options: ParseOptions) -> int | None:
    match = _TIMESTAMP_RE.match(text)
    if match is None:
        return None
    month = month_number(match["mon"])
    if month is None:
        return None
    try:
        moment = datetime(
            int(match["year"]),
            month,
            int(match["day"]),
            int(match["hh"]),
            int(match["mm"]),
            int(match["ss"]),
            tzinfo=options.zone(),
        )
    except ValueError:
        return None
    return round(moment.timestamp() * 1000)


def parse_nvidia_smi(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[EccSample | InvalidRecord]:
    """Parse ``nvidia-smi -q`` output into one ECC sample per GPU section.

    Parameters
    ----------
    lines
        Physical lines, with or without their line terminator.
    options
        ``timezone``, ``node`` and ``cluster`` are used.
    source
        The file path, for the samples' ``source`` (the line of the ``GPU ...`` header).

    Yields
    ------
    EccSample | InvalidRecord
        One sample per GPU section with at least one counter, in file order, and dead letters.

    Examples
    --------
    >>> dump = '''Timestamp                                 : Mon Jan 15 10:23:45 2024
    ... GPU 00000000:07:00.0
    ...     Minor Number                          : 0
    ...     Remapped Rows
    ...         Correctable Error                 : 2
    ...         Pending                           : Yes
    ... '''.encode().splitlines()
    >>> sample = next(parse_nvidia_smi(dump, ParseOptions(node="n1"), "smi.txt"))
    >>> sample.ts_ms, sample.pci_bus_id, sample.gpu, dict(sample.counters)
    (1705314225000, '0000:07:00', 0, {'remapped_rows_correctable': 2, 'remap_pending': 1})
    """
    node = default_node(options, source)
    cluster = options.cluster
    ts_ms: int | None = None
    gpu: _Gpu | None = None
    stack: list[tuple[int, str]] = []

    def flush() -> Iterator[EccSample | InvalidRecord]:
        assert gpu is not None
        counters = {name: value for name, value in gpu.counters.items() if name not in gpu.bad}
        if not counters:
            return
        if ts_ms is None:
            reason = "GPU section without a valid 'Timestamp' line before it"
            yield invalid(reason, gpu.line, source, gpu.line_no)
            return
        if not node:
            yield invalid("no node name from the file name: pass --node", gpu.line, source, gpu.line_no)
            return
        yield EccSample(
            ts_ms=ts_ms,
            cluster=cluster,
            node=node,
            gpu=gpu.gpu,
            pci_bus_id=gpu.pci,
            counters=counters,
            source=f"{source}:{gpu.line_no}",
        )

    for line_no, physical in enumerate(lines, 1):
        raw = strip_eol(physical)
        text = raw.decode("utf-8", "replace")
        stripped = text.strip()
        if not stripped:
            continue
        indent = len(text) - len(text.lstrip())
        if indent == 0:
            stack.clear()
            if stripped.startswith("=") and "NVSMI LOG" in stripped:
                if gpu is not None:
                    yield from flush()
                    gpu = None
                ts_ms = None
                continue
            gpu_match = _GPU_RE.match(stripped)
            if gpu_match is not None:
                if gpu is not None:
                    yield from flush()
                gpu = _Gpu(normalize_pci_bus_id(gpu_match.group(1)), raw, line_no)
                continue
            key_value = _KEY_VALUE_RE.match(stripped)
            if key_value is not None and key_value.group(1) == "Timestamp":
                if gpu is not None:
                    yield from flush()
                    gpu = None
                ts_ms = _timestamp((key_value.group(2) or "").strip(), options)
                if ts_ms is None:
                    yield invalid(
                        "bad nvidia-smi Timestamp (expected like 'Mon Jan 15 10:23:45 2024')",
                        raw,
                        source,
                        line_no,
                    )
            continue
        if gpu is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key_value = _KEY_VALUE_RE.match(stripped)
        if key_value is None:
            if stripped.endswith(":"):
                key, value = stripped[:-1].strip(), ""
            else:
                stack.append((indent, stripped))
                continue
        else:
            key, value = key_value.group(1), (key_value.group(2) or "").strip()
        if not stack and key == "Minor Number":
            gpu.gpu = int(value) if value.isdigit() else None
            continue
        if not stack or stack[0][1] not in ("ECC Errors", "Retired Pages", "Remapped Rows"):
            continue
        counter = _counter_of((*(name for _, name in stack), key))
        if counter is None:
            continue
        lowered = value.lower()
        if lowered in _ABSENT or (value.startswith("[") and value.endswith("]")):
            continue
        if counter in _FLAG_COUNTERS and lowered in _FLAGS:
            number = _FLAGS[lowered]
        elif value.isdigit():
            number = int(value)
        else:
            gpu.bad.add(counter)
            yield invalid(f"{key}: value {value!r} is not a count", raw, source, line_no)
            continue
        if counter.startswith(("sbe_", "dbe_")) and len(stack) == 2:
            # SRAM + DRAM lines add up; a Total line (len(stack) == 3) is the sum already.
            if counter in gpu.summed:
                gpu.counters[counter] += number
            else:
                gpu.summed.add(counter)
                gpu.counters[counter] = number
        else:
            gpu.counters[counter] = number
    if gpu is not None:
        yield from flush()
