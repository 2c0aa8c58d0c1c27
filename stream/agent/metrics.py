"""The agent's Prometheus metrics (its own registry, served on ``agent_metrics_port``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AgentMetrics"]


class AgentMetrics:
    """What the agent read, spooled, published, dropped and repeated."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.lines_read = Counter(
            "faultstream_agent_lines_read",
            "Kernel-log lines (or journal entries) read, by source (file, journal).",
            ["source"],
            registry=registry,
        )
        self.lines_truncated = Counter(
            "faultstream_agent_lines_truncated",
            "Lines longer than FAULTSTREAM_AGENT_MAX_LINE_BYTES, cut to it.",
            registry=registry,
        )
        self.rotations = Counter(
            "faultstream_agent_rotations",
            "Rotations of the kernel-log file followed, by kind (renamed, truncated).",
            ["kind"],
            registry=registry,
        )
        self.published = Counter(
            "faultstream_agent_records_published",
            "Records Kafka acknowledged, by topic.",
            ["topic"],
            registry=registry,
        )
        self.publish_failures = Counter(
            "faultstream_agent_publish_failures",
            "Sends that failed (the broker away or refusing); their records stay spooled and are sent again.",
            registry=registry,
        )
        self.repeats = Counter(
            "faultstream_agent_repeats",
            "Records sent again that Kafka may already hold (after a crash or a send that failed part-way): "
            "harmless, the worker's ids are deterministic.",
            registry=registry,
        )
        self.dropped = Counter(
            "faultstream_agent_dropped_records",
            "Records dropped unsent because the spool reached FAULTSTREAM_AGENT_SPOOL_MAX_BYTES.",
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "faultstream_agent_spool_bytes", "Bytes of the on-disk spool.", registry=registry
        )
        self.spool_records = Gauge(
            "faultstream_agent_spool_records",
            "Spooled records Kafka has not acknowledged yet.",
            registry=registry,
        )
        self.lag = Gauge(
            "faultstream_agent_lag_seconds",
            "Age of the oldest spooled record Kafka has not acknowledged (0: all delivered).",
            registry=registry,
        )
        self.behind_bytes = Gauge(
            "faultstream_agent_file_behind_bytes",
            "Bytes of the kernel-log file written but not read yet.",
            registry=registry,
        )
        self.scrapes = Counter(
            "faultstream_agent_scrapes",
            "DCGM exporter scrapes and nvidia-smi runs, by source and outcome (ok, failed).",
            ["source", "outcome"],
            registry=registry,
        )
        self.unreadable = Counter(
            "faultstream_agent_unreadable",
            "Scraped values (or journal lines) that could not be read, by source; skipped.",
            ["source"],
            registry=registry,
        )
