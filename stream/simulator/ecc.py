"""The ECC counters of every GPU, as the DCGM scrapes will show them.

Faults add uncorrectable (DBE) errors and set the pending-retirement and row-remap-failure flags;
repairs and maintenance reboot nodes (volatile counters reset); a few percent of the GPUs
accumulate correctable (SBE) errors at a steady rate. :func:`plan_ecc` collects those changes as
an :class:`EccPlan`, with the counter events of the planted faults and benign noise
(:mod:`stream.simulator.planted`); :func:`iter_ecc_scrapes` replays it scrape by scrape for
:func:`stream.simulator.writers.write_dcgm`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from schemas.timeutil import DAY_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.events import EccEvent, EccEventKind
from stream.simulator.faults import FAULT_TEMPLATES_BY_NAME, FaultRecord

__all__ = ["EccPlan", "EccScrape", "iter_ecc_scrapes", "plan_ecc"]


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


def plan_ecc(
    config: SimulationConfig,
    faults: tuple[FaultRecord, ...],
    rng: np.random.Generator,
    planted: list[EccEvent],
    degrading: set[int],
) -> EccPlan:
    """Counter events of the faults and repairs, plus the ``planted`` ones (degradations, SBE
    blips, maintenance reboots), and the steady SBE accumulators (never a ``degrading`` GPU, so
    that a degradation's onset is the first rise of its counter).

    Parameters
    ----------
    config
        The configuration (size, scrape period, SBE knobs).
    faults
        The critical faults; their templates say which counters they change.
    rng
        Draws the steady SBE GPUs, their rates and their errors per scrape.
    planted
        Counter events of the planted faults and benign noise.
    degrading
        Flat indices (``node * gpus_per_node + gpu``) of the degrading GPUs.

    Returns
    -------
    EccPlan
        The scrape times, every counter event in order, and the steady SBE increments.
    """
    scrapes = tuple(config.start_ms + k * config.ecc_interval_ms for k in range(config.scrape_count))
    events: list[EccEvent] = list(planted)
    for fault in faults:
        template = FAULT_TEMPLATES_BY_NAME[fault.template]
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
    per_scrape = rates * config.ecc_interval_ms / DAY_MS
    increments = rng.poisson(np.broadcast_to(per_scrape, (len(scrapes), len(sbe_gpus)))).astype(np.int64)
    return EccPlan(scrape_ms=scrapes, events=tuple(events), sbe_gpus=sbe_gpus, sbe_increments=increments)


def iter_ecc_scrapes(config: SimulationConfig, plan: EccPlan) -> Iterator[EccScrape]:
    """Yield the counter values of every GPU at each scrape, in time order.

    A counter event at ``t`` shows from the first scrape at or after ``t``. A reboot zeroes the
    node's volatile counters and pending-retirement flags; the aggregate DBE counter never
    decreases, and ``ROW_REMAP_FAILURE`` clears only when the repair replaced the GPU. SBE
    events (degrading GPUs, one-off blips) apply in time order with the others; the errors of the
    steady accumulators of an interval appear at its closing scrape, after any reboot within it.

    Each yielded scrape holds fresh arrays the caller may keep.

    Parameters
    ----------
    config
        The configuration the plan was made for (nodes, GPUs per node).
    plan
        The plan of the counters (:attr:`stream.simulator.history.ClusterHistory.ecc`).

    Yields
    ------
    EccScrape
        One per :attr:`EccPlan.scrape_ms`, in time order.
    """
    gpn = config.gpus_per_node
    total = config.nodes * gpn
    sbe_volatile = np.zeros(total, dtype=np.int64)
    dbe_volatile = np.zeros(total, dtype=np.int64)
    dbe_aggregate = np.zeros(total, dtype=np.int64)
    remap_failure = np.zeros(total, dtype=np.int64)
    retired_pending = np.zeros(total, dtype=np.int64)
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
