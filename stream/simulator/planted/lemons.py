"""Lemon nodes: nodes that fail far more often than the others for the whole span.

``lemon_node``
    A node whose critical fault rate is :attr:`SimulationConfig.lemon_fault_multiplier` times
    the healthy rate for the whole span (mostly XID 79, 119, 62, ending jobs NODE_FAIL), with
    extra application XIDs.

The lemons' extra critical faults are struck by the cluster (:mod:`stream.simulator.scheduler`,
templates :data:`stream.simulator.faults.LEMON_FAULT_TEMPLATES`) at the rate of
:func:`stream.simulator.planted.rates.fault_rates`; this module picks the lemons and writes their
extra application XIDs.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final

import numpy as np

from stream.simulator.config import SimulationConfig
from stream.simulator.events import XidRecord, job_pid, line_us
from stream.simulator.workload import JobRecord, jobs_by_node

__all__ = ["FAULT_KIND_LEMON_NODE", "LEMON_MIN_CLUSTER_NODES", "choose_lemons", "lemon_xids"]

FAULT_KIND_LEMON_NODE: Final = "lemon_node"

#: A cluster of at least this many nodes has at least one lemon.
LEMON_MIN_CLUSTER_NODES: Final = 50

# Extra application XIDs of lemon nodes.
_LEMON_XID_MIX: Final[tuple[int, ...]] = (13, 31, 31, 43, 45)


def choose_lemons(config: SimulationConfig, rng: np.random.Generator) -> tuple[int, ...]:
    """Pick the lemon nodes: ``round(lemon_node_fraction x nodes)``, at least one from 50 nodes.

    Returns
    -------
    tuple[int, ...]
        Node indices, ascending.
    """
    count = round(config.lemon_node_fraction * config.nodes)
    if config.nodes >= LEMON_MIN_CLUSTER_NODES and config.lemon_node_fraction > 0:
        count = max(count, 1)
    count = min(count, config.nodes)
    chosen = rng.choice(config.nodes, size=count, replace=False)
    return tuple(sorted(int(node) for node in chosen))


def lemon_xids(
    config: SimulationConfig, lemons: Sequence[int], jobs: Sequence[JobRecord], rng: np.random.Generator
) -> list[XidRecord]:
    """Extra application XIDs of lemon nodes (``lemon_extra_xids_per_day`` per node-day).

    Each is logged by the job running on the node at that time (none while it is idle).
    """
    runs = jobs_by_node(jobs, set(lemons))
    out: list[XidRecord] = []
    for node in lemons:
        count = int(rng.poisson(config.lemon_extra_xids_per_day * config.days))
        times = np.sort(rng.integers(config.start_ms, config.end_ms, size=count)).tolist()
        codes = rng.integers(0, len(_LEMON_XID_MIX), size=count).tolist()
        gpu_draws = rng.random(count).tolist()
        node_runs = runs[node]
        starts = [job.start_ms for job in node_runs]
        for ts_ms, code, gpu_draw in zip(times, codes, gpu_draws, strict=True):
            position = bisect.bisect_right(starts, ts_ms) - 1
            if position < 0:
                continue
            job = node_runs[position]
            if job.end_ms is not None and ts_ms >= job.end_ms:
                continue
            gpu = min(int(gpu_draw * job.gpus_per_node_used), job.gpus_per_node_used - 1)
            pid = job_pid(job.index, node)
            out.append(XidRecord(line_us(ts_ms, rng), node, gpu, _LEMON_XID_MIX[code], pid, job.process))
    return out
