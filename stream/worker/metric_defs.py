"""Every metric of the worker, declared once (after arroyo's ``metric_defs``).

A name is a :data:`MetricName` literal, so a typo where a metric is made is a type error; the
Grafana dashboards' test reads :data:`METRICS` (through :func:`exposed_series`) to check every
Prometheus panel against what the worker really exposes. :mod:`stream.worker.metrics` builds the
prometheus-client objects from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["METRICS", "MetricDef", "MetricKind", "MetricName", "exposed_series"]

MetricKind = Literal["counter", "gauge", "histogram"]

MetricName = Literal[
    "faultstream_events_in",
    "faultstream_records_in",
    "faultstream_events_skipped",
    "faultstream_records_not_ours",
    "faultstream_input_rereads",
    "faultstream_input_lost",
    "faultstream_incidents_out",
    "faultstream_dead_letters",
    "faultstream_late_events",
    "faultstream_rekey_repeats",
    "faultstream_stale_checkpoints",
    "faultstream_sink_flush_seconds",
    "faultstream_sink_rows",
    "faultstream_sink_flush_failures",
    "faultstream_checkpoints_written",
    "faultstream_checkpoint_bytes",
    "faultstream_checkpoint_timestamp_seconds",
    "faultstream_checkpoints_restored",
    "faultstream_consumer_lag",
    "faultstream_uncommitted",
    "faultstream_merge_held_records",
    "faultstream_merge_held_age_seconds",
    "faultstream_input_held_back_partitions",
    "faultstream_fleet_wait_seconds",
    "faultstream_fleet_decided_without",
    "faultstream_caught_up",
    "faultstream_kafka_wait_seconds",
    "faultstream_commits",
    "faultstream_fleet_behind",
    "faultstream_fleet_idle_pending",
    "faultstream_fleet_sent_offset",
    "faultstream_fleet_read_offset",
    "faultstream_assignment_settled",
]


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One metric: its kind, its help text and its labels (histogram buckets where it has them)."""

    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


