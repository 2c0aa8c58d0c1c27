"""Embedded replay: files -> parsers -> event-time merge -> detection core -> ClickHouse.

Input files are merged by event time. A file is read lazily through a small reorder buffer (as
long as the allowed lateness), except Slurm accounting, whose rows are in submit order and are
sorted whole (they are small). The merge is over the files sorted by path, and ties keep that
order, so the same set of files gives the same tables whatever order they are named in.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from clickhouse_connect.driver.client import Client

from detectors.core import DetectionCore, Emitted
from schemas.outputs import DeadLetter
from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from schemas.timeutil import format_ts
from stream.inputs.parsers import Format, detect_format, open_input, parse_file, parse_open_file
from stream.inputs.parsers.detect import InputFile
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError, flush_with_retry
from stream.sinks.dead_letters import DeadLetterFile, DeadLetterPolicy, to_dead_letter

__all__ = ["MergedInputs", "ReplaySummary", "late_dead_letter", "read_records", "replay"]

Record = XidEvent | EccSample | JobEvent

_log = logging.getLogger("faultstream.replay")

_KIND = {XidEvent: "xid", EccSample: "ecc", JobEvent: "job"}


@dataclass(slots=True)
class SourceStats:
    """Counts for one input file."""

    path: str
    fmt: str
    records: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    late: int = 0


@dataclass(slots=True)
class ReplaySummary:
    """What a replay read, rejected and decided."""

    sources: list[SourceStats]
    incidents: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (kind, severity)
    attributions: Counter[str] = field(default_factory=Counter)
    rows_written: int = 0
    seconds: float = 0.0

    @property
    def events(self) -> int:
        """Records used (not dead-lettered)."""
        return sum(sum(source.records.values()) for source in self.sources)

    @property
    def dead_letters(self) -> int:
        """Records dead-lettered, late ones included."""
        return sum(source.dead_letters + source.late for source in self.sources)

    def incidents_by_kind(self) -> Counter[tuple[str, str]]:
        """Distinct incidents per (kind, severity)."""
        return Counter(self.incidents.values())


class _Progress:
    """Bytes consumed of an open input (compressed bytes for gzip), for the progress bar."""

    def __init__(self, handle: InputFile) -> None:
        self._raw = getattr(handle, "fileobj", None) or handle

    def position(self) -> int:
        try:
            return int(self._raw.tell())
        except (ValueError, OSError):  # closed: the file was read to its end
            return -1


@dataclass(frozen=True, slots=True)
class _Late:
    """A record that arrived after its file had moved past ``watermark_ms``."""

    record: Record
    watermark_ms: int


Item = Record | InvalidRecord | _Late


def _ordered(
    items: Iterable[Record | InvalidRecord], lateness_ms: int, sort_all: bool, stats: SourceStats
) -> Iterator[tuple[int, int, Item, SourceStats]]:
    """Yield ``(ts, seq, item, stats)`` of one file for the event-time merge.

    Files of events (kernel logs, DCGM scrapes, JSON Lines) are in time order, or nearly: they
    pass straight through, and a record older than the file's newest event minus the allowed
    lateness comes out wrapped in :class:`_Late`. Slurm accounting lists jobs by submission, so
    its (few) records are sorted whole. Dead letters carry the time of the record before them,
    so they flow in place.
    """
    if sort_all:
        records: list[tuple[int, int, Item, SourceStats]] = []
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
            yield (newest, seq, _Late(item, newest - lateness_ms), stats)
            continue
        yield (ts, seq, item, stats)


def read_records(
    path: Path, options: ParseOptions, fmt: Format | None = None
) -> Iterator[Record | InvalidRecord]:
    """Parse one file into records and dead letters (no ordering, no detection): the decode baseline."""
    return parse_file(path, options, fmt)


def _expand(paths: Iterable[Path]) -> Iterator[Path]:
    """Files as given; a folder stands for the (non-hidden) files under it."""
    for path in map(Path, paths):
        if path.is_dir():
            yield from (p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        else:
            yield path


def _log_retry(attempt: int, error: SinkFlushError) -> None:
    _log.warning("ClickHouse write failed (attempt %d), retrying: %s", attempt, error)


def _merge_key(entry: tuple[int, int, Item, SourceStats]) -> tuple[int, int]:
    return entry[0], entry[1]


class MergedInputs:
    """Input files, each parsed lazily, merged into one stream in event-time order.

    Iterating yields ``(item, stats)``: a record, a parse failure (:class:`InvalidRecord`) or a
    late record (:class:`_Late`), with the counters of the file it came from. Files are taken in
    path order and ties keep that order, so the same set of files always gives the same stream.
    """

    def __init__(
        self, paths: Iterable[Path], options: ParseOptions, fmt: Format | None, lateness_ms: int
    ) -> None:
        files = sorted(set(_expand(paths)), key=str)
        self.sources: list[SourceStats] = []
        self._positions: list[tuple[_Progress, int]] = []
        self._streams: list[Iterator[tuple[int, int, Item, SourceStats]]] = []
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"input file not found: {path}")
            chosen = fmt or detect_format(path)
            handle = open_input(path)
            self._positions.append((_Progress(handle), path.stat().st_size))
            stats = SourceStats(str(path), chosen.value)
            self.sources.append(stats)
            parsed = parse_open_file(handle, chosen, options, str(path))
            self._streams.append(_ordered(parsed, lateness_ms, chosen is Format.SACCT, stats))
        self.total_bytes = sum(size for _, size in self._positions)

    def bytes_done(self) -> int:
        """Bytes read so far across the files (for progress)."""
        return sum(size if (at := reader.position()) < 0 else at for reader, size in self._positions)

    def entries(self) -> Iterator[tuple[int, int, Item, SourceStats]]:
        """``(ts, seq, item, stats)`` in merge order (the sort key is the first two)."""
        return heapq.merge(*self._streams, key=_merge_key)

    def __iter__(self) -> Iterator[tuple[Item, SourceStats]]:
        for _ts, _seq, item, stats in self.entries():
            yield item, stats


def late_dead_letter(record: Record, watermark_ms: int, source: str, lateness_s: int) -> DeadLetter:
    """The dead letter of a record that came later than the allowed lateness.

    Its raw form is the record's JSON line: fix the clock, then replay it as JSON Lines.
    """
    reason = (
        f"late event (event time {format_ts(record.ts_ms)} is older than the watermark "
        f"{format_ts(watermark_ms)}; allowed lateness {lateness_s}s)"
    )
    line = record.source.rpartition(":")[2]
    location = f"line {line}" if line.isdigit() else record.source
    return DeadLetter(
        source, location, reason, orjson.dumps(record.to_dict()), _KIND[type(record)], record.ts_ms
    )


def replay(
    paths: Iterable[Path],
    settings: Settings,
    client: Client,
    options: ParseOptions,
    fmt: Format | None = None,
    progress: Callable[[int, int], None] | None = None,
    dead_letter_file: Path | None = None,
) -> ReplaySummary:
    """Replay files through the detection core into ClickHouse and return a summary.

    Parameters
    ----------
    paths
        Input files, any formats; the set matters, not the order.
    settings
        Configuration (core tunables, database, batch size, dead-letter limits).
    client
        ClickHouse client (embedded chdb or server).
    options
        Parser options (cluster, node, year …).
    fmt
        Force one format for every file instead of sniffing each.
    progress
        Called as ``progress(bytes_done, bytes_total)`` now and then.
    dead_letter_file
        Also append dead letters to this JSON Lines file.

    Raises
    ------
    DeadLetterLimitExceeded
        When too many of a file's records are bad; what was good so far has been written.
    """
    started = time.perf_counter()
    inputs = MergedInputs(paths, options, fmt, settings.allowed_lateness_seconds * 1000)
    core = DetectionCore(settings.core_config())
    sink = ClickHouseSink(client, settings.database, settings.sink_batch_rows)
    policy = DeadLetterPolicy(settings.dead_letter_max_ratio, settings.dead_letter_min_records)
    letters = DeadLetterFile(dead_letter_file) if dead_letter_file is not None else None
    summary = ReplaySummary(sources=inputs.sources)

    def dead_letter(letter: DeadLetter, stats: SourceStats) -> None:
        sink.add(letter)
        if letters is not None:
            letters.write(letter)
        policy.bad(stats.path, letter.reason)

    def late(record: Record, watermark_ms: int, stats: SourceStats) -> None:
        stats.late += 1
        dead_letter(
            late_dead_letter(record, watermark_ms, stats.path, settings.allowed_lateness_seconds), stats
        )

    def deliver(emitted: Emitted) -> None:
        for incident in emitted.incidents:
            summary.incidents[incident.incident_id] = (incident.kind, incident.severity.value)
        for attribution in emitted.attributions:
            summary.attributions["hardware" if attribution.hardware else "not hardware"] += 1
        sink.add_emitted(emitted)

    try:
        count = 0
        for _ts, _seq, item, stats in inputs.entries():
            count += 1
            if isinstance(item, InvalidRecord):
                stats.dead_letters += 1
                dead_letter(to_dead_letter(item), stats)
                policy.check(stats.path)
                continue
            if isinstance(item, _Late):
                late(item.record, item.watermark_ms, stats)
                continue
            if not core.process(item):
                late(item, core.watermark_ms or 0, stats)
                continue
            kind = _KIND[type(item)]
            stats.records[kind] += 1
            policy.good(stats.path)
            if kind != "ecc":
                sink.add(item)  # ECC samples are stored downsampled, from the core's rows
            if count % 8192 == 0:
                deliver(core.drain())
                if sink.should_flush():
                    flush_with_retry(sink, on_retry=_log_retry)
                if progress is not None:
                    progress(inputs.bytes_done(), inputs.total_bytes)
        deliver(core.finish())
    finally:
        deliver(core.drain())
        flush_with_retry(sink, on_retry=_log_retry)
        if letters is not None:
            letters.close()
    if progress is not None:
        progress(inputs.total_bytes, inputs.total_bytes)
    summary.rows_written = sink.rows_written
    summary.seconds = time.perf_counter() - started
    return summary
