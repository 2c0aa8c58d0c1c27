"""ClickHouse DDL of database ``faultstream``: the tables Grafana and users query.

Every statement is idempotent (``IF NOT EXISTS``). Outputs that may be written again — after a
replay, a crash and restart, a rebalance — live in ReplacingMergeTree tables keyed by a
deterministic id, so reading them ``FINAL`` shows each fact once.

Tables
------
xid_events        every XID, classified (category, severity, hardware)
job_events        every job state change
ecc_samples       ECC samples, downsampled: kept when a counter moved, else once a day per GPU
incidents         one row per incident id; ``version`` grows with each update
job_attributions  the hardware/not-hardware decision for each FAILED / NODE_FAIL run
mttf_partials     exposure and failures of one job run in one tumbling window (partial sums)
mttf_windows      (view) the windows: partial sums added up, r_f, MTTF and projections
dead_letters      records that could not be used, with the reason and the raw bytes
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_DATABASE", "TABLES", "ddl_statements"]

DEFAULT_DATABASE = "faultstream"

#: Tables written by the pipeline, in the order they are created.
TABLES = (
    "xid_events",
    "job_events",
    "ecc_samples",
    "incidents",
    "job_attributions",
    "mttf_partials",
    "dead_letters",
)

_TS = "DateTime64(3, 'UTC')"


def ddl_statements(
    database: str = DEFAULT_DATABASE,
    gpus_per_node: int = 8,
    reference_sizes: Sequence[int] = (8, 1024, 16384, 131072),
) -> list[str]:
    """Return the CREATE statements, in order, for ``database``.

    Parameters
    ----------
    database
        Database name.
    gpus_per_node
        Used by the ``mttf_windows`` view to turn a job's GPU count into nodes.
    reference_sizes
        Job sizes (GPUs) whose projected MTTF the view computes.

    Examples
    --------
    >>> statements = ddl_statements()
    >>> statements[0]
    'CREATE DATABASE IF NOT EXISTS faultstream'
    >>> all("IF NOT EXISTS" in s for s in statements)
    True
    """
    if not database.isidentifier():
        raise ValueError(f"database name must be a plain identifier, got {database!r}")
    db = database
    projections = ",\n    ".join(
        f"if(failures > 0, node_hours / ({max(size / gpus_per_node, 1.0)!r} * failures), NULL)"
        f" AS projected_mttf_hours_{size}"
        for size in reference_sizes
    )
    sums = """sum(node_hours) AS node_hours,
        sum(gpu_hours) AS gpu_hours,
        sum(job_hours) AS job_hours,
        sum(jobs_ended) AS jobs_ended,
        sum(jobs_failed) AS jobs_failed,
        sum(failures) AS failures"""
    return [
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"""CREATE TABLE IF NOT EXISTS {db}.xid_events (
    event_id String,
    ts {_TS},
    cluster LowCardinality(String),
    node LowCardinality(String),
    pci_bus_id LowCardinality(String),
    gpu Nullable(UInt16),
    xid UInt16,
    xid_name LowCardinality(String),
    category LowCardinality(String),
    severity LowCardinality(String),
    hardware Bool,
    pid Nullable(UInt32),
    process String,
    message String,
    source String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, node, ts, event_id)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.job_events (
    ts {_TS},
    cluster LowCardinality(String),
    job_id String,
    state LowCardinality(String),
    start Nullable({_TS}),
    end Nullable({_TS}),
    nodes Array(LowCardinality(String)),
    num_nodes UInt32,
    gpus UInt32,
    exit_code String,
    name String,
    user String,
    source String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, job_id, ts, state)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.ecc_samples (
    ts {_TS},
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_key LowCardinality(String),
    gpu Nullable(UInt16),
    pci_bus_id LowCardinality(String),
    sbe_volatile Nullable(UInt64),
    dbe_volatile Nullable(UInt64),
    sbe_aggregate Nullable(UInt64),
    dbe_aggregate Nullable(UInt64),
    retired_pages_sbe Nullable(UInt64),
    retired_pages_dbe Nullable(UInt64),
    retired_pages_pending Nullable(UInt64),
    remapped_rows_correctable Nullable(UInt64),
    remapped_rows_uncorrectable Nullable(UInt64),
    remap_pending Nullable(UInt64),
    remap_failure Nullable(UInt64),
    sbe_delta UInt64,
    dbe_delta UInt64,
    counter_reset Bool
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, node, gpu_key, ts)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.incidents (
    incident_id String,
    version UInt64,
    kind LowCardinality(String),
    severity LowCardinality(String),
    status LowCardinality(String),
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu LowCardinality(String),
    first_evidence {_TS},
    last_evidence {_TS},
    detected {_TS},
    detector LowCardinality(String),
    score Float64,
    action String,
    summary String,
    evidence String,
    evidence_count UInt32
) ENGINE = ReplacingMergeTree(version)
ORDER BY incident_id""",
        f"""CREATE TABLE IF NOT EXISTS {db}.job_attributions (
    cluster LowCardinality(String),
    job_id String,
    state LowCardinality(String),
    start {_TS},
    end {_TS},
    num_nodes UInt32,
    gpus UInt32,
    size_bucket LowCardinality(String),
    hardware Bool,
    evidence_nodes Array(LowCardinality(String)),
    evidence_xids Array(UInt16),
    evidence_kinds Array(LowCardinality(String)),
    incident_id String,
    gpu_hours Float64,
    -- A job spanning several partitions is judged by each with its own nodes' evidence: a
    -- hardware verdict replaces a no-evidence one, whatever order they were written in.
    verdict UInt8 MATERIALIZED toUInt8(hardware)
) ENGINE = ReplacingMergeTree(verdict)
ORDER BY (cluster, job_id, start)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.mttf_partials (
    window_seconds UInt32,
    window_start {_TS},
    cluster LowCardinality(String),
    size_bucket LowCardinality(String),
    size_bucket_min_gpus UInt32,
    job_id String,
    run_start {_TS},
    node_hours Float64,
    gpu_hours Float64,
    job_hours Float64,
    jobs_ended UInt32,
    jobs_failed UInt32,
    failures UInt32,
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, window_seconds, window_start, job_id, run_start)""",
        f"""CREATE VIEW IF NOT EXISTS {db}.mttf_windows AS
SELECT
    window_seconds,
    window_start,
    window_start + toIntervalSecond(window_seconds) AS window_end,
    cluster,
    size_bucket,
    size_bucket_min_gpus,
    node_hours,
    gpu_hours,
    job_hours,
    jobs_ended,
    jobs_failed,
    failures,
    if(node_hours > 0, failures / (node_hours / 24) * 1000, NULL) AS rf_per_1000_node_days,
    if(failures > 0, job_hours / failures, NULL) AS mttf_hours,
    {projections}
FROM (
    SELECT window_seconds, window_start, cluster, size_bucket,
        min(size_bucket_min_gpus) AS size_bucket_min_gpus,
        {sums}
    FROM {db}.mttf_partials FINAL
    GROUP BY window_seconds, window_start, cluster, size_bucket
    UNION ALL
    SELECT window_seconds, window_start, cluster, 'all' AS size_bucket, toUInt32(0) AS size_bucket_min_gpus,
        {sums}
    FROM {db}.mttf_partials FINAL
    GROUP BY window_seconds, window_start, cluster
)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.dead_letters (
    source String,
    location String,
    reason String,
    record_kind LowCardinality(String),
    event_ts Nullable({_TS}),
    raw String,
    recorded_at {_TS}
) ENGINE = ReplacingMergeTree
ORDER BY (source, location, reason)""",
    ]
