"""The history of the synthetic cluster, and :func:`run_model`, which makes it: pure, seeded, no I/O.

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
* Trace mode (:mod:`stream.simulator.trace`): a real cluster's faults strike at their times on
  their servers instead of the drawn critical faults, and its worst servers are the lemons.

:func:`run_model` draws the workload (:mod:`stream.simulator.workload`) and the planted faults,
runs the cluster (:mod:`stream.simulator.scheduler`), then writes the evidence: kernel lines
(:mod:`stream.simulator.kernel_lines`) and ECC counters (:mod:`stream.simulator.ecc`). Critical
faults are described in :mod:`stream.simulator.faults`.

Ground truth agrees with the attribution rule of SPEC 4.4 (a FAILED/NODE_FAIL end is hardware
when its nodes show a hardware-class XID from 10 minutes before to 5 minutes after it): a job
killed by a fault ends at most 4 minutes after the XID, and a fault never lands within
:data:`~stream.simulator.faults.FAULT_QUIET_AFTER_END_MS` after a job ended on its node (it is
postponed), so no job that failed for user reasons has a hardware XID in its window (storms and
flapping links log only application XIDs, XID 92 and the non-fatal XID 144, none of them evidence
of a job's failure).

Determinism: all random draws come from ``numpy.random.Generator(PCG64)`` streams spawned from
the seed and are taken in an order fixed by the event order (ties broken by event kind and a
sequence number); nothing iterates over a set or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from schemas.timeutil import DAY_MS, HOUR_MS
from stream.simulator.config import SECOND_MS, SimulationConfig
from stream.simulator.ecc import EccPlan, plan_ecc
from stream.simulator.events import EccEvent, EccEventKind, KernelLine, XidRecord
from stream.simulator.faults import (
    FAULT_SOURCE_BASE,
    FAULT_SOURCE_ECC_DEGRADATION,
    FAULT_SOURCE_LEMON,
    FaultPlan,
    FaultRecord,
)
from stream.simulator.kernel_lines import kernel_events
from stream.simulator.planted import (
    DegradationPlan,
    DegradationRecord,
    FlapRecord,
    MaintenanceRecord,
    StormRecord,
    choose_lemons,
    degradation_record,
    fault_rates,
    lemon_xids,
    plan_degradations,
    plan_flapping,
    plan_maintenance,
    plan_reset_bursts,
    plan_sbe_blips,
    plan_storms,
    storm_evidence,
)
from stream.simulator.planted.crashloop import add_crash_loops, crash_loop_pins, crash_loop_user_names
from stream.simulator.scheduler import Cluster
from stream.simulator.trace import FaultTrace, load_trace, trace_fault_plans
from stream.simulator.workload import JobRecord, draw_demand, mean_node_ms

__all__ = ["ClusterHistory", "run_model"]


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
    crash_loop_users
        Users whose jobs crash wherever they run (:mod:`stream.simulator.planted.crashloop`).
    crash_loop_nodes
        Of those, the ones whose every job runs on one node: user -> node index.
    trace
        In trace mode (:attr:`SimulationConfig.fault_trace`), the trace's faults on the fleet: the
        source of the critical faults and lemons, and of the faults no input shows.
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
    crash_loop_users: tuple[str, ...] = ()
    crash_loop_nodes: Mapping[str, int] = field(default_factory=dict)
    trace: FaultTrace | None = None

    @property
    def exposure_node_days(self) -> float:
        """Exposure in node-days."""
        return self.exposure_node_ms / DAY_MS

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

    # Arrivals: a Poisson process whose offered load is target_load of the cluster.
    rate_per_ms = config.target_load * config.nodes / mean_node_ms(config)
    count = int(rng_jobs.poisson(rate_per_ms * span))
    arrivals = np.sort(rng_jobs.integers(0, span // SECOND_MS, size=count)) * SECOND_MS + start
    demand = draw_demand(rng_jobs, count, config)
    # Its own stream (the 17th child of the seed), so that a cluster without crash-looping users
    # draws exactly what it drew before they existed.
    rng_crash = np.random.Generator(np.random.PCG64(np.random.SeedSequence(config.seed).spawn(17)[16]))
    arrivals, demand = add_crash_loops(config, arrivals, demand, rng_crash)
    pins = crash_loop_pins(config, rng_crash)

    # Critical faults: per node Poisson over wall time, lemons' extra faults, and the failures of
    # degrading GPUs; together hardware_failure_rate cluster-wide. In trace mode, the trace's
    # faults and lemons instead of the drawn ones.
    trace = load_trace(config) if config.fault_trace else None
    lemons = trace.lemons if trace is not None else choose_lemons(config, rng_lemons)
    degrading = plan_degradations(config, lemons, rng_degrade)
    if trace is not None:
        plans = trace_fault_plans(trace) + _degradation_failures(degrading)
    else:
        plans = _critical_fault_plans(config, lemons, degrading, rng_faults, rng_lemon_faults)
    storm_draws = plan_storms(config, rng_storms)

    cluster = Cluster(
        config,
        demand,
        submit_ms=arrivals.tolist(),
        rng=rng_sched,
        fault_plans=plans,
        protected=_protected_windows(config, degrading),
        storm_draws=storm_draws,
        pins=pins,
    )
    cluster.run(config.end_ms)

    jobs = cluster.job_records()
    faults = tuple(cluster.faults)
    by_index = {job.index: job for job in jobs}

    storms, storm_xids = storm_evidence(config, cluster.storms, by_index, rng_storm_lines)
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
    faulty |= {fault.node for fault in trace.faults} if trace is not None else set()
    maintenance = plan_maintenance(config, jobs, faulty, rng_maintenance)
    degrading_gpus = {plan.node * config.gpus_per_node + plan.gpu for plan in degrading}
    ecc_events += plan_sbe_blips(config, degrading_gpus, rng_blips)
    ecc_events += [EccEvent(item.ts_ms, EccEventKind.REBOOT, item.node, -1) for item in maintenance]

    # Links going down at reboots (repairs and maintenance): their own stream, drawn only when on.
    drawn_lemons = lemons if trace is None else ()
    resets: list[XidRecord] = []
    if config.nvlink_reset_burst_probability > 0:
        rng_resets = np.random.Generator(np.random.PCG64(np.random.SeedSequence(config.seed).spawn(18)[17]))
        reboots = sorted(
            [
                (fault.repaired_ms, fault.node)
                for fault in faults
                if fault.repaired_ms + 6 * SECOND_MS < config.end_ms
            ]
            + [(item.ts_ms, item.node) for item in maintenance]
        )
        resets = plan_reset_bursts(config, reboots, rng_resets)

    xids, kernel_lines = kernel_events(
        config,
        jobs,
        by_index,
        faults,
        rng_xids,
        rng_noise,
        # A trace's lemons log what the trace says: no extra application XIDs of the model.
        planted=[*storm_xids, *flap_xids, *lemon_xids(config, drawn_lemons, jobs, rng_lemon_xids), *resets],
        maintenance=maintenance,
        crash_loop_users=frozenset(crash_loop_user_names(config)),
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
        ecc=plan_ecc(config, faults, rng_ecc, ecc_events, degrading_gpus),
        exposure_node_ms=exposure,
        lemon_nodes=lemons,
        degradations=tuple(degradations),
        storms=storms,
        flaps=flaps,
        maintenance=maintenance,
        crash_loop_users=crash_loop_user_names(config),
        crash_loop_nodes={f"user{user + 1:03d}": node for user, node in pins.items()},
        trace=trace,
    )


def _critical_fault_plans(
    config: SimulationConfig,
    lemons: tuple[int, ...],
    degrading: tuple[DegradationPlan, ...],
    rng_faults: np.random.Generator,
    rng_lemon_faults: np.random.Generator,
) -> list[FaultPlan]:
    """Plan the critical faults: the random faults of every node, the lemons' extra faults and the
    failures of the degrading GPUs, in that order.

    Each node's random faults are a Poisson process over wall time (uniform times and nodes); with
    the lemons' extra faults and the degradation failures they make ``hardware_failure_rate``
    cluster-wide (:func:`~stream.simulator.planted.rates.fault_rates`).
    """
    start, span = config.start_ms, config.span_ms
    days = span / DAY_MS
    rates = fault_rates(config, len(lemons))
    fault_count = int(rng_faults.poisson(rates.healthy / 1000.0 * config.nodes * days))
    onsets = np.sort(rng_faults.integers(start, start + span, size=fault_count)).tolist()
    nodes = rng_faults.integers(0, config.nodes, size=fault_count).tolist()
    plans = [FaultPlan(onset, node, FAULT_SOURCE_BASE) for onset, node in zip(onsets, nodes, strict=True)]
    if lemons:
        extra = int(rng_lemon_faults.poisson(rates.lemon_extra / 1000.0 * len(lemons) * days))
        onsets = np.sort(rng_lemon_faults.integers(start, start + span, size=extra)).tolist()
        picks = rng_lemon_faults.integers(0, len(lemons), size=extra).tolist()
        plans += [
            FaultPlan(onset, lemons[pick], FAULT_SOURCE_LEMON)
            for onset, pick in zip(onsets, picks, strict=True)
        ]
    return plans + _degradation_failures(degrading)


def _degradation_failures(degrading: tuple[DegradationPlan, ...]) -> list[FaultPlan]:
    """The uncorrectable errors that end the degradations that fail within the span."""
    return [
        FaultPlan(
            plan.failure_ms, plan.node, FAULT_SOURCE_ECC_DEGRADATION, plan.gpu, plan.template, plan.index
        )
        for plan in degrading
        if plan.failure_ms is not None
    ]


def _protected_windows(
    config: SimulationConfig, degrading: tuple[DegradationPlan, ...]
) -> dict[int, tuple[int, int]]:
    """Per node with a degrading GPU, when no other critical fault may strike it.

    From ``repair_max_hours`` + 1 h before the degradation starts (a repair would reboot the node
    and reset the GPU's SBE counter) to 1 h after its failure, or to the span's end.
    """
    protected: dict[int, tuple[int, int]] = {}
    margin = round(config.repair_max_hours * HOUR_MS) + HOUR_MS
    for plan in degrading:
        last = plan.failure_ms if plan.failure_ms is not None else config.end_ms
        protected[plan.node] = (plan.start_ms - margin, last + HOUR_MS)
    return protected
