"""The ClickHouse sink: ``add()`` per record into a per-partition batch, ``flush()`` at commit.

Shaped like quix-streams' batching sinks. Records are turned into rows when added and inserted
table by table, column-oriented, when flushed. A failed flush raises :class:`SinkFlushError` and
keeps the batch: the caller must not commit the offsets it covers and retries later (backpressure,
not loss). Every table is a ReplacingMergeTree keyed by a deterministic id, so a flush that is
retried after a partial success, or a replay of the same input, leaves each fact once.

Within a batch, only the newest version of an incident or of an MTTF partial row is kept: a
storm of updates to one incident becomes one row per flush.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from clickhouse_connect.driver import options as _clickhouse_options
from clickhouse_connect.driver.client import Client

from detectors.core import EccRow, Emitted
from detectors.ecc import corrected_errors
from detectors.sxid_catalog import classify_sxid
from detectors.xid_catalog import classify_xid
from schemas.ddl import INSERT_COLUMNS
from schemas.outputs import DeadLetter, Incident, JobAttribution, MttfPartial
from schemas.records import ECC_COUNTERS, JobEvent, XidEvent

__all__ = ["ClickHouseSink", "SinkFlushError", "flush_with_retry", "retry_delays"]

# clickhouse-connect imports pandas (installed beside chdb) on the first insert, only to ask
# whether the rows are a DataFrame: most of a second of a restarted worker's first commit point,
# which is its failover time. The sink hands it lists, never frames.
if "pd" not in vars(_clickhouse_options):
    _clickhouse_options.pd = None

#: The longest wait between two tries of a failed flush.
MAX_RETRY_DELAY_S = 30.0


class SinkFlushError(RuntimeError):
    """A flush failed; the batch is kept. ``retry_after`` suggests when to try again (seconds)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


#: Each row below is built in the column order of schemas.ddl (which declares the tables).
_COLUMNS = INSERT_COLUMNS


_ECC_NAMES = tuple(ECC_COUNTERS)


def _xid_row(event: XidEvent) -> list[Any]:
    # The line's own classification (its message read; the per-GPU context of 48/45 is the core's).
    if event.device == "nvswitch":
        switch = classify_sxid(event.xid, event.message)
        name, category, severity, hardware = switch.name, "nvswitch", switch.severity, switch.hardware
    else:
        info = classify_xid(event.xid, event.message)
        name, category, severity, hardware = info.name, info.category.value, info.severity, info.hardware
    return [
        event.event_id, event.ts_ms, event.cluster, event.node, event.pci_bus_id, event.gpu, event.xid,
        event.device, name, category, severity.value, hardware, event.pid, event.process, event.message,
        event.source,
    ]  # fmt: skip


def _job_row(event: JobEvent) -> list[Any]:
    return [
        event.ts_ms, event.cluster, event.job_id, event.state.value, event.start_ms, event.end_ms,
        list(event.nodes), len(event.nodes), event.gpus, event.exit_code, event.name, event.user,
        event.source, event.partition,
    ]  # fmt: skip


def _ecc_row(row: EccRow) -> list[Any]:
    sample, deltas = row.sample, row.deltas
    if deltas:
        sbe = corrected_errors(deltas)
        dbe = max(deltas.get("dbe_volatile", 0), deltas.get("dbe_aggregate", 0))
    else:
        sbe = dbe = 0
    return [
        sample.ts_ms, sample.cluster, sample.node, sample.gpu_key, sample.gpu, sample.pci_bus_id,
        *map(sample.counters.get, _ECC_NAMES), sbe, dbe, row.reset,
    ]  # fmt: skip


def _incident_row(incident: Incident, config: str) -> list[Any]:
    return [
        incident.incident_id, incident.version, incident.kind, incident.severity.value, incident.status.value,
        incident.cluster, incident.node, incident.gpu, incident.first_evidence_ms, incident.last_evidence_ms,
        incident.detected_ms, incident.detector, incident.score, incident.action, incident.summary,
        orjson.dumps(incident.evidence, option=orjson.OPT_SORT_KEYS).decode(), incident.evidence_count,
        config,
    ]  # fmt: skip


def _attribution_row(item: JobAttribution) -> list[Any]:
    return [
        item.cluster, item.job_id, item.state, item.start_ms, item.end_ms, item.num_nodes, item.gpus,
        item.size_bucket, item.hardware, list(item.evidence_nodes), list(item.evidence_xids),
        list(item.evidence_kinds), item.incident_id, item.gpu_hours,
    ]  # fmt: skip


