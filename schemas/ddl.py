"""ClickHouse DDL of database ``faultstream``: the tables Grafana and users query.

Every statement is idempotent (``IF NOT EXISTS``). A column added after its table was first
released is declared with ``added=True``: besides being in the CREATE, it gets an ``ALTER TABLE ..
ADD COLUMN IF NOT EXISTS`` with a default, so a store created by an older version gains it on the
next start and its old rows read the default. Outputs that may be written again — after a
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
from dataclasses import dataclass

from schemas.records import ECC_COUNTERS

__all__ = ["DEFAULT_DATABASE", "INSERT_COLUMNS", "TABLES", "Column", "Table", "ddl_statements"]

DEFAULT_DATABASE = "faultstream"

_TS = "DateTime64(3, 'UTC')"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table: its name, its ClickHouse type, and whether the pipeline writes it."""

    name: str
    type: str
    #: False for a column ClickHouse computes itself (MATERIALIZED): never in an INSERT.
    written: bool = True
    #: SQL comment lines shown above the column in the DDL (why it exists).
    comment: tuple[str, ...] = ()
    #: True for a column added to a released table: an ALTER adds it to tables created before it
    #: existed. Its type must then carry a DEFAULT, which old rows read.
    added: bool = False

    def sql(self) -> str:
        lines = [f"    -- {line}" for line in self.comment]
        return "\n".join([*lines, f"    {self.name} {self.type}"])