METRICS: dict[MetricName, MetricDef] = {
    "faultstream_events_in": MetricDef("counter", "Input messages read, by topic.", ("topic",)),
    "faultstream_records_in": MetricDef(
        "counter",
        "Input records decoded and used, by topic (a message carries one or more records).",
        ("topic",),
    ),
    "faultstream_events_skipped": MetricDef(
        "counter",
        "Input messages delivered again and skipped (a restored checkpoint or an earlier read "
        "already applied them).",
        ("topic",),
    ),
    "faultstream_records_not_ours": MetricDef(
        "counter",
        "Input records read and passed over because they are not what the pipeline reads, by "
        "topic: the kernel log's lines of other drivers (most of it).",
        ("topic",),
    ),
    "faultstream_input_rereads": MetricDef(
        "counter",
        "Input partitions read again from their first unapplied offset (a gap in the offsets "
        "delivered, or a partition with more to read that delivered nothing for a while).",
        ("topic",),
    ),
    "faultstream_input_lost": MetricDef(
        "counter", "Input messages the broker deleted (retention) before the worker read them.", ("topic",)
    ),
    "faultstream_incidents_out": MetricDef("counter", "Incident updates sent to the incidents topic."),
    "faultstream_dead_letters": MetricDef(
        "counter", "Records sent to the dead letters, by topic and reason class.", ("topic", "reason")
    ),
    "faultstream_late_events": MetricDef("counter", "Records later than the allowed lateness."),
    "faultstream_rekey_repeats": MetricDef(
        "counter",
        "Re-keyed job records (jobs-by-node) sent again by a re-keyer's successor and skipped as "
        "already applied: repeats, never dead letters.",
    ),
    "faultstream_stale_checkpoints": MetricDef(
        "counter",
        "Checkpoint writes refused because another worker had taken the partition over and written "
        "its own (the partition's state here was dropped).",
    ),
    "faultstream_sink_flush_seconds": MetricDef(
        "histogram",
        "Time of a successful ClickHouse flush.",
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
    "faultstream_sink_rows": MetricDef("counter", "Rows written to ClickHouse."),
    "faultstream_sink_flush_failures": MetricDef("counter", "Failed ClickHouse flushes (retried)."),
    "faultstream_checkpoints_written": MetricDef("counter", "Detector-state checkpoints written."),
    "faultstream_checkpoint_bytes": MetricDef(
        "gauge", "Size of the newest checkpoint of each input partition.", ("partition",)
    ),
    "faultstream_checkpoint_timestamp_seconds": MetricDef(
        "gauge",
        "Wall-clock time (Unix seconds) the newest checkpoint of each input partition was written; "
        "its age is what a crash would make the next owner redo.",
        ("partition",),
    ),
    "faultstream_checkpoints_restored": MetricDef("counter", "Partitions restored from a checkpoint."),
    "faultstream_consumer_lag": MetricDef(
        "gauge",
        "Messages of an input partition not yet processed (high watermark - next offset).",
        ("topic", "partition"),
    ),
    "faultstream_uncommitted": MetricDef(
        "gauge",
        "Messages of an input partition read but not committed yet, +1 while records released "
        "from the merge wait for the commit point.",
        ("partition",),
    ),
    "faultstream_merge_held_records": MetricDef(
        "gauge",
        "Records the event-time merge of a partition holds until its other sources catch up.",
        ("partition",),
    ),
    "faultstream_input_held_back_partitions": MetricDef(
        "gauge",
        "Input partitions not read for now: their partition's merge holds as many of their records as "
        "FAULTSTREAM_WORKER_MERGE_HOLD_RECORDS allows (they wait in Kafka, not in memory).",
    ),
    "faultstream_merge_held_age_seconds": MetricDef(
        "gauge",
        "Seconds since the earliest-arrived of the records the event-time merge of a partition would "
        "release next arrived (0 when it holds none): how long held records have waited.",
        ("partition",),
    ),
    "faultstream_fleet_wait_seconds": MetricDef(
        "gauge",
        "Seconds the next record of a partition has waited for a decision of the fleet stage (a storm "
        "baseline or an ECC reference; 0 when it does not wait).",
        ("partition",),
    ),
    "faultstream_fleet_decided_without": MetricDef(
        "counter",
        "Records let go without the fleet stage's decision they waited for, after "
        "FAULTSTREAM_WORKER_FLEET_WAIT_SECONDS with no decision of the stage (results may differ "
        "from a replay's), by what they waited for.",
        ("reference",),
    ),
    "faultstream_caught_up": MetricDef(
        "gauge",
        "1 when this worker has done all it was given: its assignment settled, no input partition "
        "with messages left to read, no record held in a merge, nothing short of a commit point and "
        "nothing sent to the fleet stage that it has not applied (as far as this worker knows). "
        "Committed offsets alone do not mean caught up: held records are committed in checkpoints.",
    ),
    "faultstream_kafka_wait_seconds": MetricDef(
        "gauge",
        "Seconds the worker has waited at its start for the Kafka broker to answer (0 once it has; "
        "FAULTSTREAM_KAFKA_WAIT_SECONDS bounds the wait).",
    ),
    "faultstream_commits": MetricDef("counter", "Commit points (flush, publish, checkpoint, ack)."),
    "faultstream_fleet_behind": MetricDef(
        "gauge",
        "Messages of the fleet topic the fleet stage has not applied yet (only the worker that "
        "owns input partition 0 runs the stage; 0 elsewhere).",
    ),
    "faultstream_fleet_idle_pending": MetricDef(
        "gauge",
        "Input partitions with nothing to read that have not told the fleet stage so yet (they do "
        "after FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS).",
    ),
    "faultstream_fleet_sent_offset": MetricDef(
        "gauge",
        "The fleet topic's offset after the last message this worker sent to it, acknowledged "
        "(0 before it sent any). The fleet stage has applied everything sent once the stage "
        "owner's faultstream_fleet_read_offset reaches every worker's value.",
    ),
    "faultstream_fleet_read_offset": MetricDef(
        "gauge",
        "The next offset of the fleet topic the fleet stage reads (on the worker that owns input "
        "partition 0; -1 elsewhere).",
    ),
    "faultstream_assignment_settled": MetricDef(
        "gauge",
        "1 once the worker holds its share of the group's partitions and a timer round has gone "
        "through it (the other gauges then describe every partition it owns; a member that is "
        "starting or rebalancing reads 0, and so do its other gauges, whatever it will find).",
    ),
}

_SUFFIXES: dict[MetricKind, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exposed_series() -> dict[str, set[str]]:
    """The series names ``/metrics`` shows (as prometheus-client names them), with their labels.

    >>> series = exposed_series()
    >>> sorted(series["faultstream_events_in_total"]), sorted(series["faultstream_sink_flush_seconds_bucket"])
    (['topic'], ['le'])
    """
    exposed: dict[str, set[str]] = {}
    for name, metric in METRICS.items():
        for suffix in _SUFFIXES[metric.kind]:
            exposed[name + suffix] = set(metric.labels) | ({"le"} if suffix == "_bucket" else set())
    return exposed
