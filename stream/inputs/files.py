"""Input files as one event-time ordered stream: discovery, lazy parsing and the merge of files.

Input files are merged by event time. A file is read lazily through a small reorder buffer (as
long as the allowed lateness), except Slurm accounting, whose rows are in submit order and are
sorted whole (they are small). The merge is over the files sorted by path, and ties keep that
order, so the same set of files gives the same stream whatever order they are named in.

Both the embedded replay and ``replay --to`` (publishing to Kafka) read their inputs here.
"""

from __future__ import annotations

import gzip
import heapq
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from schemas.records import InvalidRecord, Record
from stream.inputs.dcgm_parts import ParsedInParts
from stream.inputs.parse_ahead import ParsedAhead, parse_ahead_wanted
from stream.inputs.parsers import (
    Format,
    detect_format,
    open_input,
    parse_file,
    parse_open_file,
    scrape_time_fallback,
)
from stream.inputs.parsers.detect import InputFile
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings

__all__ = [
    "InputItem",
    "LateRecord",
    "MergedInputs",
    "SourceStats",
    "expand_paths",
    "parse_helpers_wanted",
    "read_records",
]


@dataclass(slots=True)
class SourceStats:
    """Counts for one input file."""

    path: str
    fmt: str
    records: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    late: int = 0
    #: What was assumed to read the file (a DCGM scrape placed at its modification time), for the summary.
    notes: list[str] = field(default_factory=list)
    #: The reason of the file's first dead letter: the summary shows it when nothing was read.
    first_reason: str = ""


@dataclass(frozen=True, slots=True)
class LateRecord:
    """A record that arrived after its file had moved past ``watermark_ms`` (the allowed lateness)."""

    record: Record
    watermark_ms: int


class _Progress:
    """Bytes consumed of an open input (compressed bytes for gzip), for the progress bar."""

    def __init__(self, handle: InputFile) -> None:
        self._raw = getattr(handle, "fileobj", None) or handle

    def position(self) -> int:
        try:
            return int(self._raw.tell())
        except (ValueError, OSError):  # closed: the file was read to its end
            return -1


#: What the merge yields: a record, a parse failure, or a record too late to use.
InputItem = Record | InvalidRecord | LateRecord


def _ordered(
    items: Iterable[Record | InvalidRecord], lateness_ms: int, sort_all: bool, stats: SourceStats
) -> Iterator[tuple[int, int, InputItem, SourceStats]]:
    """Yield ``(ts, seq, item, stats)`` of one file for the event-time merge.

    Files of events (kernel logs, DCGM scrapes, JSON Lines) are in time order, or nearly: they
    pass straight through, and a record older than the file's newest event minus the allowed
    lateness comes out wrapped in :class:`LateRecord`. Slurm accounting lists jobs by submission, so
    its (few) records are sorted whole. Dead letters carry the time of the record before them,
    so they flow in place.
    """
    if sort_all:
        records: list[tuple[int, int, InputItem, SourceStats]] = []
        last = 0
        for seq, item in enumerate(items):
            if not isinstance(item, InvalidRecord):
                last = item.ts_ms
            records.append((last, seq, item, stats))
        records.sort(key=lambda entry: (entry[0], entry[1]))
        yield from records
        return
    newest = -(2**63)
    for seq, item in enumerate(items):
        if isinstance(item, InvalidRecord):
            yield (newest, seq, item, stats)
            continue
        ts = item.ts_ms
        if ts > newest:
            newest = ts
        elif ts < newest - lateness_ms:
            yield (newest, seq, LateRecord(item, newest - lateness_ms), stats)
            continue
        yield (ts, seq, item, stats)


def read_records(
    path: Path, options: ParseOptions, fmt: Format | None = None
) -> Iterator[Record | InvalidRecord]:
    """Parse one file into records and dead letters (no ordering, no detection): the decode baseline."""
    return parse_file(path, options, fmt)