def _mttf_row(item: MttfPartial) -> list[Any]:
    return [
        item.window_seconds, item.window_start_ms, item.cluster, item.size_bucket, item.size_bucket_min_gpus,
        item.job_id, item.run_start_ms, item.node_hours, item.gpu_hours, item.job_hours, item.jobs_ended,
        item.jobs_failed, item.failures, item.version,
    ]  # fmt: skip


def _dead_letter_row(item: DeadLetter) -> list[Any]:
    return [
        item.source, item.location, item.reason, item.record_kind, item.event_ms,
        item.raw.decode("utf-8", "replace"), int(time.time() * 1000),
    ]  # fmt: skip


def retry_delays(first: float = 0.5, cap: float = MAX_RETRY_DELAY_S) -> Iterator[float]:
    """Seconds to wait before each retry of a failed flush: doubling from ``first``, capped.

    The one backoff schedule of every writer (the replay's :func:`flush_with_retry` and the
    worker's commit point, which retries without end while it holds the agent).

    >>> delays = retry_delays()
    >>> [next(delays) for _ in range(8)]
    [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    """
    delay = first
    while True:
        yield min(delay, cap)
        delay *= 2


def flush_with_retry(
    sink: ClickHouseSink,
    partition: int | None = None,
    attempts: int = 8,
    first_delay: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, SinkFlushError], None] | None = None,
) -> int:
    """Flush, and when ClickHouse fails, wait and try again (backpressure, not loss).

    The delay doubles from ``first_delay`` (capped at 30 s) for ``attempts`` tries, about two
    minutes with the defaults; then the last :class:`SinkFlushError` propagates with the batch
    still held, so the caller stops without having claimed anything it did not write.

    >>> class Flaky:
    ...     calls = 0
    ...     def create_insert_context(self, *args, **kwargs):
    ...         return None
    ...     def insert(self, *args, **kwargs):
    ...         Flaky.calls += 1
    ...         if Flaky.calls < 3:
    ...             raise ConnectionError("down")
    >>> sink = ClickHouseSink(Flaky(), "db")
    >>> sink.add(XidEvent(ts_ms=0, cluster="c", node="n", xid=79))
    >>> flush_with_retry(sink, sleep=lambda seconds: None), Flaky.calls
    (1, 3)
    """
    delays = retry_delays(first_delay)
    for attempt in range(1, attempts + 1):
        try:
            return sink.flush(partition)
        except SinkFlushError as exc:
            if attempt == attempts:
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(next(delays))
    raise AssertionError("unreachable")


@dataclass(slots=True)
class _Batch:
    rows: dict[str, list[list[Any]]] = field(default_factory=lambda: {table: [] for table in _COLUMNS})
    incidents: dict[str, Incident] = field(default_factory=dict)
    mttf: dict[tuple[Any, ...], MttfPartial] = field(default_factory=dict)

    def size(self) -> int:
        return sum(len(rows) for rows in self.rows.values()) + len(self.incidents) + len(self.mttf)


@dataclass(frozen=True, slots=True)
class FlushStats:
    """What one flush wrote."""

    rows: int
    seconds: float