@dataclass(frozen=True, slots=True)
class Table:
    """A table written by the pipeline: its columns in order, and its engine clause."""

    name: str
    columns: tuple[Column, ...]
    engine: str

    def create(self, database: str) -> str:
        """The idempotent CREATE statement of this table in ``database``."""
        body = ",\n".join(column.sql() for column in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {database}.{self.name} (\n{body}\n) {self.engine}"

    def migrations(self, database: str) -> list[str]:
        """The idempotent ALTER statements that bring a table created by an older version up to date.

        >>> table = Table("t", (Column("a", "UInt8"), Column("b", "UInt8 DEFAULT 1", added=True)), "")
        >>> table.migrations("db")
        ['ALTER TABLE db.t ADD COLUMN IF NOT EXISTS b UInt8 DEFAULT 1 AFTER a']
        """
        statements = []
        for before, column in zip(self.columns, self.columns[1:], strict=False):
            if column.added:
                statements.append(
                    f"ALTER TABLE {database}.{self.name} ADD COLUMN IF NOT EXISTS {column.name} {column.type}"
                    f" AFTER {before.name}"
                )
        return statements


def _columns(spec: str) -> tuple[Column, ...]:
    """Columns from ``name type`` lines (the type is the rest of the line)."""
    pairs = (line.strip().split(" ", 1) for line in spec.strip().splitlines())
    return tuple(Column(name, sql_type) for name, sql_type in pairs)


_LOW = "LowCardinality(String)"

#: Tables written by the pipeline, in the order they are created. The ClickHouse sink inserts
#: exactly :data:`INSERT_COLUMNS` of each, so a column is declared here and nowhere else.
_TABLES: tuple[Table, ...] = (
    Table(
        "xid_events",
        (
            *_columns(f"""
                event_id String
                ts {_TS}
                cluster {_LOW}
                node {_LOW}
                pci_bus_id {_LOW}
                gpu Nullable(UInt16)
                xid UInt16
            """),
            Column(
                "device",
                f"{_LOW} DEFAULT 'gpu'",
                comment=(
                    "'gpu' (NVRM: Xid, DCGM) or 'nvswitch' (SXid: xid is the SXid code, pci_bus_id the",
                    "switch's). Rows written before the column existed are GPU XIDs: the default.",
                ),
                added=True,
            ),
            *_columns(f"""
                xid_name {_LOW}
                category {_LOW}
                severity {_LOW}
                hardware Bool
                pid Nullable(UInt32)
                process String
                message String
                source String
            """),
        ),
        "ENGINE = ReplacingMergeTree\nPARTITION BY toYYYYMM(ts)\nORDER BY (cluster, node, ts, event_id)",
    ),
    Table(
        "job_events",
        (
            *_columns(f"""
                ts {_TS}
                cluster {_LOW}
                job_id String
                state {_LOW}
                start Nullable({_TS})
                end Nullable({_TS})
                nodes Array({_LOW})
                num_nodes UInt32
                gpus UInt32
                exit_code String
                name String
                user String
                source String
            """),
            Column(
                "partition",
                "String DEFAULT ''",
                comment=(
                    "The Slurm partition; '' when sacct had no Partition column, and in rows written",
                    "before the column existed.",
                ),
                added=True,
            ),
        ),
        "ENGINE = ReplacingMergeTree\nPARTITION BY toYYYYMM(ts)\nORDER BY (cluster, job_id, ts, state)",
    ),
    Table(
        "ecc_samples",
        (
            *_columns(f"""
                ts {_TS}
                cluster {_LOW}
                node {_LOW}
                gpu_key {_LOW}
                gpu Nullable(UInt16)
                pci_bus_id {_LOW}
            """),
            *(Column(name, "Nullable(UInt64)") for name in ECC_COUNTERS),
            *_columns("""
                sbe_delta UInt64
                dbe_delta UInt64
                counter_reset Bool
            """),
        ),
        "ENGINE = ReplacingMergeTree\nPARTITION BY toYYYYMM(ts)\nORDER BY (cluster, node, gpu_key, ts)",
    ),
    Table(
        "incidents",
        (
            *_columns(f"""
                incident_id String
                version UInt64
                kind {_LOW}
                severity {_LOW}
                status {_LOW}
                cluster {_LOW}
                node {_LOW}
                gpu {_LOW}
                first_evidence {_TS}
                last_evidence {_TS}
                detected {_TS}
                detector {_LOW}
                score Float64
                action String
                summary String
                evidence String
                evidence_count UInt32
            """),
            Column(
                "config",
                f"{_LOW} DEFAULT ''",
                added=True,
                comment=(
                    "The detector configuration's fingerprint (faultstream config --check) this version",
                    "was made under: versions made under different configurations say so.",
                ),
            ),
        ),
        "ENGINE = ReplacingMergeTree(version)\nORDER BY incident_id",
    ),
    Table(
        "job_attributions",
        (
            *_columns(f"""
                cluster {_LOW}
                job_id String
                state {_LOW}
                start {_TS}
                end {_TS}
                num_nodes UInt32
                gpus UInt32
                size_bucket {_LOW}
                hardware Bool
                evidence_nodes Array({_LOW})
                evidence_xids Array(UInt16)
                evidence_kinds Array({_LOW})
                incident_id String
                gpu_hours Float64
            """),
            Column(
                "verdict",
                "UInt8 MATERIALIZED toUInt8(hardware)",
                written=False,
                comment=(
                    "A job spanning several partitions is judged by each with its own nodes' evidence: a",
                    "hardware verdict replaces a no-evidence one, whatever order they were written in.",
                ),
            ),
        ),
        "ENGINE = ReplacingMergeTree(verdict)\nORDER BY (cluster, job_id, start)",
    ),
    Table(
        "mttf_partials",
        _columns(f"""
            window_seconds UInt32
            window_start {_TS}
            cluster {_LOW}
            size_bucket {_LOW}
            size_bucket_min_gpus UInt32
            job_id String
            run_start {_TS}
            node_hours Float64
            gpu_hours Float64
            job_hours Float64
            jobs_ended UInt32
            jobs_failed UInt32
            failures UInt32
            version UInt64
        """),
        "ENGINE = ReplacingMergeTree(version)\n"
        "ORDER BY (cluster, window_seconds, window_start, job_id, run_start)",
    ),
    Table(
        "fleet_inventory",
        _columns(f"""
            cluster {_LOW}
            node {_LOW}
            gpus Nullable(UInt16)
            model {_LOW}
            source String
            loaded {_TS}
        """),
        "ENGINE = ReplacingMergeTree(loaded)\nORDER BY (cluster, node)",
    ),
    Table(
        "remediations",
        _columns(f"""
            decided {_TS}
            incident_id String
            version UInt64
            cluster {_LOW}
            node {_LOW}
            kind {_LOW}
            severity {_LOW}
            action {_LOW}
            outcome {_LOW}
            reason String
            slurm_reason String
            executed Bool
            actor String
        """),
        "ENGINE = MergeTree\nORDER BY (decided, incident_id)",
    ),
    Table(
        "dead_letters",
        _columns(f"""
            source String
            location String
            reason String
            record_kind {_LOW}
            event_ts Nullable({_TS})
            raw String
            recorded_at {_TS}
        """),
        "ENGINE = ReplacingMergeTree\nORDER BY (source, location, reason)",
    ),
)

#: Tables written by the pipeline, in the order they are created.
TABLES: tuple[str, ...] = tuple(table.name for table in _TABLES)

#: Table -> the columns an INSERT names, in order (the ClickHouse sink's row layout).
INSERT_COLUMNS: dict[str, tuple[str, ...]] = {
    table.name: tuple(column.name for column in table.columns if column.written) for table in _TABLES
}


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
    # The ALTERs come last: they bring tables made by an older version up to date, and on a fresh
    # store find each column already there and do nothing.
    tables = [table.create(db) for table in _TABLES]
    migrations = [statement for table in _TABLES for statement in table.migrations(db)]
    view_at = TABLES.index("mttf_partials") + 1  # the view reads mttf_partials
    view = f"""CREATE VIEW IF NOT EXISTS {db}.mttf_windows AS
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
)"""
    return [f"CREATE DATABASE IF NOT EXISTS {db}", *tables[:view_at], view, *tables[view_at:], *migrations]
