"""XID storms: a burst of XIDs from one GPU of a running job, the job's or the GPU's.

``job_xid_storm``
    Forty to four hundred application XIDs (13, 31 or 43) from one GPU of a running job, over
    20 minutes to 3 hours (the defaults of ``xid_storm_lines_*`` and ``xid_storm_minutes_*``),
    logged by the job's own process: the job's crash loop, no fault of the GPU (job-aware
    verdicts: it is told to the job's owner, never a node verdict). The job may die of it, a
    user-looking failure (not hardware).
``xid_storm``
    The same burst from a faulty GPU (a share ``xid_storm_gpu_fraction`` of the storms): the
    hardware-class XID 92 (high single-bit ECC error rate, no process named), whatever job runs
    there; the job lives on. A GPU storm for the node's operators.

A storm drawn on an idle node does not happen, so about ``utilization x xid_storm_rate`` happen.

:func:`plan_storms` draws them before the cluster runs; the cluster
(:mod:`stream.simulator.scheduler`) decides with :func:`storm_window` whether each happens and
records a :class:`StormRecord`; :func:`storm_evidence` writes the lines of those that happened.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import numpy as np

from schemas.timeutil import MINUTE_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.events import XidRecord, job_pid, line_us
from stream.simulator.workload import JobRecord

__all__ = [
    "FAULT_KIND_JOB_XID_STORM",
    "FAULT_KIND_XID_STORM",
    "GPU_STORM_XIDS",
    "STORM_XIDS",
    "StormDraw",
    "StormRecord",
    "plan_storms",
    "storm_evidence",
    "storm_lines",
    "storm_window",
]

FAULT_KIND_XID_STORM: Final = "xid_storm"
FAULT_KIND_JOB_XID_STORM: Final = "job_xid_storm"

#: Application XIDs a job's storm repeats (one code per storm).
STORM_XIDS: Final[tuple[int, ...]] = (13, 31, 43)
#: Hardware-class XIDs a faulty GPU's storm repeats: 92, high single-bit ECC error rate (warn, no
#: job evidence: it kills no job and explains no job's failure).
GPU_STORM_XIDS: Final[tuple[int, ...]] = (92,)

# A storm shorter than this (as drawn) still needs this much of its job's run.
_STORM_MIN_MS: Final = 20 * MINUTE_MS
# A storm needs this much of its job's run left, and stops this long before the job's end.
_STORM_MARGIN_MS: Final = 5 * MINUTE_MS


class StormDraw(NamedTuple):
    """Random draws of one XID storm, before the cluster decides whether and where it happens."""

    ts_ms: int
    node: int
    duration_ms: int
    lines: int
    xid: int
    kill: bool
    gpu_draw: float
    delay_draw: float
    gpu_fault: bool = False  # the GPU's storm (hardware XIDs), not the job's


@dataclass(frozen=True, slots=True)
class StormRecord:
    """An XID storm on one GPU of a running job.

    Attributes
    ----------
    lines
        Number of lines (as planned, then as logged).
    start_ms, end_ms
        First and last line (as planned, then as logged: a hardware fault that kills the job
        during the storm cuts it short).
    killed_job
        The storm killed the job (FAILED, for user reasons) shortly after its last line.
    gpu_fault
        The GPU's storm (hardware-class XIDs, no process), not the job's.
    """

    index: int
    node: int
    gpu: int
    xid: int
    lines: int
    job_index: int
    start_ms: int
    end_ms: int
    killed_job: bool
    gpu_fault: bool = False

    @property
    def kind(self) -> str:
        """The truth kind: :data:`FAULT_KIND_XID_STORM` (the GPU's) or
        :data:`FAULT_KIND_JOB_XID_STORM` (the job's)."""
        return FAULT_KIND_XID_STORM if self.gpu_fault else FAULT_KIND_JOB_XID_STORM


def plan_storms(config: SimulationConfig, rng: np.random.Generator) -> tuple[StormDraw, ...]:
    """Draw the XID storms: ``xid_storm_rate`` per 1000 node-days, uniform times and nodes.

    A storm only happens on a node that runs a job at that time (decided by the cluster). A share
    ``xid_storm_gpu_fraction`` of them are the GPU's: they repeat a code of
    :data:`GPU_STORM_XIDS` and kill no job (drawn after everything else, only when the share is
    not 0, so that a configuration without GPU storms draws what it drew before they existed).

    Returns
    -------
    tuple[StormDraw, ...]
        In time order.
    """
    count = int(rng.poisson(config.xid_storm_rate / 1000.0 * config.nodes * config.days))
    times = np.sort(rng.integers(config.start_ms, config.end_ms, size=count))
    nodes = rng.integers(0, config.nodes, size=count)
    shortest = round(config.xid_storm_minutes_min * MINUTE_MS)
    longest = round(config.xid_storm_minutes_max * MINUTE_MS)
    durations = rng.integers(shortest, longest + 1, size=count)
    low, high = config.xid_storm_lines_min, config.xid_storm_lines_max
    lines = np.rint(np.exp(rng.uniform(math.log(low), math.log(high), size=count))).astype(np.int64)
    codes = rng.integers(0, len(STORM_XIDS), size=count)
    kills = rng.random(count) < config.xid_storm_kill_probability
    gpu_draws = rng.random(count)
    delay_draws = rng.random(count)
    gpu_fault = np.zeros(count, dtype=bool)
    gpu_codes = np.zeros(count, dtype=np.int64)
    if config.xid_storm_gpu_fraction > 0:
        gpu_fault = rng.random(count) < config.xid_storm_gpu_fraction
        gpu_codes = rng.integers(0, len(GPU_STORM_XIDS), size=count)
    return tuple(
        StormDraw(
            int(times[i]),
            int(nodes[i]),
            int(durations[i]),
            int(lines[i]),
            GPU_STORM_XIDS[int(gpu_codes[i])] if gpu_fault[i] else STORM_XIDS[int(codes[i])],
            bool(kills[i]) and not gpu_fault[i],
            float(gpu_draws[i]),
            float(delay_draws[i]),
            bool(gpu_fault[i]),
        )
        for i in range(count)
    )


def storm_window(draw: StormDraw, now: int, job_end_ms: int) -> int | None:
    """Planned last line of a storm that starts at ``now`` on a job ending at ``job_end_ms``.

    Returns
    -------
    int | None
        ``None`` when the job has too little run left for a storm (at least 20 minutes, or the
        storm's whole length when it is shorter).
    """
    last = min(now + draw.duration_ms, job_end_ms - _STORM_MARGIN_MS)
    return last if last - now >= min(_STORM_MIN_MS, draw.duration_ms) else None


def storm_lines(
    storm: StormRecord, until_ms: int, pid: int | None, process: str, rng: np.random.Generator
) -> list[XidRecord]:
    """XID lines of a storm: the first at its start, the last at its planned end, the rest
    uniform between; lines at or after ``until_ms`` (the job's actual end, the span's end) are
    dropped."""
    inner = np.sort(rng.integers(storm.start_ms + 1, storm.end_ms, size=max(0, storm.lines - 2)))
    times = [storm.start_ms, *inner.tolist(), storm.end_ms][: storm.lines]
    return [
        XidRecord(line_us(ts_ms, rng), storm.node, storm.gpu, storm.xid, pid, process)
        for ts_ms in times
        if ts_ms < until_ms
    ]


def storm_evidence(
    config: SimulationConfig,
    storms: Sequence[StormRecord],
    jobs: Mapping[int, JobRecord],
    rng: np.random.Generator,
) -> tuple[tuple[StormRecord, ...], list[XidRecord]]:
    """Lines of the storms that happened, and the storms as logged (cut at the job's end).

    Parameters
    ----------
    config
        The configuration (span end).
    storms
        The storms as the cluster recorded them, in onset order.
    jobs
        The jobs that started, by :attr:`JobRecord.index`.
    rng
        Draws the times of the lines.

    Returns
    -------
    tuple[tuple[StormRecord, ...], list[XidRecord]]
        The storms with the lines, end and outcome they were logged with, and their XID lines.
    """
    records: list[StormRecord] = []
    lines: list[XidRecord] = []
    for storm in storms:
        job = jobs[storm.job_index]
        until = min(job.end_ms if job.end_ms is not None else config.end_ms, config.end_ms)
        if storm.gpu_fault:  # the driver logs the GPU's errors: no process
            logged = storm_lines(storm, until, None, "", rng)
        else:
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
