"""Cluster, job and fault generation of the synthetic cluster: pure, seeded, no I/O.

An event-driven model of a GPU training cluster, calibrated to RSC-1 of Kokolis et al.,
"Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (HPCA 2025):

* Jobs arrive as a Poisson process with sizes from a heavy-tailed mix (most need 1 to 8 GPUs,
  some 16 to 256, a few 512 to 4096) and lognormal durations. A job takes whole nodes
  (``ceil(gpus / gpus_per_node)``; a 1 to 7 GPU job has a node to itself), so its exposure is
  nodes x run time. The scheduler is FIFO with EASY backfill: the blocked head of the queue holds
  a reservation (its *shadow time*), and later jobs may start if they end before it or use only
  nodes it does not need. Jobs go to the lowest-numbered free healthy nodes.
* Hardware faults strike each node as a Poisson process, whether or not a job runs there, at a
  rate such that the cluster as a whole sees ``hardware_failure_rate`` per 1000 node-days of wall
  time: lemon nodes (:mod:`stream.simulator.planted`) fail ``lemon_fault_multiplier`` times as
  often as the others, and degrading GPUs end in an uncorrectable error. A fault logs a
  hardware-class XID on one GPU. A job on the node dies 0.5 to 4 minutes later (FAILED or
  NODE_FAIL): a hardware-attributed failure, and its user resubmits the rest of its work (a new
  job id, as restarting from a checkpoint). The node is down for a repair of 2 to 24 hours, then reboots
  (volatile ECC counters reset). A fault on an idle node takes it out of service; no job dies.
* About a quarter of the jobs end FAILED, CANCELLED, OUT_OF_MEMORY or TIMEOUT for user reasons;
  many leave application XIDs (13, 31, 43, 45, 68, 109) on their nodes just before they end.
* A few percent of the GPUs accumulate correctable (SBE) errors, a few percent log one or two
  once, and nodes without faults are rebooted for maintenance: benign.
* Planted anomalies with onsets (:mod:`stream.simulator.planted`): degrading GPUs, XID storms,
  flapping NVLinks, lemon nodes.

Ground truth agrees with the attribution rule of SPEC 4.4 (a FAILED/NODE_FAIL end is hardware
when its nodes show a hardware-class XID from 10 minutes before to 5 minutes after it): a job
killed by a fault ends at most 4 minutes after the XID, and a fault never lands within
:data:`FAULT_QUIET_AFTER_END_MS` after a job ended on its node (it is postponed), so no job that
failed for user reasons has a hardware XID in its window (storms and flapping links log only
application XIDs and the non-fatal XID 144).

Determinism: all random draws come from ``numpy.random.Generator(PCG64)`` streams spawned from
the seed and are taken in an order fixed by the event order (ties broken by event kind and a
sequence number); nothing iterates over a set or reads a clock.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from schemas.records import JobState
from stream.simulator.events import (
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    MS_PER_SECOND,
    EccEvent,
    EccEventKind,
    KernelLine,
    KernelLineKind,
    XidRecord,
    job_pid,
    line_us,
)
from stream.simulator.planted import (
    DegradationRecord,
    FlapRecord,
    MaintenanceRecord,
    StormDraw,
    StormRecord,
    choose_lemons,
    degradation_record,
    fault_rates,
    lemon_xids,
    plan_degradations,
    plan_flapping,
    plan_maintenance,
    plan_sbe_blips,
    plan_storms,
    storm_lines,
    storm_window,
)

__all__ = [
    "APPLICATION_XIDS",
    "DEFAULT_START_MS",
    "DGX_A100_PCI_BUS_IDS",
    "FAULT_KIND_CRITICAL_HW",
    "FAULT_QUIET_AFTER_END_MS",
    "FAULT_SOURCE_BASE",
    "FAULT_SOURCE_ECC_DEGRADATION",
    "FAULT_SOURCE_LEMON",
    "HARDWARE_FAULT_TEMPLATES",
    "JOB_SIZE_MIX",
    "LEMON_FAULT_TEMPLATES",
    "MS_PER_DAY",
    "MS_PER_HOUR",
    "MS_PER_MINUTE",
    "MS_PER_SECOND",
    "ClusterHistory",
    "DegradationRecord",
    "EccEvent",
    "EccEventKind",
    "EccPlan",
    "EccScrape",
    "FaultRecord",
    "FlapRecord",
    "HardwareFaultTemplate",
    "JobRecord",
    "JobSizeClass",
    "KernelLine",
    "KernelLineKind",
    "MaintenanceRecord",
    "SimulationConfig",
    "StormRecord",
    "XidRecord",
    "iter_ecc_scrapes",
    "job_pid",
    "pci_bus_id",
    "run_model",
]


#: 2024-01-01T00:00:00Z in epoch milliseconds.
DEFAULT_START_MS: Final = 1_704_067_200_000

#: A fault is postponed while the last job on its node ended less than this long ago, so that a
#: job's attribution window (10 min before to 5 min after its end) never catches a fault that
#: did not kill it.
FAULT_QUIET_AFTER_END_MS: Final = 6 * MS_PER_MINUTE

#: Kind of the critical hardware faults (the truth's ``faults[].kind``); the other kinds are in
#: :mod:`stream.simulator.planted`.
FAULT_KIND_CRITICAL_HW: Final = "critical_hw"

#: What caused a critical fault (:attr:`FaultRecord.source`): the random faults every node has,
#: the extra faults of a lemon node, the uncorrectable error that ends a degradation.
FAULT_SOURCE_BASE: Final = "base"
FAULT_SOURCE_LEMON: Final = "lemon"
FAULT_SOURCE_ECC_DEGRADATION: Final = "ecc_degradation"

#: PCI bus ids of the eight GPUs of a DGX A100, in GPU index order.
DGX_A100_PCI_BUS_IDS: Final[tuple[str, ...]] = (
    "0000:07:00",
    "0000:0f:00",
    "0000:47:00",
    "0000:4e:00",
    "0000:87:00",
    "0000:90:00",
    "0000:b7:00",
    "0000:bd:00",
)

#: Application-class XIDs (SPEC 4.1): not hardware faults.
APPLICATION_XIDS: Final[tuple[int, ...]] = (13, 31, 43, 45, 68, 109)

# Mix of application XIDs left by a job that fails for user reasons, and by a healthy job.
_APP_XID_MIX: Final[tuple[tuple[int, float], ...]] = (
    (13, 0.28),
    (31, 0.36),
    (43, 0.14),
    (45, 0.08),
    (68, 0.04),
    (109, 0.10),
)
_TRANSIENT_XID_MIX: Final[tuple[tuple[int, float], ...]] = ((13, 0.4), (31, 0.45), (43, 0.15))

# Probability that a job ending in this state (for user reasons) logs application XIDs; FAILED
# is the config's ``app_xid_failed_probability``.
_APP_XID_STATE_PROBABILITY: Final[dict[JobState, float]] = {
    JobState.OUT_OF_MEMORY: 0.20,
    JobState.CANCELLED: 0.15,
    JobState.TIMEOUT: 0.10,
}
# Probability that the other GPUs of a hardware-killed job log XID 45 (preemptive cleanup).
_CLEANUP_XID_PROBABILITY: Final = 0.5


class HardwareFaultTemplate(NamedTuple):
    """One kind of hardware fault: the XIDs it logs and its effect on the ECC counters.

    Attributes
    ----------
    name
        Short name, kept in the truth's fault ``details``.
    xids
        XID codes logged, the first at the onset, the others 0.5 to 3 s apart.
    weight
        Share of hardware faults of this kind.
    dbe
        Adds one uncorrectable (DBE) error to the volatile and aggregate counters.
    retire_pending
        Sets ``RETIRED_PENDING`` until the next reboot.
    remap_failure
        Sets ``ROW_REMAP_FAILURE``; a reboot clears it only if the GPU was replaced.
    """

    name: str
    xids: tuple[int, ...]
    weight: float
    dbe: bool = False
    retire_pending: bool = False
    remap_failure: bool = False


#: The hardware faults and their shares (the paper's most frequent hardware XIDs).
HARDWARE_FAULT_TEMPLATES: Final[tuple[HardwareFaultTemplate, ...]] = (
    HardwareFaultTemplate("fallen_off_bus", (79,), 0.22),
    HardwareFaultTemplate("dbe", (48, 63), 0.10, dbe=True, retire_pending=True),
    HardwareFaultTemplate("contained_ecc", (94,), 0.10, dbe=True),
    HardwareFaultTemplate("uncontained_ecc", (95,), 0.08, dbe=True),
    HardwareFaultTemplate("nvlink", (74,), 0.18),
    HardwareFaultTemplate("gsp_rpc_timeout", (119,), 0.14),
    HardwareFaultTemplate("gsp_task_timeout", (120,), 0.06),
    HardwareFaultTemplate("row_remap_failure", (63, 64), 0.07, retire_pending=True, remap_failure=True),
    HardwareFaultTemplate("row_remap_failure_direct", (64,), 0.05, remap_failure=True),
)

#: The extra faults of lemon nodes: the bus, GSP and micro-controller faults that take a node
#: out with its job (mostly NODE_FAIL).
LEMON_FAULT_TEMPLATES: Final[tuple[HardwareFaultTemplate, ...]] = (
    HardwareFaultTemplate("fallen_off_bus", (79,), 0.45),
    HardwareFaultTemplate("gsp_rpc_timeout", (119,), 0.35),
    HardwareFaultTemplate("micro_controller_halt", (62,), 0.20),
)
_TEMPLATES_BY_NAME: Final[dict[str, HardwareFaultTemplate]] = {
    template.name: template for template in (*HARDWARE_FAULT_TEMPLATES, *LEMON_FAULT_TEMPLATES)
}


class JobSizeClass(NamedTuple):
    """One job size of the mix: GPUs requested, share of jobs, lognormal duration."""

    gpus: int
    weight: float
    median_hours: float
    sigma: float


#: Job sizes: most jobs are small, a few large ones hold most of the node-hours.
JOB_SIZE_MIX: Final[tuple[JobSizeClass, ...]] = (
    JobSizeClass(1, 0.52, 0.75, 1.4),
    JobSizeClass(2, 0.06, 0.75, 1.4),
    JobSizeClass(4, 0.07, 0.75, 1.4),
    JobSizeClass(8, 0.24, 1.0, 1.4),
    JobSizeClass(16, 0.035, 3.0, 1.2),
    JobSizeClass(32, 0.025, 3.0, 1.2),
    JobSizeClass(64, 0.020, 3.0, 1.2),
    JobSizeClass(128, 0.012, 4.0, 1.2),
    JobSizeClass(256, 0.008, 4.0, 1.2),
    JobSizeClass(512, 0.005, 10.0, 1.0),
    JobSizeClass(1024, 0.0035, 10.0, 1.0),
    JobSizeClass(2048, 0.0011, 12.0, 1.0),
    JobSizeClass(4096, 0.0004, 12.0, 1.0),
)

_JOB_NAMES: Final[tuple[str, ...]] = (
    "train",
    "pretrain_llm",
    "finetune",
    "eval",
    "sweep",
    "bash",
    "interactive",
    "data_prep",
    "rl_rollout",
    "inference",
)
_PROCESS_NAMES: Final[tuple[str, ...]] = ("python", "python3", "pt_main_thread")
_FAILED_EXIT_CODES: Final[tuple[tuple[str, float], ...]] = (
    ("1:0", 0.70),
    ("0:9", 0.08),
    ("2:0", 0.06),
    ("127:0", 0.04),
    ("0:6", 0.06),
    ("255:0", 0.06),
)
_JOB_ID_BASE: Final = 4_200_001
_FIRST_UID: Final = 10_001
_ADMIN_UID: Final = 0

# Drawn outcome of a job, before faults and the time limit.
_OUT_COMPLETED, _OUT_FAILED, _OUT_CANCELLED, _OUT_OOM, _OUT_TIMEOUT = range(5)
_OUTCOME_STATES: Final[tuple[JobState, ...]] = (
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.OUT_OF_MEMORY,
    JobState.TIMEOUT,
)


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """Parameters of a simulated cluster; the defaults model RSC-1 at a small scale.

    Every field is a plain scalar so that the configuration round-trips through ``truth.json``.
    """

    nodes: int = 64
    gpus_per_node: int = 8
    days: float = 7.0
    seed: int = 0
    cluster: str = "sim"
    start_ms: int = DEFAULT_START_MS
    ecc_interval_minutes: int = 360  # DCGM scrape period written to dcgm.prom
    hardware_failure_rate: float = 6.5  # critical faults per 1000 node-days of wall time, cluster-wide
    target_load: float = 0.85  # offered load: requested node-hours / node-hours of the span
    user_failed_fraction: float = 0.12  # jobs ending FAILED for user reasons (bugs, NCCL errors)
    user_cancelled_fraction: float = 0.06  # jobs cancelled by their user or an admin while running
    user_oom_fraction: float = 0.03  # jobs ending OUT_OF_MEMORY
    user_timeout_fraction: float = 0.03  # jobs reaching their own time limit (TIMEOUT)
    timelimit_hours: float = 72.0  # partition time limit: longer runs end TIMEOUT here
    max_job_fraction: float = 0.5  # largest job, as a share of the cluster's nodes
    backfill_depth: int = 64  # queued jobs one backfill pass examines (Slurm's bf_max_job_test)
    node_fail_fraction: float = 0.3  # share of hardware-killed jobs that end NODE_FAIL (rest FAILED)
    resubmit_probability: float = 0.9  # a killed job is resubmitted (rest of its work, from checkpoint)
    resubmit_delay_max_s: float = 600.0  # ... 60 s to this long after it ended
    kill_delay_min_s: float = 30.0  # a killed job ends this long after the fault, at the least
    kill_delay_max_s: float = 240.0  # ... and at the most (uniform)
    repair_min_hours: float = 2.0  # a faulty node is down this long, at the least
    repair_max_hours: float = 24.0  # ... and at the most (uniform), then it reboots
    gpu_replace_probability: float = 0.5  # repair of a row-remap failure replaces the GPU (flag clears)
    app_xid_failed_probability: float = 0.65  # jobs FAILED for user reasons that log application XIDs
    app_xid_healthy_probability: float = 0.02  # other jobs that log a transient application XID
    sbe_gpu_fraction: float = 0.03  # GPUs that accumulate correctable (SBE) errors
    sbe_rate_per_day: float = 4.0  # median SBE rate of those GPUs (lognormal spread, sigma 1)
    noise_lines_per_xid: float = 3.0  # benign non-XID kernel lines per XID line of faults and jobs
    sbe_blip_gpu_fraction: float = 0.03  # GPUs that log 1 to 3 SBE errors once in the span (benign)
    maintenance_rate: float = 5.0  # maintenance reboots per 1000 node-days, of nodes without faults
    lemon_node_fraction: float = 0.015  # lemon nodes (at least one from 50 nodes); 1.2% on RSC-1
    lemon_fault_multiplier: float = 15.0  # critical fault rate of a lemon / that of a healthy node
    lemon_node_fail_fraction: float = 0.7  # jobs killed by a lemon's extra faults that end NODE_FAIL
    lemon_extra_xids_per_day: float = 3.0  # extra application XIDs per lemon node-day (while busy)
    ecc_degradation_gpu_fraction: float = 0.003  # GPUs that start degrading (SBE rate rising) per 30 days
    ecc_degradation_failure_probability: float = 0.7  # degradations ending in an uncorrectable error
    ecc_degradation_min_days: float = 2.0  # a degradation grows this long before its failure, at least
    ecc_degradation_max_days: float = 7.0  # ... and at most (uniform)
    xid_storm_rate: float = 1.0  # XID storms per 1000 node-days (only on a node running a job)
    xid_storm_kill_probability: float = 0.5  # storms that kill their job (FAILED, user-looking)
    nvlink_flapping_rate: float = 0.5  # flapping NVLink episodes per 1000 node-days
    dcgm_changed_only: bool = False  # write only DCGM series that changed since the last scrape

    def __post_init__(self) -> None:
        # Same value, same bytes: days=3 and days=3.0 must write the same truth.json.
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, item.name, float(value))
        checks = (
            (self.nodes >= 1, "nodes must be >= 1"),
            (1 <= self.gpus_per_node <= 64, "gpus_per_node must be within 1..64"),
            (self.days > 0, "days must be > 0"),
            (self.ecc_interval_minutes >= 1, "ecc_interval_minutes must be >= 1"),
            (self.hardware_failure_rate >= 0, "hardware_failure_rate must be >= 0"),
            (0 < self.target_load <= 2, "target_load must be within (0, 2]"),
            (self.timelimit_hours > 0, "timelimit_hours must be > 0"),
            (0 < self.max_job_fraction <= 1, "max_job_fraction must be within (0, 1]"),
            (self.backfill_depth >= 0, "backfill_depth must be >= 0"),
            (
                0 <= self.kill_delay_min_s <= self.kill_delay_max_s <= 300,
                "kill delay must be within 0..300 s",
            ),
            (0 < self.repair_min_hours <= self.repair_max_hours, "repair hours must be 0 < min <= max"),
            (self.resubmit_delay_max_s >= 60, "resubmit_delay_max_s must be >= 60"),
            (self.noise_lines_per_xid >= 0, "noise_lines_per_xid must be >= 0"),
            (self.sbe_rate_per_day >= 0, "sbe_rate_per_day must be >= 0"),
            (self.maintenance_rate >= 0, "maintenance_rate must be >= 0"),
            (self.lemon_fault_multiplier >= 1, "lemon_fault_multiplier must be >= 1"),
            (self.lemon_extra_xids_per_day >= 0, "lemon_extra_xids_per_day must be >= 0"),
            (
                0 < self.ecc_degradation_min_days <= self.ecc_degradation_max_days,
                "degradation days must be 0 < min <= max",
            ),
            (self.xid_storm_rate >= 0, "xid_storm_rate must be >= 0"),
            (self.nvlink_flapping_rate >= 0, "nvlink_flapping_rate must be >= 0"),
            (self.cluster.strip() != "", "cluster must not be empty"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        fractions = {
            "user_failed_fraction": self.user_failed_fraction,
            "user_cancelled_fraction": self.user_cancelled_fraction,
            "user_oom_fraction": self.user_oom_fraction,
            "user_timeout_fraction": self.user_timeout_fraction,
            "node_fail_fraction": self.node_fail_fraction,
            "resubmit_probability": self.resubmit_probability,
            "gpu_replace_probability": self.gpu_replace_probability,
            "app_xid_failed_probability": self.app_xid_failed_probability,
            "app_xid_healthy_probability": self.app_xid_healthy_probability,
            "sbe_gpu_fraction": self.sbe_gpu_fraction,
            "sbe_blip_gpu_fraction": self.sbe_blip_gpu_fraction,
            "lemon_node_fraction": self.lemon_node_fraction,
            "lemon_node_fail_fraction": self.lemon_node_fail_fraction,
            "ecc_degradation_gpu_fraction": self.ecc_degradation_gpu_fraction,
            "ecc_degradation_failure_probability": self.ecc_degradation_failure_probability,
            "xid_storm_kill_probability": self.xid_storm_kill_probability,
        }
        for name, value in fractions.items():
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be within 0..1, got {value}")
        user = self.user_failed_fraction + self.user_cancelled_fraction
        if user + self.user_oom_fraction + self.user_timeout_fraction > 1:
            raise ValueError("the user failure fractions must add up to at most 1")

    @property
    def span_ms(self) -> int:
        """Length of the simulated span in milliseconds."""
        return round(self.days * MS_PER_DAY)

    @property
    def end_ms(self) -> int:
        """End of the simulated span (epoch ms, exclusive for arrivals and faults)."""
        return self.start_ms + self.span_ms

    @property
    def ecc_interval_ms(self) -> int:
        """DCGM scrape period in milliseconds."""
        return self.ecc_interval_minutes * MS_PER_MINUTE

    @property
    def scrape_count(self) -> int:
        """Number of DCGM scrapes: at the start and every interval up to the end, inclusive."""
        return self.span_ms // self.ecc_interval_ms + 1

    @property
    def node_names(self) -> tuple[str, ...]:
        """``node0001`` ... (at least four digits, zero-padded)."""
        width = max(4, len(str(self.nodes)))
        return tuple(f"node{index + 1:0{width}d}" for index in range(self.nodes))


def pci_bus_id(gpu: int) -> str:
    """Return the canonical PCI bus id of GPU ``gpu`` of a node.

    The first eight are those of a DGX A100; a larger node continues in PCI domain 1.

    >>> pci_bus_id(3)
    '0000:4e:00'
    >>> pci_bus_id(9)
    '0001:09:00'
    """
    if gpu < len(DGX_A100_PCI_BUS_IDS):
        return DGX_A100_PCI_BUS_IDS[gpu]
    return f"0001:{gpu:02x}:00"


# ---------------------------------------------------------------------------------------------
# Output records of the model


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job that started within the span, as sacct reports it.

    Attributes
    ----------
    index
        Internal job number (submissions of the demand, then resubmissions); jobs that never
        started are not recorded.
    job_id
        Slurm job id, increasing with submit time.
    submit_ms, start_ms
        Whole seconds.
    end_ms
        Whole seconds, ``None`` while the job still runs at the end of the span.
    state
        Final state, ``RUNNING`` when ``end_ms`` is ``None``.
    cancelled_by
        Uid written as ``CANCELLED by <uid>``, ``None`` for a plain ``CANCELLED``.
    nodes
        Node indices, ascending.
    gpus
        GPUs requested (``gres/gpu``).
    fault_index
        Index in :attr:`ClusterHistory.faults` of the fault that killed the job, else ``None``.
    resubmit_of
        Job id of the hardware-killed job whose remaining work this job carries on.
    storm_index
        Index in :attr:`ClusterHistory.storms` of the XID storm that killed the job (a failure
        for user reasons), else ``None``.
    """

    index: int
    job_id: str
    name: str
    user: str
    uid: int
    submit_ms: int
    start_ms: int
    end_ms: int | None
    state: JobState
    cancelled_by: int | None
    exit_code: str
    nodes: tuple[int, ...]
    gpus: int
    process: str
    fault_index: int | None
    resubmit_of: str | None = None
    storm_index: int | None = None

    @property
    def gpus_per_node_used(self) -> int:
        """GPUs the job uses on each of its nodes (GPU indices ``0 .. n-1``)."""
        return -(-self.gpus // len(self.nodes))

    @property
    def hardware(self) -> bool:
        """True when a hardware fault killed the job and it ended within the span."""
        return self.fault_index is not None and self.end_ms is not None


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """A hardware fault planted on one GPU.

    Attributes
    ----------
    onset_ms
        Time of the first XID line (millisecond precision).
    job_index
        Index of the job running on the node at the onset, else ``None``.
    killed_job
        True when this fault killed that job (a second fault on a job that is already dying
        does not kill it again).
    repaired_ms
        When the node came back and rebooted (may lie after the span).
    gpu_replaced
        The repair replaced the GPU (clears ``ROW_REMAP_FAILURE``).
    source
        :data:`FAULT_SOURCE_BASE`, :data:`FAULT_SOURCE_LEMON` (an extra fault of a lemon node) or
        :data:`FAULT_SOURCE_ECC_DEGRADATION` (the failure ending degradation ``degradation``).
    degradation
        :attr:`~stream.simulator.planted.DegradationPlan.index` of that degradation (its
        ``deg-N`` id in the truth is ``index + 1``), else ``None``.
    """

    index: int
    kind: str
    template: str
    node: int
    gpu: int
    xids: tuple[int, ...]
    onset_ms: int
    job_index: int | None
    killed_job: bool
    repaired_ms: int
    gpu_replaced: bool
    source: str = FAULT_SOURCE_BASE
    degradation: int | None = None


@dataclass(frozen=True, slots=True)
class EccPlan:
    """What the DCGM scrapes will show; :func:`iter_ecc_scrapes` turns it into values.

    Attributes
    ----------
    scrape_ms
        Scrape times.
    events
        Counter changes, sorted by ``(ts_ms, kind, node, gpu)``.
    sbe_gpus
        Flat GPU indices (``node * gpus_per_node + gpu``) that accumulate SBE errors.
    sbe_increments
        Shape ``(len(scrape_ms), len(sbe_gpus))``: SBE errors that appear at each scrape.
    """

    scrape_ms: tuple[int, ...]
    events: tuple[EccEvent, ...]
    sbe_gpus: npt.NDArray[np.int64]
    sbe_increments: npt.NDArray[np.int64]


class EccScrape(NamedTuple):
    """Counter values of every GPU (flat index ``node * gpus_per_node + gpu``) at one scrape."""

    ts_ms: int
    sbe_volatile: npt.NDArray[np.int64]
    dbe_volatile: npt.NDArray[np.int64]
    dbe_aggregate: npt.NDArray[np.int64]
    remap_failure: npt.NDArray[np.int64]
    retired_pending: npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ClusterHistory:
    """Everything that happened on the simulated cluster within the span.

    Attributes
    ----------
    jobs
        Jobs that started, in submit order.
    faults
        Hardware faults, in onset order.
    xids
        XID kernel lines, in time order.
    kernel_lines
        Other kernel lines, in time order.
    exposure_node_ms
        Node-milliseconds of all runs, each clipped to the span's end.
    lemon_nodes
        Node indices of the lemons, ascending.
    degradations
        Degrading GPUs that showed within the span, in start order.
    storms
        XID storms that happened (on a running job), in onset order.
    flaps
        Flapping NVLink episodes, in onset order.
    maintenance
        Maintenance reboots, in time order.
    """

    config: SimulationConfig
    jobs: tuple[JobRecord, ...]
    faults: tuple[FaultRecord, ...]
    xids: tuple[XidRecord, ...]
    kernel_lines: tuple[KernelLine, ...]
    ecc: EccPlan
    exposure_node_ms: int
    lemon_nodes: tuple[int, ...] = ()
    degradations: tuple[DegradationRecord, ...] = ()
    storms: tuple[StormRecord, ...] = ()
    flaps: tuple[FlapRecord, ...] = ()
    maintenance: tuple[MaintenanceRecord, ...] = ()

    @property
    def exposure_node_days(self) -> float:
        """Exposure in node-days."""
        return self.exposure_node_ms / MS_PER_DAY

    @property
    def hardware_failures(self) -> int:
        """Jobs killed by a hardware fault that ended within the span."""
        return sum(1 for job in self.jobs if job.hardware)

    @property
    def true_rf_per_1000_node_days(self) -> float:
        """``1000 x hardware failures / exposure node-days`` (0 without exposure)."""
        days = self.exposure_node_days
        return 1000.0 * self.hardware_failures / days if days > 0 else 0.0

    @property
    def utilization(self) -> float:
        """Exposure as a share of all node-time of the span."""
        return self.exposure_node_ms / (self.config.nodes * self.config.span_ms)


# ---------------------------------------------------------------------------------------------
# Job demand


@dataclass(frozen=True, slots=True)
class _Demand:
    """Vectorised attributes of the submitted jobs."""

    nnodes: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    runtime_ms: npt.NDArray[np.int64]
    outcome: npt.NDArray[np.int64]
    user: npt.NDArray[np.int64]
    name: npt.NDArray[np.int64]
    process: npt.NDArray[np.int64]
    exit_code: npt.NDArray[np.int64]
    cancel_kind: npt.NDArray[np.float64]


def _user_count(config: SimulationConfig) -> int:
    return max(8, config.nodes // 8)


def _draw_demand(rng: np.random.Generator, count: int, config: SimulationConfig) -> _Demand:
    """Draw sizes, run times and outcomes of ``count`` jobs."""
    weights = np.array([size.weight for size in JOB_SIZE_MIX])
    size_class = rng.choice(len(JOB_SIZE_MIX), size=count, p=weights / weights.sum())
    requested = np.array([size.gpus for size in JOB_SIZE_MIX], dtype=np.int64)[size_class]
    medians = np.array([size.median_hours for size in JOB_SIZE_MIX])[size_class]
    sigmas = np.array([size.sigma for size in JOB_SIZE_MIX])[size_class]
    gpn = config.gpus_per_node
    cap = max(1, int(config.nodes * config.max_job_fraction))
    wanted_nodes = -(-requested // gpn)
    nnodes = np.minimum(wanted_nodes, cap)
    gpus = np.where(wanted_nodes > cap, nnodes * gpn, requested)

    hours = medians * np.exp(sigmas * rng.standard_normal(count))
    user_fractions = [
        config.user_failed_fraction,
        config.user_cancelled_fraction,
        config.user_oom_fraction,
        config.user_timeout_fraction,
    ]
    probabilities = np.array([1.0 - sum(user_fractions), *user_fractions])
    outcome = rng.choice(len(probabilities), size=count, p=probabilities / probabilities.sum())
    cut = rng.uniform(0.02, 1.0, size=count)
    early = (outcome == _OUT_FAILED) | (outcome == _OUT_CANCELLED) | (outcome == _OUT_OOM)
    hours = np.where(early, hours * cut, hours)
    hit_limit = hours >= config.timelimit_hours
    hours = np.minimum(hours, config.timelimit_hours)
    outcome = np.where(hit_limit, _OUT_TIMEOUT, outcome)
    runtime_ms = np.maximum(np.rint(hours * 3600.0), 30).astype(np.int64) * MS_PER_SECOND

    users = _user_count(config)
    popularity = 1.0 / np.arange(1, users + 1)
    exit_weights = np.array([weight for _, weight in _FAILED_EXIT_CODES])
    return _Demand(
        nnodes=nnodes.astype(np.int64),
        gpus=gpus.astype(np.int64),
        runtime_ms=runtime_ms,
        outcome=outcome.astype(np.int64),
        user=rng.choice(users, size=count, p=popularity / popularity.sum()).astype(np.int64),
        name=rng.integers(0, len(_JOB_NAMES), size=count, dtype=np.int64),
        process=rng.integers(0, len(_PROCESS_NAMES), size=count, dtype=np.int64),
        exit_code=rng.choice(len(exit_weights), size=count, p=exit_weights / exit_weights.sum()).astype(
            np.int64
        ),
        cancel_kind=rng.random(count),
    )


def _mean_node_ms(config: SimulationConfig) -> float:
    """Mean node-milliseconds a job requests (Monte Carlo with a fixed, seed-independent stream)."""
    sample = _draw_demand(np.random.Generator(np.random.PCG64(20_240_101)), 200_000, config)
    return float(np.mean(sample.nnodes * sample.runtime_ms))


# ---------------------------------------------------------------------------------------------
# The event-driven cluster

_FREE, _BUSY, _DOWN = 0, 1, 2
# Event kinds, in the order they are handled at the same millisecond.
_EV_REPAIR, _EV_END, _EV_FAULT, _EV_ARRIVAL, _EV_STORM = 0, 1, 2, 3, 4
_NEVER: Final = 1 << 62


class _FaultPlan(NamedTuple):
    """A critical fault to strike a node: its cause and, for a degradation, GPU and template."""

    node: int
    source: str
    gpu: int = -1  # -1: drawn at the onset among the GPUs of the running job
    template: str = ""  # "": drawn from the mix of the source
    degradation: int = -1  # DegradationPlan.index of a degradation failure


def _ceil_second(ts_ms: int) -> int:
    return -(-ts_ms // MS_PER_SECOND) * MS_PER_SECOND


class _Cluster:
    """State of the event-driven simulation: nodes, queue, running jobs, events."""

    def __init__(
        self,
        config: SimulationConfig,
        demand: _Demand,
        submit_ms: list[int],
        rng: np.random.Generator,
        fault_plans: list[_FaultPlan] | None = None,
        protected: dict[int, tuple[int, int]] | None = None,
        storm_draws: tuple[StormDraw, ...] = (),
    ) -> None:
        self.config = config
        self.rng = rng
        # Payloads of the fault events; base faults on a node in its protected window (around a
        # degradation, whose SBE counter must not be reset by a reboot) are dropped.
        self.fault_plans = fault_plans if fault_plans is not None else []
        self.protected = protected if protected is not None else {}
        self.storm_draws = storm_draws
        self.storms: list[StormRecord] = []
        self.degradation_fault: dict[int, int] = {}  # DegradationPlan.index -> fault index
        self.natural_outcome: dict[int, int] = {}  # outcome of a job before a storm doomed it
        # Job attributes, by internal job number (arrival order of the demand, then resubmissions).
        self.submit = list(submit_ms)
        self.nnodes: list[int] = demand.nnodes.tolist()
        self.gpus: list[int] = demand.gpus.tolist()
        self.runtime: list[int] = demand.runtime_ms.tolist()
        self.outcome: list[int] = demand.outcome.tolist()
        self.user: list[int] = demand.user.tolist()
        self.name: list[int] = demand.name.tolist()
        self.process: list[int] = demand.process.tolist()
        self.exit_code: list[int] = demand.exit_code.tolist()
        self.cancel_kind: list[float] = demand.cancel_kind.tolist()
        self.resubmit_of: list[int] = [-1] * len(self.submit)
        self.job_id: list[int] = [-1] * len(self.submit)  # given at submission, in submit order
        self.next_job_id = _JOB_ID_BASE
        jobs = len(self.nnodes)
        nodes = config.nodes
        self.state = [_FREE] * nodes
        self.node_job = [-1] * nodes
        self.last_end = [-_NEVER] * nodes
        self.free_heap = list(range(nodes))
        self.free_count = nodes
        self.queue: list[int] = []
        self.running: list[tuple[int, int]] = []  # (end_ms, job), sorted
        self.events: list[tuple[int, int, int, int]] = []  # (ts_ms, kind, seq, payload)
        self.seq = 0
        self.start = [-1] * jobs
        self.end = [-1] * jobs
        self.done = [False] * jobs
        self.killed_by = [-1] * jobs
        self.killed_at = [-1] * jobs
        self.resubmit_draws: list[tuple[float, float]] = [(1.0, 0.0)] * jobs
        self.storm_of = [-1] * jobs  # storm on the job (at most one)
        self.kill_state: dict[int, JobState] = {}
        self.job_nodes: list[tuple[int, ...]] = [()] * jobs
        self.faults: list[FaultRecord] = []
        self.shadow_head = -1
        self.shadow_time = 0
        self.shadow_extra = 0
        self.shadow_dirty = True
        weights = np.array([template.weight for template in HARDWARE_FAULT_TEMPLATES])
        self.template_cdf = np.cumsum(weights / weights.sum())
        lemon_weights = np.array([template.weight for template in LEMON_FAULT_TEMPLATES])
        self.lemon_cdf = np.cumsum(lemon_weights / lemon_weights.sum())

    def push(self, ts_ms: int, kind: int, payload: int) -> None:
        """Schedule an event."""
        self.seq += 1
        heapq.heappush(self.events, (ts_ms, kind, self.seq, payload))

    def run(self, end_ms: int) -> None:
        """Handle events in time order up to and including ``end_ms``."""
        handlers = {
            _EV_REPAIR: self.on_repair,
            _EV_END: self.on_end,
            _EV_FAULT: self.on_fault,
            _EV_ARRIVAL: self.on_arrival,
            _EV_STORM: self.on_storm,
        }
        while self.events and self.events[0][0] <= end_ms:
            ts_ms, kind, _, payload = heapq.heappop(self.events)
            handlers[kind](ts_ms, payload)

    # -- events --------------------------------------------------------------------------------

    def on_arrival(self, now: int, job: int) -> None:
        self.job_id[job] = self.next_job_id
        self.next_job_id += 1
        self.queue.append(job)
        self.schedule(now)

    def resubmit(self, job: int, now: int, delay_draw: float) -> None:
        """Submit the rest of a killed job's work as a new job (it restarts from a checkpoint)."""
        config = self.config
        delay_s = 60.0 + delay_draw * (config.resubmit_delay_max_s - 60.0)
        submit = _ceil_second(now + round(delay_s * MS_PER_SECOND))
        if submit >= config.end_ms:
            return
        remaining = self.start[job] + self.runtime[job] - self.killed_at[job]
        new = len(self.submit)
        self.submit.append(submit)
        copied = (self.nnodes, self.gpus, self.outcome, self.user, self.name, self.process, self.exit_code)
        for attribute in copied:
            attribute.append(attribute[job])
        self.outcome[new] = self.natural_outcome.get(job, self.outcome[new])
        self.cancel_kind.append(self.cancel_kind[job])
        self.runtime.append(max(remaining // MS_PER_SECOND * MS_PER_SECOND, MS_PER_MINUTE))  # whole seconds
        self.resubmit_of.append(job)
        self.job_id.append(-1)
        self.start.append(-1)
        self.end.append(-1)
        self.done.append(False)
        self.killed_by.append(-1)
        self.killed_at.append(-1)
        self.resubmit_draws.append((1.0, 0.0))
        self.storm_of.append(-1)
        self.job_nodes.append(())
        self.push(submit, _EV_ARRIVAL, new)

    def on_end(self, now: int, job: int) -> None:
        if self.done[job] or self.end[job] != now:
            return  # stale: the job was killed and ends at another time
        self.done[job] = True
        del self.running[bisect.bisect_left(self.running, (now, job))]
        for node in self.job_nodes[job]:
            self.node_job[node] = -1
            self.last_end[node] = now
            if self.state[node] == _BUSY:
                self.state[node] = _FREE
                heapq.heappush(self.free_heap, node)
                self.free_count += 1
        if self.killed_by[job] >= 0:
            resubmit, delay = self.resubmit_draws[job]
            if resubmit < self.config.resubmit_probability:
                self.resubmit(job, now, delay)
        self.schedule(now)

    def on_repair(self, now: int, node: int) -> None:
        self.state[node] = _FREE
        heapq.heappush(self.free_heap, node)
        self.free_count += 1
        self.shadow_dirty = True
        self.schedule(now)

    def on_fault(self, now: int, planned: int) -> None:
        config = self.config
        plan = self.fault_plans[planned]
        node = plan.node
        if self.state[node] == _DOWN:
            return  # the node is already out for repair: the fault is moot
        window = self.protected.get(node, (_NEVER, _NEVER))
        if plan.source != FAULT_SOURCE_ECC_DEGRADATION and window[0] <= now <= window[1]:
            return  # the node's degrading GPU is the fault planted there
        if now - self.last_end[node] < FAULT_QUIET_AFTER_END_MS:
            later = now + FAULT_QUIET_AFTER_END_MS
            if later < config.end_ms:
                self.push(later, _EV_FAULT, planned)
            return
        rng = self.rng
        draws = rng.random(8)  # template, gpu, kill delay, NODE_FAIL, repair, replacement, resubmission
        lemon = plan.source == FAULT_SOURCE_LEMON
        if plan.template:
            template = _TEMPLATES_BY_NAME[plan.template]
        elif lemon:
            template = LEMON_FAULT_TEMPLATES[int(np.searchsorted(self.lemon_cdf, draws[0], side="right"))]
        else:
            drawn = int(np.searchsorted(self.template_cdf, draws[0], side="right"))
            template = HARDWARE_FAULT_TEMPLATES[drawn]
        job = self.node_job[node]
        gpu_choices = -(-self.gpus[job] // self.nnodes[job]) if job >= 0 else config.gpus_per_node
        gpu = plan.gpu if plan.gpu >= 0 else min(int(draws[1] * gpu_choices), gpu_choices - 1)
        index = len(self.faults)
        killed = job >= 0 and self.killed_by[job] < 0
        if killed:
            delay = config.kill_delay_min_s + draws[2] * (config.kill_delay_max_s - config.kill_delay_min_s)
            new_end = _ceil_second(now + round(delay * MS_PER_SECOND))
            del self.running[bisect.bisect_left(self.running, (self.end[job], job))]
            self.end[job] = new_end
            bisect.insort(self.running, (new_end, job))
            self.push(new_end, _EV_END, job)
            self.killed_by[job] = index
            self.killed_at[job] = now
            self.resubmit_draws[job] = (float(draws[6]), float(draws[7]))
            node_fail = draws[3] < (config.lemon_node_fail_fraction if lemon else config.node_fail_fraction)
            self.kill_state[job] = JobState.NODE_FAIL if node_fail else JobState.FAILED
        if job < 0:
            self.free_count -= 1  # it stays in the free heap: skipped when popped
        self.state[node] = _DOWN
        hours = config.repair_min_hours + draws[4] * (config.repair_max_hours - config.repair_min_hours)
        repaired = _ceil_second(now + round(hours * MS_PER_HOUR))
        self.push(repaired, _EV_REPAIR, node)
        self.faults.append(
            FaultRecord(
                index=index,
                kind=FAULT_KIND_CRITICAL_HW,
                template=template.name,
                node=node,
                gpu=gpu,
                xids=template.xids,
                onset_ms=now,
                job_index=job if job >= 0 else None,
                killed_job=killed,
                repaired_ms=repaired,
                gpu_replaced=bool(template.remap_failure and draws[5] < config.gpu_replace_probability),
                source=plan.source,
                degradation=plan.degradation if plan.degradation >= 0 else None,
            )
        )
        if plan.degradation >= 0:
            self.degradation_fault[plan.degradation] = index
        self.shadow_dirty = True

    def on_storm(self, now: int, index: int) -> None:
        """An XID storm on a GPU of the job running on the node (none on an idle node)."""
        draw = self.storm_draws[index]
        node = draw.node
        job = self.node_job[node]
        if job < 0 or self.state[node] != _BUSY or self.killed_by[job] >= 0 or self.storm_of[job] >= 0:
            return
        last = storm_window(draw, now, self.end[job])
        if last is None:
            return
        config = self.config
        used = -(-self.gpus[job] // self.nnodes[job])
        gpu = min(int(draw.gpu_draw * used), used - 1)
        if draw.kill:
            # The job dies of its own errors shortly after the last line: FAILED, for user reasons.
            spread = config.kill_delay_max_s - config.kill_delay_min_s
            delay = config.kill_delay_min_s + draw.delay_draw * spread
            new_end = _ceil_second(last + round(delay * MS_PER_SECOND))
            del self.running[bisect.bisect_left(self.running, (self.end[job], job))]
            self.end[job] = new_end
            bisect.insort(self.running, (new_end, job))
            self.push(new_end, _EV_END, job)
            self.natural_outcome[job] = self.outcome[job]
            self.outcome[job] = _OUT_FAILED
            self.shadow_dirty = True
        self.storm_of[job] = len(self.storms)
        self.storms.append(
            StormRecord(len(self.storms), node, gpu, draw.xid, draw.lines, job, now, last, draw.kill)
        )

    # -- scheduling ----------------------------------------------------------------------------

    def start_job(self, job: int, now: int) -> None:
        taken: list[int] = []
        need = self.nnodes[job]
        while len(taken) < need:
            node = heapq.heappop(self.free_heap)
            if self.state[node] != _FREE:
                continue  # stale heap entry (the node went down, or was pushed twice)
            self.state[node] = _BUSY
            self.node_job[node] = job
            taken.append(node)
        self.free_count -= need
        taken.sort()
        self.job_nodes[job] = tuple(taken)
        self.start[job] = now
        end = now + self.runtime[job]
        self.end[job] = end
        bisect.insort(self.running, (end, job))
        self.push(end, _EV_END, job)

    def compute_shadow(self, head: int) -> None:
        """Reservation of the blocked head: when enough nodes free up, and how many spare."""
        need = self.nnodes[head] - self.free_count
        freed = 0
        self.shadow_time, self.shadow_extra = _NEVER, 0
        for end, job in self.running:
            freed += sum(1 for node in self.job_nodes[job] if self.state[node] == _BUSY)
            if freed >= need:
                self.shadow_time, self.shadow_extra = end, freed - need
                break
        self.shadow_head = head
        self.shadow_dirty = False

    def schedule(self, now: int) -> None:
        queue = self.queue
        started = 0
        while started < len(queue) and self.nnodes[queue[started]] <= self.free_count:
            self.start_job(queue[started], now)
            started += 1
        if started:
            del queue[:started]
        if not queue or self.free_count == 0 or self.config.backfill_depth == 0:
            return
        head = queue[0]
        if self.shadow_dirty or self.shadow_head != head:
            self.compute_shadow(head)
        picked: list[int] = []
        for position in range(1, min(len(queue), self.config.backfill_depth + 1)):
            job = queue[position]
            size = self.nnodes[job]
            if size > self.free_count:
                continue
            before_shadow = now + self.runtime[job] <= self.shadow_time
            if before_shadow or size <= self.shadow_extra:
                self.start_job(job, now)
                picked.append(position)
                if not before_shadow:
                    self.shadow_extra -= size
                if self.free_count == 0:
                    break
        for position in reversed(picked):
            del queue[position]


# ---------------------------------------------------------------------------------------------
# The model


def run_model(config: SimulationConfig) -> ClusterHistory:
    """Simulate the cluster over the span described by ``config``.

    Parameters
    ----------
    config
        The cluster, span, seed and model knobs.

    Returns
    -------
    ClusterHistory
        Jobs, faults, planted anomalies, kernel lines and ECC plan; the same config gives an
        equal history.
    """
    streams = [np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(config.seed).spawn(16)]
    rng_jobs, rng_faults, rng_sched, rng_xids, rng_ecc, rng_noise = streams[:6]
    rng_lemons, rng_lemon_faults, rng_degrade, rng_degrade_sbe, rng_storms, rng_storm_lines = streams[6:12]
    rng_flaps, rng_maintenance, rng_blips, rng_lemon_xids = streams[12:]
    start, span = config.start_ms, config.span_ms
    days = span / MS_PER_DAY

    # Arrivals: a Poisson process whose offered load is target_load of the cluster.
    rate_per_ms = config.target_load * config.nodes / _mean_node_ms(config)
    count = int(rng_jobs.poisson(rate_per_ms * span))
    arrivals = np.sort(rng_jobs.integers(0, span // MS_PER_SECOND, size=count)) * MS_PER_SECOND + start
    demand = _draw_demand(rng_jobs, count, config)

    # Critical faults: per node Poisson over wall time (uniform times and nodes), lemons' extra
    # faults, and the failures of degrading GPUs; together hardware_failure_rate cluster-wide.
    lemons = choose_lemons(config, rng_lemons)
    rates = fault_rates(config, len(lemons))
    degrading = plan_degradations(config, lemons, rng_degrade)
    plans: list[_FaultPlan] = []
    onsets: list[int] = []
    fault_count = int(rng_faults.poisson(rates.healthy / 1000.0 * config.nodes * days))
    onsets += np.sort(rng_faults.integers(start, start + span, size=fault_count)).tolist()
    base_nodes = rng_faults.integers(0, config.nodes, size=fault_count).tolist()
    plans += [_FaultPlan(node, FAULT_SOURCE_BASE) for node in base_nodes]
    if lemons:
        extra = int(rng_lemon_faults.poisson(rates.lemon_extra / 1000.0 * len(lemons) * days))
        onsets += np.sort(rng_lemon_faults.integers(start, start + span, size=extra)).tolist()
        picks = rng_lemon_faults.integers(0, len(lemons), size=extra).tolist()
        plans += [_FaultPlan(lemons[pick], FAULT_SOURCE_LEMON) for pick in picks]
    protected: dict[int, tuple[int, int]] = {}
    margin = round(config.repair_max_hours * MS_PER_HOUR) + MS_PER_HOUR
    for plan in degrading:
        last = plan.failure_ms if plan.failure_ms is not None else config.end_ms
        protected[plan.node] = (plan.start_ms - margin, last + MS_PER_HOUR)
        if plan.failure_ms is not None:
            onsets.append(plan.failure_ms)
            plans.append(
                _FaultPlan(plan.node, FAULT_SOURCE_ECC_DEGRADATION, plan.gpu, plan.template, plan.index)
            )
    storm_draws = plan_storms(config, rng_storms)

    cluster = _Cluster(config, demand, arrivals.tolist(), rng_sched, plans, protected, storm_draws)
    for job, ts_ms in enumerate(arrivals.tolist()):
        cluster.push(ts_ms, _EV_ARRIVAL, job)
    for planned, ts_ms in enumerate(onsets):
        cluster.push(ts_ms, _EV_FAULT, planned)
    for index, draw in enumerate(storm_draws):
        cluster.push(draw.ts_ms, _EV_STORM, index)
    cluster.run(config.end_ms)

    jobs = _job_records(cluster)
    faults = tuple(cluster.faults)
    by_index = {job.index: job for job in jobs}

    storms, storm_xids = _storm_evidence(config, cluster, by_index, rng_storm_lines)
    flaps, flap_xids = plan_flapping(config, rng_flaps)
    scrapes = tuple(config.start_ms + k * config.ecc_interval_ms for k in range(config.scrape_count))
    ecc_events: list[EccEvent] = []
    degradations: list[DegradationRecord] = []
    for plan in degrading:
        fault_index = cluster.degradation_fault.get(plan.index)
        failure = faults[fault_index].onset_ms if fault_index is not None else None
        record = degradation_record(plan, failure, fault_index, scrapes, rng_degrade_sbe, ecc_events)
        if record is not None:
            degradations.append(record)
    faulty = {fault.node for fault in faults} | set(lemons) | {plan.node for plan in degrading}
    faulty |= {storm.node for storm in storms} | {flap.node for flap in flaps}
    maintenance = plan_maintenance(config, jobs, faulty, rng_maintenance)
    degrading_gpus = {plan.node * config.gpus_per_node + plan.gpu for plan in degrading}
    ecc_events += plan_sbe_blips(config, degrading_gpus, rng_blips)
    ecc_events += [EccEvent(item.ts_ms, EccEventKind.REBOOT, item.node, -1) for item in maintenance]

    xids, kernel_lines = _kernel_events(
        config,
        jobs,
        by_index,
        faults,
        rng_xids,
        rng_noise,
        planted=[*storm_xids, *flap_xids, *lemon_xids(config, lemons, jobs, rng_lemon_xids)],
        maintenance=maintenance,
    )
    exposure = sum(
        len(job.nodes)
        * (min(job.end_ms if job.end_ms is not None else config.end_ms, config.end_ms) - job.start_ms)
        for job in jobs
    )
    return ClusterHistory(
        config=config,
        jobs=jobs,
        faults=faults,
        xids=xids,
        kernel_lines=kernel_lines,
        ecc=_ecc_plan(config, faults, rng_ecc, ecc_events, degrading_gpus),
        exposure_node_ms=exposure,
        lemon_nodes=lemons,
        degradations=tuple(degradations),
        storms=storms,
        flaps=flaps,
        maintenance=maintenance,
    )


def _storm_evidence(
    config: SimulationConfig, cluster: _Cluster, by_index: dict[int, JobRecord], rng: np.random.Generator
) -> tuple[tuple[StormRecord, ...], list[XidRecord]]:
    """Lines of the storms that happened, and the storms as logged (cut at the job's end)."""
    records: list[StormRecord] = []
    lines: list[XidRecord] = []
    for storm in cluster.storms:
        job = by_index[storm.job_index]
        until = min(job.end_ms if job.end_ms is not None else config.end_ms, config.end_ms)
        logged = storm_lines(storm, until, job_pid(job.index, storm.node), job.process, rng)
        lines += logged
        records.append(
            dataclasses.replace(
                storm,
                lines=len(logged),
                end_ms=logged[-1].ts_us // 1000,
                killed_job=job.storm_index == storm.index,
            )
        )
    return tuple(records), lines


def _job_records(cluster: _Cluster) -> tuple[JobRecord, ...]:
    """Records of the jobs that started, in submit (= job id) order."""
    records: list[JobRecord] = []
    for job, started in enumerate(cluster.start):
        if started < 0:
            continue
        uid = _FIRST_UID + cluster.user[job]
        cancelled_by: int | None = None
        end: int | None = cluster.end[job] if cluster.done[job] else None
        fault = cluster.killed_by[job]
        failed_exit = _FAILED_EXIT_CODES[cluster.exit_code[job]][0]
        if end is None:
            state, exit_code = JobState.RUNNING, "0:0"
        elif fault >= 0:
            state = cluster.kill_state[job]
            exit_code = failed_exit if state is JobState.FAILED else "0:0"
        else:
            state = _OUTCOME_STATES[cluster.outcome[job]]
            exit_code = {JobState.FAILED: failed_exit, JobState.OUT_OF_MEMORY: "0:125"}.get(state, "0:0")
            cancel_kind = cluster.cancel_kind[job]
            if state is JobState.CANCELLED and cancel_kind < 0.85:
                cancelled_by = _ADMIN_UID if cancel_kind < 0.10 else uid
        previous = cluster.resubmit_of[job]
        storm = cluster.storm_of[job]
        storm_killed = storm >= 0 and fault < 0 and end is not None and cluster.storms[storm].killed_job
        records.append(
            JobRecord(
                index=job,
                job_id=str(cluster.job_id[job]),
                name=_JOB_NAMES[cluster.name[job]],
                user=f"user{cluster.user[job] + 1:03d}",
                uid=uid,
                submit_ms=cluster.submit[job],
                start_ms=started,
                end_ms=end,
                state=state,
                cancelled_by=cancelled_by,
                exit_code=exit_code,
                nodes=cluster.job_nodes[job],
                gpus=cluster.gpus[job],
                process=_PROCESS_NAMES[cluster.process[job]],
                fault_index=fault if fault >= 0 else None,
                resubmit_of=str(cluster.job_id[previous]) if previous >= 0 else None,
                storm_index=storm if storm_killed else None,
            )
        )
    records.sort(key=lambda record: int(record.job_id))
    return tuple(records)


def _pick(rng: np.random.Generator, mix: tuple[tuple[int, float], ...]) -> int:
    weights = np.array([weight for _, weight in mix])
    return mix[int(rng.choice(len(mix), p=weights / weights.sum()))][0]


def _kernel_events(
    config: SimulationConfig,
    jobs: tuple[JobRecord, ...],
    by_index: dict[int, JobRecord],
    faults: tuple[FaultRecord, ...],
    rng: np.random.Generator,
    rng_noise: np.random.Generator,
    *,
    planted: list[XidRecord],
    maintenance: tuple[MaintenanceRecord, ...],
) -> tuple[tuple[XidRecord, ...], tuple[KernelLine, ...]]:
    """XID lines of faults and jobs, boot lines of repairs and maintenance, and kernel noise.

    The noise lines scale with the XIDs of faults and jobs only: the ``planted`` XID lines
    (storms, flapping links, lemons' extra XIDs) are added as they are and make the rest of the
    kernel no chattier.
    """
    xids: list[XidRecord] = []
    lines: list[KernelLine] = []
    end_ms = config.end_ms

    for fault in faults:
        job = by_index[fault.job_index] if fault.job_index is not None else None
        # A degrading GPU may fail outside the GPUs its node's job uses: no process then.
        own = job is not None and fault.gpu < job.gpus_per_node_used
        pid = job_pid(job.index, fault.node) if job is not None and own else None
        process = job.process if job is not None and own else ""
        ts_ms = fault.onset_ms
        onset_us = line_us(ts_ms, rng)
        lines.append(KernelLine(onset_us, fault.node, KernelLineKind.GPU_AT, fault.gpu, 0))
        xids.append(XidRecord(onset_us, fault.node, fault.gpu, fault.xids[0], pid, process))
        for code in fault.xids[1:]:
            ts_ms += int(rng.integers(500, 3000))
            if ts_ms < end_ms:
                xids.append(XidRecord(line_us(ts_ms, rng), fault.node, fault.gpu, code, pid, process))
        if fault.repaired_ms + 6 * MS_PER_SECOND < end_ms:
            boot_us = (fault.repaired_ms + 5 * MS_PER_SECOND) * 1000
            lines.append(KernelLine(boot_us, fault.node, KernelLineKind.BOOT_DRIVER, 0, 0))
            lines.append(KernelLine(boot_us + 211_000, fault.node, KernelLineKind.BOOT_NVLINK, 0, 0))
    for reboot in maintenance:
        boot_us = (reboot.ts_ms + 5 * MS_PER_SECOND) * 1000
        lines.append(KernelLine(boot_us, reboot.node, KernelLineKind.BOOT_DRIVER, 0, 0))
        lines.append(KernelLine(boot_us + 211_000, reboot.node, KernelLineKind.BOOT_NVLINK, 0, 0))

    app_codes = tuple(code for code, _ in _APP_XID_MIX)
    for job in jobs:
        draw = float(rng.random())
        used = job.gpus_per_node_used
        if job.end_ms is None:
            if draw < config.app_xid_healthy_probability:
                _transient(job, config.end_ms, used, rng, xids)
        elif job.fault_index is not None:
            fault = faults[job.fault_index]
            if draw < _CLEANUP_XID_PROBABILITY and used > 1 and fault.killed_job:
                others = [gpu for gpu in range(used) if gpu != fault.gpu]
                chosen = rng.choice(others, size=min(len(others), int(rng.integers(1, 4))), replace=False)
                pid = job_pid(job.index, fault.node)
                for gpu in sorted(int(value) for value in chosen):
                    ts_ms = fault.onset_ms + int(rng.integers(1_000, 20_000))
                    if ts_ms < min(job.end_ms, end_ms):
                        xids.append(XidRecord(line_us(ts_ms, rng), fault.node, gpu, 45, pid, job.process))
        elif job.storm_index is not None:
            pass  # killed by its XID storm: the storm's lines are its failure burst
        elif job.state is JobState.COMPLETED:
            if draw < config.app_xid_healthy_probability:
                _transient(job, job.end_ms, used, rng, xids)
        else:
            probability = _APP_XID_STATE_PROBABILITY.get(job.state, config.app_xid_failed_probability)
            if draw < probability:
                code = _pick(rng, _APP_XID_MIX) if job.state is JobState.FAILED else 45
                if job.state is JobState.OUT_OF_MEMORY:
                    code = app_codes[int(rng.integers(0, 2))]  # 13 or 31
                _failure_burst(job, code, used, rng, xids)

    noise = round(config.noise_lines_per_xid * len(xids))
    xids += planted
    xids.sort(key=_xid_order)
    if noise:
        times = rng_noise.integers(config.start_ms * 1000, end_ms * 1000, size=noise)
        nodes = rng_noise.integers(0, config.nodes, size=noise)
        templates = rng_noise.integers(0, 1 << 16, size=noise)
        variants = rng_noise.integers(0, 1 << 31, size=noise)
        lines.extend(
            KernelLine(ts_us, node, KernelLineKind.NOISE, template, variant)
            for ts_us, node, template, variant in zip(
                times.tolist(), nodes.tolist(), templates.tolist(), variants.tolist(), strict=True
            )
        )
    lines.sort()
    return tuple(xids), tuple(lines)


def _xid_order(record: XidRecord) -> tuple[int, int, int, int, int, str]:
    """Sort key of XID lines (an unknown pid sorts first)."""
    pid = -1 if record.pid is None else record.pid
    return (record.ts_us, record.node, record.gpu, record.xid, pid, record.process)


def _failure_burst(
    job: JobRecord, code: int, used: int, rng: np.random.Generator, out: list[XidRecord]
) -> None:
    """Application XIDs on some GPUs of some nodes of a failing job, minutes before its end."""
    assert job.end_ms is not None
    node_count = int(rng.integers(1, min(len(job.nodes), 3) + 1))
    nodes = sorted(int(node) for node in rng.choice(job.nodes, size=node_count, replace=False))
    unknown_pid = rng.random() < 0.1
    for node in nodes:
        gpu_count = int(rng.integers(1, min(used, 3) + 1))
        gpus = sorted(int(gpu) for gpu in rng.choice(used, size=gpu_count, replace=False))
        base = max(job.end_ms - int(rng.integers(15_000, 8 * MS_PER_MINUTE)), job.start_ms + MS_PER_SECOND)
        pid = None if unknown_pid else job_pid(job.index, node)
        for gpu in gpus:
            ts_ms = base
            for _ in range(int(rng.integers(1, 4))):
                if ts_ms >= job.end_ms:
                    break
                out.append(XidRecord(line_us(ts_ms, rng), node, gpu, code, pid, job.process))
                ts_ms += int(rng.integers(1, 2_000))


def _transient(
    job: JobRecord, until_ms: int, used: int, rng: np.random.Generator, out: list[XidRecord]
) -> None:
    """One application XID during a run that goes on (or completes) regardless."""
    if until_ms - job.start_ms < 2 * MS_PER_SECOND:
        return
    node = job.nodes[int(rng.integers(0, len(job.nodes)))]
    gpu = int(rng.integers(0, used))
    ts_ms = int(rng.integers(job.start_ms + MS_PER_SECOND, until_ms))
    code = _pick(rng, _TRANSIENT_XID_MIX)
    out.append(XidRecord(line_us(ts_ms, rng), node, gpu, code, job_pid(job.index, node), job.process))


def _ecc_plan(
    config: SimulationConfig,
    faults: tuple[FaultRecord, ...],
    rng: np.random.Generator,
    planted: list[EccEvent],
    degrading: set[int],
) -> EccPlan:
    """Counter events of the faults and repairs, plus the ``planted`` ones (degradations, SBE
    blips, maintenance reboots), and the steady SBE accumulators (never a ``degrading`` GPU, so
    that a degradation's onset is the first rise of its counter)."""
    scrapes = tuple(config.start_ms + k * config.ecc_interval_ms for k in range(config.scrape_count))
    events: list[EccEvent] = list(planted)
    for fault in faults:
        template = _TEMPLATES_BY_NAME[fault.template]
        if template.dbe:
            events.append(EccEvent(fault.onset_ms, EccEventKind.DBE, fault.node, fault.gpu))
        if template.retire_pending:
            events.append(EccEvent(fault.onset_ms, EccEventKind.RETIRE_PENDING, fault.node, fault.gpu))
        if template.remap_failure:
            events.append(EccEvent(fault.onset_ms, EccEventKind.REMAP_FAILURE, fault.node, fault.gpu))
        if fault.repaired_ms <= config.end_ms:
            events.append(EccEvent(fault.repaired_ms, EccEventKind.REBOOT, fault.node, -1))
            if fault.gpu_replaced:
                events.append(EccEvent(fault.repaired_ms, EccEventKind.GPU_REPLACED, fault.node, fault.gpu))
    events.sort()
    total = config.nodes * config.gpus_per_node
    pool = np.setdiff1d(np.arange(total, dtype=np.int64), np.array(sorted(degrading), dtype=np.int64))
    chosen = rng.choice(pool, size=min(len(pool), round(config.sbe_gpu_fraction * total)), replace=False)
    sbe_gpus = np.sort(chosen).astype(np.int64)
    rates = config.sbe_rate_per_day * np.exp(rng.standard_normal(len(sbe_gpus)))
    per_scrape = rates * config.ecc_interval_ms / MS_PER_DAY
    increments = rng.poisson(np.broadcast_to(per_scrape, (len(scrapes), len(sbe_gpus)))).astype(np.int64)
    return EccPlan(scrape_ms=scrapes, events=tuple(events), sbe_gpus=sbe_gpus, sbe_increments=increments)


def iter_ecc_scrapes(history: ClusterHistory) -> Iterator[EccScrape]:
    """Yield the counter values of every GPU at each scrape, in time order.

    A counter event at ``t`` shows from the first scrape at or after ``t``. A reboot zeroes the
    node's volatile counters and pending-retirement flags; the aggregate DBE counter never
    decreases, and ``ROW_REMAP_FAILURE`` clears only when the repair replaced the GPU. SBE
    events (degrading GPUs, one-off blips) apply in time order with the others; the errors of the
    steady accumulators of an interval appear at its closing scrape, after any reboot within it.

    Each yielded scrape holds fresh arrays the caller may keep.
    """
    config = history.config
    gpn = config.gpus_per_node
    total = config.nodes * gpn
    sbe_volatile = np.zeros(total, dtype=np.int64)
    dbe_volatile = np.zeros(total, dtype=np.int64)
    dbe_aggregate = np.zeros(total, dtype=np.int64)
    remap_failure = np.zeros(total, dtype=np.int64)
    retired_pending = np.zeros(total, dtype=np.int64)
    plan = history.ecc
    events = plan.events
    position = 0
    for k, ts_ms in enumerate(plan.scrape_ms):
        while position < len(events) and events[position].ts_ms <= ts_ms:
            event = events[position]
            position += 1
            flat = event.node * gpn + event.gpu
            if event.kind == EccEventKind.DBE:
                dbe_volatile[flat] += 1
                dbe_aggregate[flat] += 1
            elif event.kind == EccEventKind.RETIRE_PENDING:
                retired_pending[flat] = 1
            elif event.kind == EccEventKind.REMAP_FAILURE:
                remap_failure[flat] = 1
            elif event.kind == EccEventKind.REBOOT:
                node_gpus = slice(event.node * gpn, (event.node + 1) * gpn)
                sbe_volatile[node_gpus] = 0
                dbe_volatile[node_gpus] = 0
                retired_pending[node_gpus] = 0
            elif event.kind == EccEventKind.GPU_REPLACED:
                remap_failure[flat] = 0
            elif event.kind == EccEventKind.SBE:
                sbe_volatile[flat] += event.errors
        sbe_volatile[plan.sbe_gpus] += plan.sbe_increments[k]
        yield EccScrape(
            ts_ms=ts_ms,
            sbe_volatile=sbe_volatile.copy(),
            dbe_volatile=dbe_volatile.copy(),
            dbe_aggregate=dbe_aggregate.copy(),
            remap_failure=remap_failure.copy(),
            retired_pending=retired_pending.copy(),
        )
