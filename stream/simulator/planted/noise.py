"""Benign noise around the planted faults, which no detector should flag.

Single SBE increments of 1 to 3 on a few percent of the GPUs (:func:`plan_sbe_blips`),
maintenance reboots (volatile counters drop to 0) of nodes that have no fault
(:func:`plan_maintenance`), and the NVLink errors a reboot may log as the node's links go down
(:func:`plan_reset_bursts`).

**Reset bursts.** When a GPU is reset or its node reboots, its NVLinks go down, and the driver
can report it: NVIDIA's catalog says a GPU connected over NVLink "may report an Xid 74 simply
because the link went down", and its XID 144-150 decode sheet lists link-down reasons such as
``Peer_side_down_due_to_reset_event``. The simulator stands for that with a burst, within two
seconds of the reboot, of 1 to 2 non-fatal XID 144 lines on each of 2 to all GPUs of the node
(``nvlink_reset_burst_probability`` of the reboots, repairs and maintenance alike): one burst,
no flapping link, however many lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from schemas.timeutil import DAY_MS, MINUTE_MS
from stream.simulator.config import SECOND_MS, SimulationConfig
from stream.simulator.events import EccEvent, EccEventKind, XidRecord, line_us
from stream.simulator.workload import JobRecord, jobs_by_node

__all__ = ["RESET_BURST_XID", "MaintenanceRecord", "plan_maintenance", "plan_reset_bursts", "plan_sbe_blips"]

#: The NVLink XID a reset burst logs: a flapping link's non-fatal 144, the hardest case to tell apart.
RESET_BURST_XID: Final = 144

# Maintenance: the node must be idle this long on each side of the reboot.
_MAINTENANCE_IDLE_MS: Final = 10 * MINUTE_MS


@dataclass(frozen=True, slots=True)
class MaintenanceRecord:
    """A maintenance reboot of an idle node that has no fault (volatile counters reset)."""

    ts_ms: int
    node: int


def plan_maintenance(
    config: SimulationConfig, jobs: Sequence[JobRecord], excluded: set[int], rng: np.random.Generator
) -> tuple[MaintenanceRecord, ...]:
    """Plan maintenance reboots: ``maintenance_rate`` per 1000 node-days, on nodes without faults.

    Each reboot falls at a drawn time or later, where the node is idle for 10 minutes on each
    side (it was drained); a node gets at most one reboot per day.

    Parameters
    ----------
    excluded
        Nodes with any planted fault: never rebooted for maintenance.

    Returns
    -------
    tuple[MaintenanceRecord, ...]
        In time order (then node).
    """
    candidates = [node for node in range(config.nodes) if node not in excluded]
    count = int(rng.poisson(config.maintenance_rate / 1000.0 * config.nodes * config.days))
    if not candidates or count == 0:
        return ()
    picks = rng.integers(0, len(candidates), size=count).tolist()
    times = rng.integers(config.start_ms, config.end_ms, size=count).tolist()
    chosen_nodes = {candidates[pick] for pick in picks}
    runs = jobs_by_node(jobs, chosen_nodes)
    done: dict[int, list[int]] = {}
    out: list[MaintenanceRecord] = []
    for pick, ts_ms in zip(picks, times, strict=True):
        node = candidates[pick]
        reboot = _idle_time(runs[node], ts_ms, config.end_ms)
        if reboot is None or reboot + 6 * SECOND_MS >= config.end_ms:
            continue
        if any(abs(reboot - other) < DAY_MS for other in done.get(node, ())):
            continue
        done.setdefault(node, []).append(reboot)
        out.append(MaintenanceRecord(reboot, node))
    out.sort(key=lambda item: (item.ts_ms, item.node))
    return tuple(out)


def _idle_time(runs: list[JobRecord], from_ms: int, end_ms: int) -> int | None:
    """First whole second at or after ``from_ms`` with no job on the node within 10 minutes."""
    busy = [(job.start_ms, job.end_ms if job.end_ms is not None else end_ms) for job in runs]
    candidate = -(-from_ms // SECOND_MS) * SECOND_MS
    for start, end in busy:
        if end + _MAINTENANCE_IDLE_MS <= candidate:
            continue
        if start - _MAINTENANCE_IDLE_MS >= candidate:
            break
        candidate = end + _MAINTENANCE_IDLE_MS
    return candidate if candidate < end_ms else None


def plan_sbe_blips(
    config: SimulationConfig, excluded_gpus: set[int], rng: np.random.Generator
) -> list[EccEvent]:
    """One-off correctable errors (+1 to +3, once) on ``sbe_blip_gpu_fraction`` of the GPUs.

    Parameters
    ----------
    excluded_gpus
        Flat GPU indices (degrading GPUs) that get no blip.
    """
    gpn = config.gpus_per_node
    total = config.nodes * gpn
    pool = np.array([flat for flat in range(total) if flat not in excluded_gpus], dtype=np.int64)
    count = min(len(pool), round(config.sbe_blip_gpu_fraction * total))
    chosen = np.sort(rng.choice(pool, size=count, replace=False)) if count else pool[:0]
    times = rng.integers(config.start_ms, config.end_ms, size=count).tolist()
    sizes = rng.integers(1, 4, size=count).tolist()
    return [
        EccEvent(ts_ms, EccEventKind.SBE, flat // gpn, flat % gpn, errors=size)
        for flat, ts_ms, size in zip(chosen.tolist(), times, sizes, strict=True)
    ]


def plan_reset_bursts(
    config: SimulationConfig, reboots: Sequence[tuple[int, int]], rng: np.random.Generator
) -> list[XidRecord]:
    """NVLink XIDs of the links going down at reboots: for each ``(ts_ms, node)`` reboot, with
    probability ``nvlink_reset_burst_probability``, 1 to 2 lines of :data:`RESET_BURST_XID` on each
    of 2 to all GPUs of the node within two seconds (no process: the driver logs them).

    Returns
    -------
    list[XidRecord]
        The lines, in reboot order.
    """
    gpn = config.gpus_per_node
    out: list[XidRecord] = []
    for ts_ms, node in reboots:
        if rng.random() >= config.nvlink_reset_burst_probability:
            continue
        count = int(rng.integers(min(2, gpn), gpn + 1))
        gpus = sorted(int(gpu) for gpu in rng.choice(gpn, size=count, replace=False))
        for gpu in gpus:
            for _ in range(int(rng.integers(1, 3))):
                at = ts_ms + int(rng.integers(0, 2 * SECOND_MS))
                if at < config.end_ms:
                    out.append(XidRecord(line_us(at, rng), node, gpu, RESET_BURST_XID, None, ""))
    return out
