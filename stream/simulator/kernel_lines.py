"""Kernel lines of the cluster's own events: XIDs of faults and jobs, boot lines, benign noise.

A critical fault logs its template's XIDs on its GPU, introduced by an ``NVRM: GPU at`` line, and
the other GPUs of the job it kills may log XID 45 (preemptive cleanup); a repaired or maintained
node logs the driver's boot lines. Many jobs that fail for user reasons leave application XIDs
(13, 31, 43, 45, 68, 109) on their nodes just before they end; a few healthy ones log a transient
one. Benign kernel messages, in proportion to those XIDs, fill the log around them.

The planted faults' XID lines (:mod:`stream.simulator.planted`) are written there and merged in
by :func:`kernel_events`.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from schemas.records import JobState
from schemas.timeutil import MINUTE_MS
from stream.simulator.config import SECOND_MS, SimulationConfig
from stream.simulator.events import KernelLine, KernelLineKind, XidRecord, job_pid, line_us
from stream.simulator.faults import FaultRecord
from stream.simulator.planted.crashloop import CRASH_LOOP_XIDS
from stream.simulator.planted.noise import MaintenanceRecord
from stream.simulator.workload import JobRecord

__all__ = ["APPLICATION_XIDS", "kernel_events"]

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


def _pick(rng: np.random.Generator, mix: tuple[tuple[int, float], ...]) -> int:
    """Draw a code from a mix of ``(code, weight)``."""
    weights = np.array([weight for _, weight in mix])
    return mix[int(rng.choice(len(mix), p=weights / weights.sum()))][0]


def kernel_events(
    config: SimulationConfig,
    jobs: tuple[JobRecord, ...],
    by_index: dict[int, JobRecord],
    faults: tuple[FaultRecord, ...],
    rng: np.random.Generator,
    rng_noise: np.random.Generator,
    *,
    planted: list[XidRecord],
    maintenance: tuple[MaintenanceRecord, ...],
    crash_loop_users: frozenset[str] = frozenset(),
) -> tuple[tuple[XidRecord, ...], tuple[KernelLine, ...]]:
    """XID lines of faults and jobs, boot lines of repairs and maintenance, and kernel noise.

    The noise lines scale with the XIDs of faults and jobs only: the ``planted`` XID lines
    (storms, flapping links, lemons' extra XIDs) are added as they are and make the rest of the
    kernel no chattier.

    Parameters
    ----------
    config
        The configuration (span, size, XID and noise probabilities).
    jobs, by_index
        The jobs that started, in submit order and by :attr:`JobRecord.index`.
    faults
        The critical faults, in onset order.
    rng
        Draws the XID lines of faults and jobs.
    rng_noise
        Draws the benign kernel lines.
    planted
        XID lines of the planted faults, merged in as they are.
    maintenance
        Maintenance reboots, each followed by boot lines.
    crash_loop_users
        Users whose jobs crash wherever they run: each of their FAILED jobs dies with
        application XIDs (:data:`~stream.simulator.planted.crashloop.CRASH_LOOP_XIDS`), a few
        lines on one GPU when ``config.crash_loop_max_lines`` is set.

    Returns
    -------
    tuple[tuple[XidRecord, ...], tuple[KernelLine, ...]]
        The XID lines and the other kernel lines, each in time order.
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
        if fault.repaired_ms + 6 * SECOND_MS < end_ms:
            boot_us = (fault.repaired_ms + 5 * SECOND_MS) * 1000
            lines.append(KernelLine(boot_us, fault.node, KernelLineKind.BOOT_DRIVER, 0, 0))
            lines.append(KernelLine(boot_us + 211_000, fault.node, KernelLineKind.BOOT_NVLINK, 0, 0))
    for reboot in maintenance:
        boot_us = (reboot.ts_ms + 5 * SECOND_MS) * 1000
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
        elif job.user in crash_loop_users and job.state is JobState.FAILED:
            if config.crash_loop_max_lines:
                _debug_failure(job, config.crash_loop_max_lines, used, rng, xids)
            else:
                _failure_burst(job, _pick(rng, CRASH_LOOP_XIDS), used, rng, xids)
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
        base = max(job.end_ms - int(rng.integers(15_000, 8 * MINUTE_MS)), job.start_ms + SECOND_MS)
        pid = None if unknown_pid else job_pid(job.index, node)
        for gpu in gpus:
            ts_ms = base
            for _ in range(int(rng.integers(1, 4))):
                if ts_ms >= job.end_ms:
                    break
                out.append(XidRecord(line_us(ts_ms, rng), node, gpu, code, pid, job.process))
                ts_ms += int(rng.integers(1, 2_000))


def _debug_failure(
    job: JobRecord, max_lines: int, used: int, rng: np.random.Generator, out: list[XidRecord]
) -> None:
    """A debug job's failure: one to ``max_lines`` crash-loop XIDs on one GPU of its node, seconds
    apart, in the minutes before it ends (a process dying once, no storm)."""
    assert job.end_ms is not None
    node = job.nodes[0]
    gpu = int(rng.integers(0, used))
    pid = job_pid(job.index, node)
    ts_ms = max(job.end_ms - int(rng.integers(15_000, 5 * MINUTE_MS)), job.start_ms + SECOND_MS)
    for _ in range(int(rng.integers(1, max_lines + 1))):
        if ts_ms >= job.end_ms:
            break
        out.append(XidRecord(line_us(ts_ms, rng), node, gpu, _pick(rng, CRASH_LOOP_XIDS), pid, job.process))
        ts_ms += int(rng.integers(200, 5_000))


def _transient(
    job: JobRecord, until_ms: int, used: int, rng: np.random.Generator, out: list[XidRecord]
) -> None:
    """One application XID during a run that goes on (or completes) regardless."""
    if until_ms - job.start_ms < 2 * SECOND_MS:
        return
    node = job.nodes[int(rng.integers(0, len(job.nodes)))]
    gpu = int(rng.integers(0, used))
    ts_ms = int(rng.integers(job.start_ms + SECOND_MS, until_ms))
    code = _pick(rng, _TRANSIENT_XID_MIX)
    out.append(XidRecord(line_us(ts_ms, rng), node, gpu, code, job_pid(job.index, node), job.process))
