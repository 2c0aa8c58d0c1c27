"""The worker's Prometheus metrics, served on ``metrics_host:metrics_port`` at ``/metrics``.

Every name starts with ``faultstream_`` and is declared in :mod:`stream.worker.metric_defs`.
Each worker has its own registry, so tests can build several in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from stream.worker.metric_defs import METRICS, MetricDef, MetricKind, MetricName

__all__ = ["InputCounters", "WorkerMetrics"]


def _declared(name: MetricName, kind: MetricKind) -> MetricDef:
    metric = METRICS[name]
    if metric.kind != kind:
        raise TypeError(f"{name} is declared a {metric.kind}, not a {kind}")
    return metric


class InputCounters(NamedTuple):
    """What one input topic brought: messages and the records in them."""

    messages: Counter
    records: Counter


class WorkerMetrics:
    """Counters, gauges and histograms of one worker, as :mod:`stream.worker.metric_defs` declares them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events_in = self._counter("faultstream_events_in")
        self.records_in = self._counter("faultstream_records_in")
        self.events_skipped = self._counter("faultstream_events_skipped")
        self.records_not_ours = self._counter("faultstream_records_not_ours")
        self.input_rereads = self._counter("faultstream_input_rereads")
        self.input_lost = self._counter("faultstream_input_lost")
        self.incidents_out = self._counter("faultstream_incidents_out")
        self.dead_letters = self._counter("faultstream_dead_letters")
        self.late_events = self._counter("faultstream_late_events")
        self.rekey_repeats = self._counter("faultstream_rekey_repeats")
        self.stale_checkpoints = self._counter("faultstream_stale_checkpoints")
        self.sink_flush_seconds = self._histogram("faultstream_sink_flush_seconds")
        self.sink_rows = self._counter("faultstream_sink_rows")
        self.sink_flush_failures = self._counter("faultstream_sink_flush_failures")
        self.checkpoints_written = self._counter("faultstream_checkpoints_written")
        self.checkpoint_bytes = self._gauge("faultstream_checkpoint_bytes")
        self.checkpoint_timestamp = self._gauge("faultstream_checkpoint_timestamp_seconds")
        self.checkpoints_restored = self._counter("faultstream_checkpoints_restored")
        self.consumer_lag = self._gauge("faultstream_consumer_lag")
        self.uncommitted = self._gauge("faultstream_uncommitted")
        self.held_back = self._gauge("faultstream_merge_held_records")
        self.held_age = self._gauge("faultstream_merge_held_age_seconds")
        self.held_back_partitions = self._gauge("faultstream_input_held_back_partitions")
        self.fleet_wait = self._gauge("faultstream_fleet_wait_seconds")
        self.fleet_decided_without = self._counter("faultstream_fleet_decided_without")
        self.caught_up = self._gauge("faultstream_caught_up")
        self.kafka_wait = self._gauge("faultstream_kafka_wait_seconds")
        self.fleet_behind = self._gauge("faultstream_fleet_behind")
        self.fleet_idle_pending = self._gauge("faultstream_fleet_idle_pending")
        self.fleet_sent_offset = self._gauge("faultstream_fleet_sent_offset")
        self.fleet_read_offset = self._gauge("faultstream_fleet_read_offset")
        self.fleet_read_offset.set(-1)
        self.assignment_settled = self._gauge("faultstream_assignment_settled")
        self.commits = self._counter("faultstream_commits")
        self._inputs: dict[str, InputCounters] = {}
        self.served = False

    def input(self, topic: str) -> InputCounters:
        """The message and record counters of an input topic (kept: ``labels()`` per message
        took a lock and a dict lookup each time)."""
        counters = self._inputs.get(topic)
        if counters is None:
            counters = self._inputs[topic] = InputCounters(
                self.events_in.labels(topic), self.records_in.labels(topic)
            )
        return counters

    def _counter(self, name: MetricName) -> Counter:
        metric = _declared(name, "counter")
        return Counter(name, metric.help, metric.labels, registry=self.registry)

    def _gauge(self, name: MetricName) -> Gauge:
        metric = _declared(name, "gauge")
        return Gauge(name, metric.help, metric.labels, registry=self.registry)

    def _histogram(self, name: MetricName) -> Histogram:
        metric = _declared(name, "histogram")
        return Histogram(name, metric.help, metric.labels, buckets=metric.buckets, registry=self.registry)

    def forget_partition(self, partition: int, topics: Iterable[str]) -> None:
        """Drop the per-partition series of a partition this worker no longer owns."""
        label = str(partition)
        for gauge in (
            self.uncommitted,
            self.held_back,
            self.held_age,
            self.fleet_wait,
            self.checkpoint_bytes,
            self.checkpoint_timestamp,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(label)
        for topic in topics:
            with contextlib.suppress(KeyError):
                self.consumer_lag.remove(topic, label)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` from a background thread (once: a second call does nothing)."""
        if self.served:
            return
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror}): set FAULTSTREAM_METRICS_PORT "
                "to a free port, or 0 to turn the endpoint off"
            ) from exc
        self.served = True