def expand_paths(paths: Iterable[Path]) -> Iterator[Path]:
    """Files as given; a folder stands for the (non-hidden) files under it."""
    for path in map(Path, paths):
        if path.is_dir():
            yield from (p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        else:
            yield path


def parse_helpers_wanted(setting: int) -> int:
    """Helper processes for one large DCGM file: the setting, or (0) one per CPU but the replay's own.

    >>> parse_helpers_wanted(3), parse_helpers_wanted(0) == max(1, (os.cpu_count() or 1) - 1)
    (3, True)
    """
    return setting if setting > 0 else max(1, (os.cpu_count() or 1) - 1)


def _merge_key(entry: tuple[int, int, InputItem, SourceStats]) -> tuple[int, int]:
    return entry[0], entry[1]


class MergedInputs:
    """Input files, each parsed lazily, merged into one stream in event-time order.

    Iterating yields ``(item, stats)``: a record, a parse failure (:class:`InvalidRecord`) or a
    late record (:class:`LateRecord`), with the counters of the file it came from. Files are taken in
    path order and ties keep that order, so the same set of files always gives the same stream.
    Files of at least ``parse_ahead_min_bytes`` (0: none) are parsed in helper processes
    (:mod:`stream.inputs.parse_ahead`, the same items), an uncompressed DCGM file by
    ``parse_helpers`` of them in parts (:mod:`stream.inputs.dcgm_parts`; 0: one per CPU but ours);
    :meth:`close` stops those still running.
    """

    def __init__(
        self,
        paths: Iterable[Path],
        options: ParseOptions,
        fmt: Format | None,
        lateness_ms: int,
        parse_ahead_min_bytes: int = 0,
        parse_helpers: int = 1,
    ) -> None:
        files = sorted(set(expand_paths(paths)), key=str)
        self.sources: list[SourceStats] = []
        self._positions: list[tuple[_Progress | ParsedAhead | ParsedInParts, int]] = []
        self._streams: list[Iterator[tuple[int, int, InputItem, SourceStats]]] = []
        self._helpers: list[ParsedAhead | ParsedInParts] = []
        try:
            for path in files:
                if not path.is_file():
                    raise FileNotFoundError(f"input file not found: {path}")
                chosen = fmt or detect_format(path)
                file_options, note = scrape_time_fallback(path, chosen, options)
                size = path.stat().st_size
                parsed: Iterable[Record | InvalidRecord]
                if parse_ahead_wanted(size, parse_ahead_min_bytes):
                    with open_input(path) as probe:  # an unreadable file fails here, as in process
                        plain = not isinstance(probe, gzip.GzipFile)
                    helper: ParsedAhead | ParsedInParts
                    if chosen is Format.DCGM and plain and parse_helpers_wanted(parse_helpers) > 1:
                        helper = ParsedInParts(
                            path, file_options, str(path), parse_helpers_wanted(parse_helpers)
                        )
                    else:
                        helper = ParsedAhead(path, chosen, file_options, str(path))
                    self._helpers.append(helper)
                    self._positions.append((helper, size))
                    parsed = helper
                else:
                    handle = open_input(path)
                    self._positions.append((_Progress(handle), size))
                    parsed = parse_open_file(handle, chosen, file_options, str(path))
                stats = SourceStats(str(path), chosen.value, notes=[note] if note else [])
                self.sources.append(stats)
                self._streams.append(_ordered(parsed, lateness_ms, chosen is Format.SACCT, stats))
        except BaseException:
            self.close()
            raise
        self.total_bytes = sum(size for _, size in self._positions)

    @classmethod
    def for_settings(
        cls, paths: Iterable[Path], options: ParseOptions, fmt: Format | None, settings: Settings
    ) -> MergedInputs:
        """The inputs as ``replay`` and ``replay --to`` read them: the settings' lateness and helpers."""
        return cls(
            paths,
            options,
            fmt,
            settings.allowed_lateness_seconds * 1000,
            settings.parse_ahead_min_bytes,
            settings.parse_helpers,
        )

    def close(self) -> None:
        """Stop the helper processes still parsing (a replay that stopped early)."""
        for helper in self._helpers:
            helper.close()

    def bytes_done(self) -> int:
        """Bytes read so far across the files (for progress)."""
        return sum(size if (at := reader.position()) < 0 else at for reader, size in self._positions)

    def entries(self) -> Iterator[tuple[int, int, InputItem, SourceStats]]:
        """``(ts, seq, item, stats)`` in merge order (the sort key is the first two)."""
        return heapq.merge(*self._streams, key=_merge_key)

    def __iter__(self) -> Iterator[tuple[InputItem, SourceStats]]:
        for _ts, _seq, item, stats in self.entries():
            yield item, stats
