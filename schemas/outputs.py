"""Output records: incidents, job attributions, MTTF window partial rows and dead letters.

Their field names are the column names of the ClickHouse tables in :mod:`schemas.ddl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schemas.timeutil import HOUR_MS, format_ts

__all__ = [
    "DeadLetter",
    "Incident",
    "IncidentKind",
    "IncidentStatus",
    "JobAttribution",
    "MttfPartial",
    "Severity",
]


class Severity(StrEnum):
    """How urgently a human must look: only ``critical`` pages."""

    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """Order for comparisons: info < warn < critical."""
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


class IncidentKind(StrEnum):
    """Every kind of incident the detection core can emit: what went wrong, by what found it.

    The value is what the ``kind`` column and the incidents topic carry. A member is a ``str``, so
    it compares equal to its value and serializes as it.

    >>> IncidentKind.GPU_BUS == "gpu_bus", f"{IncidentKind.LEMON_NODE}"
    (True, 'lemon_node')
    """

    # XID families (``gpu_`` + ``detectors.xid_catalog.XidCategory``). The ECC rules report into
    # the memory and row-remap families, so one fault seen in the kernel log and in the counters
    # is one incident. Application-class XIDs are info and open no incident today; their member
    # keeps the family -> kind mapping total.
    GPU_APPLICATION = "gpu_application"
    GPU_MEMORY = "gpu_memory"
    GPU_ROW_REMAP = "gpu_row_remap"
    GPU_NVLINK = "gpu_nvlink"
    GPU_BUS = "gpu_bus"
    GPU_FIRMWARE = "gpu_firmware"
    GPU_ENGINE = "gpu_engine"
    GPU_DRIVER = "gpu_driver"
    GPU_THERMAL_POWER = "gpu_thermal_power"
    GPU_RECOVERY = "gpu_recovery"  # XID 154: the driver states the GPU needs a reset or a reboot
    XID_UNKNOWN = "xid_unknown"  # XIDs missing from the catalog: at most one info incident per node a day
    # NVSwitch SXids (``detectors.sxid_catalog``), per node and switch PCI id.
    NVSWITCH_FATAL = "nvswitch_fatal"
    NVSWITCH_NONFATAL = "nvswitch_nonfatal"
    # Online models: bursts from one GPU, NVLink errors spreading over a node, rising SBEs.
    XID_STORM = "xid_storm"
    NVLINK_FLAPPING = "nvlink_flapping"
    ECC_TREND = "ecc_trend"
    # Fleet statistics: a node failing far more often than the others.
    LEMON_NODE = "lemon_node"
    # Job attribution: a failed job with hardware evidence on its nodes.
    JOB_HW_FAILURE = "job_hw_failure"
    # Job-aware verdicts: application errors that follow one user's jobs (a crash loop), addressed
    # to the jobs' owner and never a node verdict.
    JOB_APP_ERRORS = "job_app_errors"
    # Job-aware storms: a storm of application-class XIDs from the one job running on a node is
    # that job's crash loop, addressed to its owner; never a node verdict.
    JOB_XID_STORM = "job_xid_storm"


class IncidentStatus(StrEnum):
    """Lifecycle of an incident: it opens, is updated while evidence keeps coming, resolves."""

    OPEN = "open"
    UPDATED = "updated"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident, in one state of its lifecycle.

    Every update of an incident carries the same ``incident_id`` and a larger ``version``;
    ClickHouse's ReplacingMergeTree keeps the latest, and SREs see one incident, not a storm.
    ``evidence`` is a JSON-ready mapping (XID codes and messages, counter deltas, jobs).
    """

    incident_id: str
    kind: IncidentKind
    severity: Severity
    status: IncidentStatus
    cluster: str
    node: str
    gpu: str
    first_evidence_ms: int
    last_evidence_ms: int
    detected_ms: int
    detector: str
    score: float
    action: str
    summary: str
    evidence: dict[str, Any]
    evidence_count: int
    version: int

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form sent on the incidents topic."""
        return {
            "incident_id": self.incident_id,
            "kind": self.kind.value,
            "severity": self.severity.value,
            "status": self.status.value,
            "cluster": self.cluster,
            "node": self.node,
            "gpu": self.gpu,
            "first_evidence": format_ts(self.first_evidence_ms),
            "last_evidence": format_ts(self.last_evidence_ms),
            "detected": format_ts(self.detected_ms),
            "detector": self.detector,
            "score": self.score,
            "action": self.action,
            "summary": self.summary,
            "evidence": self.evidence,
            "evidence_count": self.evidence_count,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class JobAttribution:
    """The attribution decision for one job run that ended FAILED or NODE_FAIL (SPEC 4.4)."""

    cluster: str
    job_id: str
    state: str
    start_ms: int
    end_ms: int
    num_nodes: int
    gpus: int
    size_bucket: str
    hardware: bool
    evidence_nodes: tuple[str, ...]
    evidence_xids: tuple[int, ...]
    evidence_kinds: tuple[str, ...]
    incident_id: str

    @property
    def gpu_hours(self) -> float:
        """GPU-hours the run had consumed when it died (the work at risk)."""
        return self.gpus * (self.end_ms - self.start_ms) / HOUR_MS


@dataclass(frozen=True, slots=True)
class MttfPartial:
    """One job's contribution to one tumbling window: a partial row that sums with the others.

    Rows are keyed by ``(window_seconds, window_start_ms, cluster, job_id, run_start_ms)`` so
    writing the same row again (a replay, a restart) replaces it; summing over jobs in ClickHouse
    gives the window, whichever worker wrote which row. ``failures`` is 1 in the window where a
    hardware-attributed failure ended the run. ``version`` grows as more of the run is covered,
    so the most complete row of a run wins.
    """

    window_seconds: int
    window_start_ms: int
    cluster: str
    size_bucket: str
    job_id: str
    run_start_ms: int
    size_bucket_min_gpus: int
    node_hours: float
    gpu_hours: float
    job_hours: float
    jobs_ended: int
    jobs_failed: int
    failures: int
    version: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be used, with everything needed to repair and replay it."""

    source: str
    location: str
    reason: str
    raw: bytes
    record_kind: str
    event_ms: int | None = None
