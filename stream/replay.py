"""Embedded replay: files -> the event-time merge -> the record pipeline -> ClickHouse.

Wiring only: :class:`stream.inputs.files.MergedInputs` yields the files' records in event-time
order, :class:`stream.pipeline.RecordPipeline` runs each through the detection core into the
ClickHouse sink's batch, and the batch is flushed every ``sink_batch_rows`` rows and at the end.
The same set of files gives the same tables whatever order they are named in.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from clickhouse_connect.driver.client import Client

from detectors.core import DetectionCore, Emitted
from schemas.records import RECORD_KIND, InvalidRecord
from stream.configuration import fingerprint
from stream.inputs.files import LateRecord, MergedInputs, SourceStats
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.pipeline import RecordPipeline, RecordSink
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError, flush_with_retry
from stream.sinks.dead_letters import (
    DeadLetterFile,
    DeadLetterPolicy,
    DeadLetterProducer,
    NoDeadLetters,
    to_dead_letter,
)

__all__ = ["ReplaySummary", "replay", "run_files"]

_log = logging.getLogger("faultstream.replay")

#: Records between two drains of the core (and progress reports).
_DRAIN_EVERY = 8192


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

    def record(self, emitted: Emitted) -> None:
        """Note what the core decided."""
        for incident in emitted.incidents:
            self.incidents[incident.incident_id] = (incident.kind, incident.severity.value)
        for attribution in emitted.attributions:
            self.attributions["hardware" if attribution.hardware else "not hardware"] += 1

    def incidents_by_kind(self) -> Counter[tuple[str, str]]:
        """Distinct incidents per (kind, severity)."""
        return Counter(self.incidents.values())


def _log_retry(attempt: int, error: SinkFlushError) -> None:
    _log.warning("ClickHouse write failed (attempt %d), retrying: %s", attempt, error)


def replay(
    paths: Iterable[Path],
    settings: Settings,
    client: Client,
    options: ParseOptions,
    fmt: Format | None = None,
    progress: Callable[[int, int], None] | None = None,
    dead_letter_file: Path | None = None,
    inventory: Iterable[str] = (),
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
    inventory
        The fleet's nodes (``replay --inventory``): the lemon statistics compare each node with
        all of them, not only with the nodes the inputs name.

    Raises
    ------
    DeadLetterLimitExceeded
        When too many of a file's records are bad; what was good so far has been written.
    """
    config = settings.core_config()
    overrides = settings.xid_overrides()
    sink = ClickHouseSink(
        client, settings.database, settings.sink_batch_rows, config=fingerprint(config, overrides)
    )

    def flush(final: bool) -> None:
        if final or sink.should_flush():
            flush_with_retry(sink, on_retry=_log_retry)

    letters = DeadLetterFile(dead_letter_file) if dead_letter_file is not None else NoDeadLetters()
    core = DetectionCore(config, xid_overrides=overrides)
    if core.fleet is not None:
        core.fleet.know_nodes(inventory, options.cluster)
    try:
        summary = run_files(
            paths,
            settings,
            core,
            sink,
            options,
            fmt=fmt,
            progress=progress,
            dead_letters=letters,
            flush=flush,
        )
    finally:
        if isinstance(letters, DeadLetterFile):
            letters.close()
    summary.rows_written = sink.rows_written
    return summary


def run_files(
    paths: Iterable[Path],
    settings: Settings,
    core: DetectionCore,
    sink: RecordSink,
    options: ParseOptions,
    *,
    fmt: Format | None = None,
    progress: Callable[[int, int], None] | None = None,
    dead_letters: DeadLetterProducer | None = None,
    flush: Callable[[bool], None] | None = None,
) -> ReplaySummary:
    """Run files through ``core`` into ``sink``: the loop of a replay, whatever the sink.

    :func:`replay` runs it into ClickHouse; ``faultstream diff`` into memory, twice.

    Parameters
    ----------
    paths, settings, options, fmt, progress
        As for :func:`replay`.
    core
        The detection core to run (its configuration is the replay's).
    sink
        Where records and what the core decided go.
    dead_letters
        Where dead letters go besides the sink (default: nowhere).
    flush
        Called as ``flush(final)`` after each drain of the core (``final`` False: flush if the
        batch is full) and once at the end, also after an error (``final`` True).

    Raises
    ------
    DeadLetterLimitExceeded
        When too many of a file's records are bad.
    """
    started = time.perf_counter()
    inputs = MergedInputs.for_settings(paths, options, fmt, settings)
    policy = DeadLetterPolicy.from_settings(settings)
    pipeline = RecordPipeline(core, sink, dead_letters or NoDeadLetters(), settings.allowed_lateness_seconds)
    summary = ReplaySummary(sources=inputs.sources)
    try:
        for count, (item, stats) in enumerate(inputs, 1):
            if isinstance(item, InvalidRecord):
                stats.dead_letters += 1
                stats.first_reason = stats.first_reason or item.reason
                pipeline.reject(to_dead_letter(item))
                policy.bad(stats.path, item.reason)
                policy.check(stats.path)
            elif isinstance(item, LateRecord):
                stats.late += 1
                letter = pipeline.reject_late(item.record, item.watermark_ms, stats.path)
                policy.bad(stats.path, letter.reason)
            elif (letter := pipeline.apply(item, stats.path)) is not None:
                stats.late += 1
                policy.bad(stats.path, letter.reason)
            else:
                stats.records[RECORD_KIND[type(item)]] += 1
                policy.good(stats.path)
            if count % _DRAIN_EVERY == 0:
                summary.record(pipeline.drain())
                if flush is not None:
                    flush(False)
                if progress is not None:
                    progress(inputs.bytes_done(), inputs.total_bytes)
        summary.record(pipeline.finish())
    finally:
        inputs.close()
        summary.record(pipeline.drain())
        if flush is not None:
            flush(True)
    if progress is not None:
        progress(inputs.total_bytes, inputs.total_bytes)
    summary.seconds = time.perf_counter() - started
    return summary
