"""The worker's Prometheus metrics, served on ``metrics_host:metrics_port`` at ``/metrics``.

Every name starts with ``faultstream_``. Each worker has its own registry, so tests can build
several in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["WorkerMetrics"]


class WorkerMetrics:
    """Counters, gauges and histograms of one worker."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.events_in = Counter(
            "faultstream_events_in", "Input messages read, by topic.", ["topic"], registry=registry
        )
        self.events_skipped = Counter(
            "faultstream_events_skipped",
            "Input messages delivered again and skipped (a restored checkpoint or an earlier read "
            "already applied them).",
            ["topic"],
            registry=registry,
        )
        self.input_rereads = Counter(
            "faultstream_input_rereads",
            "Input partitions read again from their first unapplied offset (a gap in the offsets "
            "delivered, or a partition with more to read that delivered nothing for a while).",
            ["topic"],
            registry=registry,
        )
        self.input_lost = Counter(
            "faultstream_input_lost",
            "Input messages the broker deleted (retention) before the worker read them.",
            ["topic"],
            registry=registry,
        )
        self.incidents_out = Counter(
            "faultstream_incidents_out", "Incident updates sent to the incidents topic.", registry=registry
        )
        self.dead_letters = Counter(
            "faultstream_dead_letters",
            "Records sent to the dead letters, by topic and reason class.",
            ["topic", "reason"],
            registry=registry,
        )
        self.late_events = Counter(
            "faultstream_late_events", "Records later than the allowed lateness.", registry=registry
        )
        self.sink_flush_seconds = Histogram(
            "faultstream_sink_flush_seconds",
            "Time of a successful ClickHouse flush.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.sink_rows = Counter("faultstream_sink_rows", "Rows written to ClickHouse.", registry=registry)
        self.sink_flush_failures = Counter(
            "faultstream_sink_flush_failures", "Failed ClickHouse flushes (retried).", registry=registry
        )
        self.checkpoints_written = Counter(
            "faultstream_checkpoints_written", "Detector-state checkpoints written.", registry=registry
        )
        self.checkpoint_bytes = Gauge(
            "faultstream_checkpoint_bytes",
            "Size of the newest checkpoint of each input partition.",
            ["partition"],
            registry=registry,
        )
        self.checkpoints_restored = Counter(
            "faultstream_checkpoints_restored", "Partitions restored from a checkpoint.", registry=registry
        )
        self.consumer_lag = Gauge(
            "faultstream_consumer_lag",
            "Messages of an input partition not yet processed (high watermark - next offset).",
            ["topic", "partition"],
            registry=registry,
        )
        self.uncommitted = Gauge(
            "faultstream_uncommitted",
            "Messages of an input partition read but not committed yet, +1 while records released "
            "from the merge wait for the commit point.",
            ["partition"],
            registry=registry,
        )
        self.held_back = Gauge(
            "faultstream_merge_held_records",
            "Records the event-time merge of a partition holds until its other sources catch up.",
            ["partition"],
            registry=registry,
        )
        self.commits = Counter(
            "faultstream_commits", "Commit points (flush, publish, checkpoint, ack).", registry=registry
        )

    def forget_partition(self, partition: int, topics: Iterable[str]) -> None:
        """Drop the per-partition series of a partition this worker no longer owns."""
        label = str(partition)
        for gauge in (self.uncommitted, self.held_back, self.checkpoint_bytes):
            with contextlib.suppress(KeyError):
                gauge.remove(label)
        for topic in topics:
            with contextlib.suppress(KeyError):
                self.consumer_lag.remove(topic, label)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` from a background thread."""
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror}): set FAULTSTREAM_METRICS_PORT "
                "to a free port, or 0 to turn the endpoint off"
            ) from exc
