"""Input parsers: operator files -> typed records of :mod:`schemas.records`, plus dead letters.

Every parser reads physical lines as bytes, decodes UTF-8 per line and *yields* an
:class:`~schemas.records.InvalidRecord` for a record that claims to be ours and fails (with
``reason``, ``raw`` bytes, ``source`` path and ``location`` ``"line N"``), so that good records
around a bad one are kept. Irrelevant lines (other kernel messages, metrics we do not read,
comments) are skipped silently. A record's ``source`` is ``"path:line"``.

>>> from stream.inputs.parsers import Format, ParseOptions, parse_lines
>>> lines = [b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, ..."]
>>> event = next(parse_lines(lines, Format.KERNEL, ParseOptions(node="node001"), "dmesg.txt"))
>>> event.node, event.xid, event.ts_ms
('node001', 79, 1705314225000)
"""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from schemas.timeutil import format_ts
from stream.inputs.parsers.dcgm import parse_dcgm, samples_lack_time_stamps
from stream.inputs.parsers.dcgm_blocks import parse_dcgm_file
from stream.inputs.parsers.detect import InputFile, detect_format, open_input
from stream.inputs.parsers.hostlist import compress_hostlist, expand_hostlist
from stream.inputs.parsers.jsonl import parse_jsonl
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.nvidia_smi import parse_nvidia_smi
from stream.inputs.parsers.options import Format, ParseOptions
from stream.inputs.parsers.sacct import parse_sacct

__all__ = [
    "Format",
    "ParseOptions",
    "Record",
    "compress_hostlist",
    "detect_format",
    "expand_hostlist",
    "open_input",
    "parse_file",
    "parse_lines",
    "parse_open_file",
    "scrape_time_fallback",
]

Record = XidEvent | EccSample | JobEvent

_Parser = Callable[[Iterable[bytes], ParseOptions, str], Iterator[Record | InvalidRecord]]
_PARSERS: Final[dict[Format, _Parser]] = {
    Format.KERNEL: parse_kernel_log,
    Format.SACCT: parse_sacct,
    Format.DCGM: parse_dcgm,
    Format.NVIDIA_SMI: parse_nvidia_smi,
    Format.JSONL: parse_jsonl,
}


def parse_lines(
    lines: Iterable[bytes], fmt: Format, options: ParseOptions, source: str
) -> Iterator[Record | InvalidRecord]:
    """Parse physical lines of one input in a known format.

    Parameters
    ----------
    lines
        The input's physical lines as bytes, with or without ``\\n`` / ``\\r\\n``; line numbers
        count from 1 in this order.
    fmt
        The format (a :class:`Format` or its value, such as ``"kernel"``).
    options
        What the input does not say: cluster, node, year, boot time, scrape time, time zone.
    source
        The input's name (a file path as given), used in ``source`` and the dead letters; the
        node name falls back to its stem.

    Returns
    -------
    Iterator[Record | InvalidRecord]
        Records and dead letters, lazily.

    Raises
    ------
    ValueError
        For an unknown format.
    """
    return _PARSERS[Format(fmt)](lines, options, source)


class _Lines:
    """Iterate a file's lines; remember a truncated or corrupt gzip stream instead of raising."""

    __slots__ = ("count", "error", "handle")

    def __init__(self, handle: Iterable[bytes]) -> None:
        self.handle = handle
        self.count = 0
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[bytes]:
        count = 0
        try:
            for line in self.handle:
                count += 1
                yield line
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            self.error = exc
        finally:
            self.count = count


def scrape_time_fallback(path: Path, fmt: Format, options: ParseOptions) -> tuple[ParseOptions, str | None]:
    """The options to read ``path`` with, and a note to announce when they differ from ``options``.

    A DCGM scrape saved with ``curl .../metrics > node.prom`` has no sample time stamps. Unless
    ``--scrape-time`` says when it was taken, its samples are placed at the file's modification
    time (when curl wrote it, which is when the scrape was taken unless the file was copied without
    keeping times), and the note says so.

    Parameters
    ----------
    path
        The input file.
    fmt
        Its format; only :attr:`Format.DCGM` is concerned.
    options
        The options given.

    Returns
    -------
    tuple[ParseOptions, str | None]
        The options for this file, and the note (None when nothing was assumed).
    """
    if fmt is not Format.DCGM or options.scrape_time_ms is not None:
        return options, None
    with open_input(Path(path)) as handle:
        try:
            lacking = samples_lack_time_stamps(handle)
        except (EOFError, gzip.BadGzipFile, zlib.error):
            lacking = False  # parse_open_file reports the damage
    if not lacking:
        return options, None
    mtime_ms = Path(path).stat().st_mtime_ns // 1_000_000
    note = (
        f"samples have no time stamps: placed at the file's modification time {format_ts(mtime_ms)} "
        "(pass --scrape-time to set it)"
    )
    return dataclasses.replace(options, scrape_time_ms=mtime_ms), note


def parse_file(
    path: Path, options: ParseOptions, fmt: Format | None = None
) -> Iterator[Record | InvalidRecord]:
    """Parse one input file (plain or gzip) into records and dead letters.

    Parameters
    ----------
    path
        The file. Gzip content is decompressed transparently. ``source`` of every record and
        dead letter is this path as given.
    options
        See :class:`ParseOptions`. A DCGM scrape without sample time stamps, and without
        ``scrape_time_ms``, is placed at the file's modification time (:func:`scrape_time_fallback`).
    fmt
        The format; ``None`` sniffs it with :func:`detect_format`.

    Returns
    -------
    Iterator[Record | InvalidRecord]
        Records and dead letters, lazily. A gzip stream that ends early yields a last dead
        letter saying so, after the records read before the damage.

    Raises
    ------
    ValueError
        Raised at once (not on iteration) when ``fmt`` is None and the format cannot be detected.
    OSError
        Raised at once when the file cannot be opened.
    """
    source = str(path)
    chosen = Format(fmt) if fmt is not None else detect_format(Path(path))
    options, _note = scrape_time_fallback(Path(path), chosen, options)
    handle = open_input(Path(path))
    return parse_open_file(handle, chosen, options, source)


def parse_open_file(
    handle: InputFile, fmt: Format, options: ParseOptions, source: str
) -> Iterator[Record | InvalidRecord]:
    """Parse an input already opened with :func:`open_input` (the caller may watch its position).

    The handle is closed when the iterator is exhausted or closed.
    """
    with handle:
        if fmt is Format.DCGM:  # in blocks, the items of parse_dcgm over its lines (a damaged gzip too)
            yield from parse_dcgm_file(handle, options, source)  # type: ignore[misc]  # no PendingXid: a whole file
            return
        if not isinstance(handle, gzip.GzipFile):
            yield from _PARSERS[fmt](handle, options, source)
            return
        lines = _Lines(handle)  # only a gzip stream can fail half-way
        yield from _PARSERS[fmt](lines, options, source)
        if lines.error is not None:
            yield InvalidRecord(
                f"compressed input ends early or is corrupt ({lines.error}); the records after it are lost",
                raw=b"",
                source=source,
                location=f"line {lines.count + 1}",
            )
