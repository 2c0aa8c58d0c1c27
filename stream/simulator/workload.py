"""The workload of the simulated cluster: the jobs users submit, and the records of those that ran.

Jobs arrive with sizes from a heavy-tailed mix (most need 1 to 8 GPUs, some 16 to 256, a few 512
to 4096) and lognormal durations; about a quarter end FAILED, CANCELLED, OUT_OF_MEMORY or TIMEOUT
for user reasons. :func:`draw_demand` draws those attributes for every submission at once;
:class:`stream.simulator.scheduler.Cluster` runs the jobs and turns each one that started into a
:class:`JobRecord`, the form the rest of the package (planted faults, kernel lines, writers,
truth) reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from schemas.records import JobState
from stream.simulator.config import SECOND_MS, SimulationConfig

__all__ = [
    "ADMIN_UID",
    "FAILED_EXIT_CODES",
    "FIRST_UID",
    "JOB_ID_BASE",
    "JOB_NAMES",
    "JOB_SIZE_MIX",
    "OUTCOME_STATES",
    "PROCESS_NAMES",
    "Demand",
    "JobOutcome",
    "JobRecord",
    "JobSizeClass",
    "draw_demand",
    "jobs_by_node",
    "mean_node_ms",
    "user_count",
]


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

#: Job names (``JobName`` of sacct), drawn uniformly.
JOB_NAMES: Final[tuple[str, ...]] = (
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
#: Names of a job's training process, as the kernel logs them with its XIDs.
PROCESS_NAMES: Final[tuple[str, ...]] = ("python", "python3", "pt_main_thread")
#: Exit codes of a job that ends FAILED, with their shares.
FAILED_EXIT_CODES: Final[tuple[tuple[str, float], ...]] = (
    ("1:0", 0.70),
    ("0:9", 0.08),
    ("2:0", 0.06),
    ("127:0", 0.04),
    ("0:6", 0.06),
    ("255:0", 0.06),
)
#: Slurm job id of the first submission; later ones count up in submit order.
JOB_ID_BASE: Final = 4_200_001
#: Uid of ``user001``; ``userNNN`` has uid ``FIRST_UID + NNN - 1``.
FIRST_UID: Final = 10_001
#: Uid of the admin who cancels some jobs (``CANCELLED by 0``).
ADMIN_UID: Final = 0


class JobOutcome:
    """Drawn outcome of a job, before faults and the time limit (an index of :data:`OUTCOME_STATES`)."""

    COMPLETED: Final = 0
    FAILED: Final = 1
    CANCELLED: Final = 2
    OUT_OF_MEMORY: Final = 3
    TIMEOUT: Final = 4


#: Final state of a job by its :class:`JobOutcome`, when no fault killed it.
OUTCOME_STATES: Final[tuple[JobState, ...]] = (
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.OUT_OF_MEMORY,
    JobState.TIMEOUT,
)


# ---------------------------------------------------------------------------------------------
# Jobs that ran


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
        Index in :attr:`~stream.simulator.history.ClusterHistory.faults` of the fault that killed
        the job, else ``None``.
    resubmit_of
        Job id of the hardware-killed job whose remaining work this job carries on.
    storm_index
        Index in :attr:`~stream.simulator.history.ClusterHistory.storms` of the XID storm that
        killed the job (a failure for user reasons), else ``None``.
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


def jobs_by_node(jobs: Sequence[JobRecord], nodes: set[int]) -> dict[int, list[JobRecord]]:
    """Jobs of each of ``nodes``, by start time."""
    by_node: dict[int, list[JobRecord]] = {node: [] for node in nodes}
    for job in jobs:
        for node in job.nodes:
            if node in by_node:
                by_node[node].append(job)
    for runs in by_node.values():
        runs.sort(key=lambda job: job.start_ms)
    return by_node


# ---------------------------------------------------------------------------------------------
# Job demand


@dataclass(frozen=True, slots=True)
class Demand:
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


def user_count(config: SimulationConfig) -> int:
    """Number of users of the cluster: one per eight nodes, at least eight."""
    return max(8, config.nodes // 8)


def draw_demand(rng: np.random.Generator, count: int, config: SimulationConfig) -> Demand:
    """Draw sizes, run times and outcomes of ``count`` jobs.

    Parameters
    ----------
    rng
        The stream to draw from (in a fixed order: same stream state, same demand).
    count
        Number of jobs.
    config
        The cluster (size, GPUs per node, largest job), time limit and user failure fractions.

    Returns
    -------
    Demand
        One entry per job in each array.
    """
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
    early = (
        (outcome == JobOutcome.FAILED)
        | (outcome == JobOutcome.CANCELLED)
        | (outcome == JobOutcome.OUT_OF_MEMORY)
    )
    hours = np.where(early, hours * cut, hours)
    hit_limit = hours >= config.timelimit_hours
    hours = np.minimum(hours, config.timelimit_hours)
    outcome = np.where(hit_limit, JobOutcome.TIMEOUT, outcome)
    runtime_ms = np.maximum(np.rint(hours * 3600.0), 30).astype(np.int64) * SECOND_MS

    users = user_count(config)
    popularity = 1.0 / np.arange(1, users + 1)
    exit_weights = np.array([weight for _, weight in FAILED_EXIT_CODES])
    return Demand(
        nnodes=nnodes.astype(np.int64),
        gpus=gpus.astype(np.int64),
        runtime_ms=runtime_ms,
        outcome=outcome.astype(np.int64),
        user=rng.choice(users, size=count, p=popularity / popularity.sum()).astype(np.int64),
        name=rng.integers(0, len(JOB_NAMES), size=count, dtype=np.int64),
        process=rng.integers(0, len(PROCESS_NAMES), size=count, dtype=np.int64),
        exit_code=rng.choice(len(exit_weights), size=count, p=exit_weights / exit_weights.sum()).astype(
            np.int64
        ),
        cancel_kind=rng.random(count),
    )


def mean_node_ms(config: SimulationConfig) -> float:
    """Mean node-milliseconds a job requests (Monte Carlo with a fixed, seed-independent stream)."""
    sample = draw_demand(np.random.Generator(np.random.PCG64(20_240_101)), 200_000, config)
    return float(np.mean(sample.nnodes * sample.runtime_ms))