class ClickHouseSink:
    """Batching, idempotent writer of every faultstream table.

    Parameters
    ----------
    client
        A clickhouse-connect client (chdb or server), or None with ``connect``.
    database
        Database holding the tables.
    batch_rows
        :meth:`should_flush` turns true when a partition's batch holds this many rows.
    on_flush
        Called with :class:`FlushStats` after each successful flush (metrics).
    connect
        Without ``client``: returns the client, called at the first write (a worker's connection
        is made while Faust starts: ``stream.cli.kafka``).
    """

    def __init__(
        self,
        client: Client | None,
        database: str,
        batch_rows: int = 50_000,
        on_flush: Callable[[FlushStats], None] | None = None,
        connect: Callable[[], Client] | None = None,
        config: str = "",
    ) -> None:
        if client is None and connect is None:
            raise ValueError("ClickHouseSink needs a client, or a way to connect one")
        #: The detector configuration's fingerprint, stored with every incident version.
        self.config = config
        self._client = client
        self._connect = connect
        self.database = database
        self.batch_rows = batch_rows
        self.on_flush = on_flush
        self._batches: dict[int, _Batch] = {}
        self.rows_written = 0
        # A table's insert context, made once: made afresh for every insert, it asks the server
        # for the table's column types each time (a query: 3 of a chdb insert's 6 ms).
        self._contexts: dict[str, Any] = {}

    @property
    def client(self) -> Client:
        """The client; got from ``connect`` at the first call, if none was given."""
        if self._client is None:
            assert self._connect is not None
            self._client = self._connect()
        return self._client

    def _batch(self, partition: int) -> _Batch:
        batch = self._batches.get(partition)
        if batch is None:
            batch = self._batches[partition] = _Batch()
        return batch

    def add(self, item: object, partition: int = 0) -> None:
        """Add one record of any faultstream output or raw-event type to the partition's batch."""
        batch = self._batch(partition)
        if isinstance(item, XidEvent):
            batch.rows["xid_events"].append(_xid_row(item))
        elif isinstance(item, EccRow):
            batch.rows["ecc_samples"].append(_ecc_row(item))
        elif isinstance(item, JobEvent):
            batch.rows["job_events"].append(_job_row(item))
        elif isinstance(item, Incident):
            known = batch.incidents.get(item.incident_id)
            if known is None or item.version >= known.version:
                batch.incidents[item.incident_id] = item
        elif isinstance(item, MttfPartial):
            key = (item.cluster, item.window_seconds, item.window_start_ms, item.job_id, item.run_start_ms)
            known_row = batch.mttf.get(key)
            if known_row is None or item.version >= known_row.version:
                batch.mttf[key] = item
        elif isinstance(item, JobAttribution):
            batch.rows["job_attributions"].append(_attribution_row(item))
        elif isinstance(item, DeadLetter):
            batch.rows["dead_letters"].append(_dead_letter_row(item))
        else:
            raise TypeError(f"ClickHouseSink cannot store {type(item).__name__}")

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None:
        """Add everything the detection core emitted."""
        # ECC rows are most of a replay's volume: converted in one pass, not dispatched one by one.
        self._batch(partition).rows["ecc_samples"].extend(map(_ecc_row, emitted.ecc_rows))
        for group in (emitted.incidents, emitted.attributions, emitted.mttf):
            self.add_all(group, partition)

    def add_all(self, items: Iterable[object], partition: int = 0) -> None:
        """Add several records."""
        for item in items:
            self.add(item, partition)

    def pending_rows(self, partition: int | None = None) -> int:
        """Rows waiting in one partition's batch, or in all of them."""
        if partition is not None:
            batch = self._batches.get(partition)
            return batch.size() if batch else 0
        return sum(batch.size() for batch in self._batches.values())

    def discard(self, partition: int) -> None:
        """Forget a partition's batch unwritten (the partition moved to another worker, which redoes it)."""
        self._batches.pop(partition, None)

    def should_flush(self, partition: int = 0) -> bool:
        """True when the partition's batch is full."""
        return self.pending_rows(partition) >= self.batch_rows

    def flush(self, partition: int | None = None) -> int:
        """Insert the batch of one partition (or all); return the rows written.

        On failure the batch is kept untouched and :class:`SinkFlushError` is raised: the caller
        must not commit, and may call ``flush`` again. Rows already inserted by a failed flush are
        inserted again on retry; the ReplacingMergeTree keys make that harmless.
        """
        partitions = list(self._batches) if partition is None else [partition]
        started = time.perf_counter()
        written = 0
        for number in partitions:
            batch = self._batches.get(number)
            if batch is None:
                continue
            tables = dict(batch.rows)
            tables["incidents"] = [_incident_row(item, self.config) for item in batch.incidents.values()]
            tables["mttf_partials"] = [_mttf_row(item) for item in batch.mttf.values()]
            for table, rows in tables.items():
                if not rows:
                    continue
                name, columns = f"{self.database}.{table}", list(_COLUMNS[table])
                try:
                    context = self._contexts.get(table)
                    if context is None:
                        context = self._contexts[table] = self.client.create_insert_context(
                            name, column_names=columns
                        )
                    self.client.insert(name, rows, column_names=columns, context=context)
                except Exception as exc:
                    self._contexts.pop(table, None)  # it may still hold the failed rows
                    raise SinkFlushError(f"insert into {name} failed: {exc}") from exc
                written += len(rows)
            del self._batches[number]
        self.rows_written += written
        if self.on_flush is not None and written:
            self.on_flush(FlushStats(written, time.perf_counter() - started))
        return written
