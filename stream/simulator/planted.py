"""Planted faults with onsets, and the benign noise around them: pure, seeded, no I/O.

:mod:`stream.simulator.model` runs the cluster; this module plans what it plants besides the
random critical hardware faults, and writes their evidence as kernel lines and ECC events:

``ecc_degradation``
    A GPU whose correctable (SBE) error rate grows exponentially for 2 to 7 days, from a few
    errors per 6-hour scrape to hundreds (the rate doubles every 6 hours to 1.6 days), then, in
    most cases, suffers an uncorrectable error: that failure is a ``critical_hw`` fault of the
    cluster (XID 48, 94 or 95, DBE counters +1, the running job dies, repair and reboot).
    The others keep degrading, at the final rate, to the end of the span. A degrading GPU is on
    a non-lemon node of its own where no other critical fault strikes from ``repair_max_hours``
    + 1 h before its start to 1 h after its failure, and no maintenance reboot at all, so its
    volatile counter rises without a reset; it is none of the steady or one-off SBE GPUs.
``xid_storm``
    Forty to four hundred application XIDs (13, 31 or 43) from one GPU of a running job, over
    20 minutes to 3 hours; the job may die of it, a user-looking failure (not hardware). A storm
    drawn on an idle node does not happen, so about ``utilization x xid_storm_rate`` happen.
``nvlink_flapping``
    Bursts of 3 to 20 non-fatal NVLink XIDs (144) every 15 to 120 minutes for 6 to 48 hours,
    spreading from one GPU of the node to others. No job dies of it.
``lemon_node``
    A node whose critical fault rate is :attr:`SimulationConfig.lemon_fault_multiplier` times
    the healthy rate for the whole span (mostly XID 79, 119, 62, ending jobs NODE_FAIL), with
    extra application XIDs.

Benign noise that no detector should flag: single SBE increments of 1 to 3 on a few percent of
the GPUs, and maintenance reboots (volatile counters drop to 0) of nodes that have no fault.

**Rate split.** ``hardware_failure_rate`` stays the cluster-wide rate of critical faults per 1000
node-days. Degradations that fail within the span take their expected share of it; the rest is
split between healthy nodes (rate ``b``) and lemons (``m x b``) so that, with ``L`` lemons out
of ``N`` nodes, ``b x (1 + (m - 1) x L / N) + degradation share = hardware_failure_rate``
(:func:`fault_rates`). At the defaults (1.5% lemons, ``m = 15``) on 1000 nodes x 30 days:
``b`` ~ 4.98, lemons ~ 74.7, degradation failures ~ 0.48 per 1000 node-days.

Determinism: every function draws from the generator it is given, in a fixed order.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np

from stream.simulator.events import (
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    MS_PER_SECOND,
    EccEvent,
    EccEventKind,
    XidRecord,
    job_pid,
    line_us,
)

if TYPE_CHECKING:
    from stream.simulator.model import JobRecord, SimulationConfig

__all__ = [
    "DEGRADATION_FAILURE_TEMPLATES",
    "FAULT_KIND_ECC_DEGRADATION",
    "FAULT_KIND_LEMON_NODE",
    "FAULT_KIND_NVLINK_FLAPPING",
    "FAULT_KIND_XID_STORM",
    "LEMON_MIN_CLUSTER_NODES",
    "NVLINK_FLAP_XID",
    "STORM_XIDS",
    "DegradationPlan",
    "DegradationRecord",
    "FaultRates",
    "FlapRecord",
    "MaintenanceRecord",
    "StormDraw",
    "StormRecord",
    "choose_lemons",
    "degradation_record",
    "fault_rates",
    "lemon_xids",
    "plan_degradations",
    "plan_flapping",
    "plan_maintenance",
    "plan_sbe_blips",
    "plan_storms",
    "storm_lines",
]

FAULT_KIND_ECC_DEGRADATION: Final = "ecc_degradation"
FAULT_KIND_XID_STORM: Final = "xid_storm"
FAULT_KIND_NVLINK_FLAPPING: Final = "nvlink_flapping"
FAULT_KIND_LEMON_NODE: Final = "lemon_node"

#: A cluster of at least this many nodes has at least one lemon.
LEMON_MIN_CLUSTER_NODES: Final = 50

#: Application XIDs a storm repeats (one code per storm).
STORM_XIDS: Final[tuple[int, ...]] = (13, 31, 43)

#: "NVLink: SAW MVB non-fatal error": the XID of a flapping link (warn, never fatal).
NVLINK_FLAP_XID: Final = 144

#: Templates (names in :data:`stream.simulator.model.HARDWARE_FAULT_TEMPLATES`) of the
#: uncorrectable error that ends a degradation, with their shares.
DEGRADATION_FAILURE_TEMPLATES: Final[tuple[tuple[str, float], ...]] = (
    ("dbe", 0.40),  # XID 48 (+63), DBE, pending retirement
    ("contained_ecc", 0.35),  # XID 94, DBE
    ("uncontained_ecc", 0.25),  # XID 95, DBE
)

# SBE rate of a degrading GPU at its start and at its failure, per day (uniform ranges): 2 to 5
# per 6-hour scrape at first, 100 to 400 per scrape at the end.
_DEGRADATION_INITIAL_RATE: Final = (8.0, 20.0)
_DEGRADATION_FINAL_RATE: Final = (400.0, 1600.0)
# Storm length and line count (log-uniform count).
_STORM_MIN_MS: Final = 20 * MS_PER_MINUTE
_STORM_MAX_MS: Final = 3 * MS_PER_HOUR
_STORM_LINES: Final = (40, 400)
# A storm needs this much of its job's run left, and stops this long before the job's end.
_STORM_MARGIN_MS: Final = 5 * MS_PER_MINUTE
# Flapping: span of the episode, GPUs involved, lines per burst, gap between bursts.
_FLAP_HOURS: Final = (6.0, 48.0)
_FLAP_MAX_GPUS: Final = 5
_FLAP_BURST_LINES: Final = (3, 20)
_FLAP_GAP_MINUTES: Final = (15, 120)
# Maintenance: the node must be idle this long on each side of the reboot.
_MAINTENANCE_IDLE_MS: Final = 10 * MS_PER_MINUTE
# Extra application XIDs of lemon nodes.
_LEMON_XID_MIX: Final[tuple[int, ...]] = (13, 31, 31, 43, 45)


# ---------------------------------------------------------------------------------------------
# Records


class FaultRates(NamedTuple):
    """Critical fault rates per 1000 node-days of wall time (see the module docstring).

    Attributes
    ----------
    healthy
        Random critical faults of every node (lemons included).
    lemon_extra
        Additional faults of each lemon node: ``(multiplier - 1) x healthy``.
    degradation
        Expected failures of degrading GPUs within the span, per 1000 node-days of the cluster.
    """

    healthy: float
    lemon_extra: float
    degradation: float


@dataclass(frozen=True, slots=True)
class DegradationPlan:
    """A degrading GPU, as planned before the cluster runs.

    Attributes
    ----------
    index
        Number of the degradation (start order).
    start_ms
        When the error rate starts to grow (the first scrape after it shows the first errors).
    failure_ms
        Planned uncorrectable error (``start + duration``), ``None`` when it does not fail within
        the span; the cluster may postpone it a few minutes (after a job's end).
    duration_ms
        Time the rate takes to grow from ``initial_rate`` to ``final_rate`` per day.
    template
        Template name of the uncorrectable error.
    """

    index: int
    node: int
    gpu: int
    start_ms: int
    failure_ms: int | None
    duration_ms: int
    initial_rate: float
    final_rate: float
    template: str

    @property
    def doubling_ms(self) -> float:
        """Time in which the SBE rate doubles."""
        return self.duration_ms / math.log2(self.final_rate / self.initial_rate)

    def expected_errors(self, from_ms: int, to_ms: int) -> float:
        """Expected SBE errors between two times (the rate's integral; flat after the duration)."""

        def cumulative(ts_ms: int) -> float:
            elapsed = max(0, ts_ms - self.start_ms)
            doubling = self.doubling_ms
            grow = min(elapsed, self.duration_ms)
            total = self.initial_rate * doubling / math.log(2) * (math.pow(2.0, grow / doubling) - 1.0)
            total += self.final_rate * max(0, elapsed - self.duration_ms)
            return total / MS_PER_DAY

        return max(0.0, cumulative(to_ms) - cumulative(from_ms))


@dataclass(frozen=True, slots=True)
class DegradationRecord:
    """A degrading GPU as it happened.

    Attributes
    ----------
    onset_ms
        First scrape where its SBE counter rose.
    failure_ms
        Onset of its uncorrectable error (the ``critical_hw`` fault ``fault_index``), ``None`` if
        it did not fail within the span.
    sbe_errors
        SBE errors it logged within the span.
    """

    plan: DegradationPlan
    onset_ms: int
    failure_ms: int | None
    fault_index: int | None
    sbe_errors: int


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


@dataclass(frozen=True, slots=True)
class FlapRecord:
    """A flapping NVLink: ``gpus`` in the order they started logging, first and last line."""

    index: int
    node: int
    gpus: tuple[int, ...]
    onset_ms: int
    end_ms: int
    lines: int


@dataclass(frozen=True, slots=True)
class MaintenanceRecord:
    """A maintenance reboot of an idle node that has no fault (volatile counters reset)."""

    ts_ms: int
    node: int


# ---------------------------------------------------------------------------------------------
# Lemons and rates


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


def _fitting_share(span_ms: int, low_ms: float, high_ms: float) -> float:
    """Expected share of a uniform start in ``[0, span)`` whose uniform duration ends within it."""
    if high_ms <= low_ms:
        return max(0.0, span_ms - low_ms) / span_ms
    top = min(high_ms, span_ms)
    if top <= low_ms:
        return 0.0
    return ((span_ms - low_ms) ** 2 - (span_ms - top) ** 2) / (2.0 * (high_ms - low_ms) * span_ms)


def fault_rates(config: SimulationConfig, lemon_count: int) -> FaultRates:
    """Split ``hardware_failure_rate`` between healthy nodes, lemons and degradation failures.

    Parameters
    ----------
    config
        The configuration (rates, span, size).
    lemon_count
        Number of lemon nodes.

    Returns
    -------
    FaultRates
        Rates per 1000 node-days whose cluster-wide sum is ``hardware_failure_rate`` (or more,
        when degradation failures alone exceed it and the random faults drop to 0).
    """
    share = _fitting_share(
        config.span_ms,
        config.ecc_degradation_min_days * MS_PER_DAY,
        config.ecc_degradation_max_days * MS_PER_DAY,
    )
    degradation = (
        1000.0
        * config.ecc_degradation_gpu_fraction
        / 30.0
        * config.gpus_per_node
        * config.ecc_degradation_failure_probability
        * share
    )
    weight = 1.0 + (config.lemon_fault_multiplier - 1.0) * lemon_count / config.nodes
    healthy = max(0.0, config.hardware_failure_rate - degradation) / weight
    return FaultRates(healthy, (config.lemon_fault_multiplier - 1.0) * healthy, degradation)


# ---------------------------------------------------------------------------------------------
# ECC degradation


def plan_degradations(
    config: SimulationConfig, lemons: Sequence[int], rng: np.random.Generator
) -> tuple[DegradationPlan, ...]:
    """Plan the degrading GPUs: ``ecc_degradation_gpu_fraction`` of the GPUs per 30 days.

    Each is on its own healthy (non-lemon) node; the start is uniform over the span.

    Returns
    -------
    tuple[DegradationPlan, ...]
        In start order.
    """
    total = config.nodes * config.gpus_per_node
    count = int(rng.poisson(config.ecc_degradation_gpu_fraction * total * config.days / 30.0))
    lemon_set = set(lemons)
    candidates = np.array([node for node in range(config.nodes) if node not in lemon_set], dtype=np.int64)
    count = min(count, len(candidates))
    nodes = rng.choice(candidates, size=count, replace=False) if count else np.zeros(0, dtype=np.int64)
    gpus = rng.integers(0, config.gpus_per_node, size=count)
    starts = rng.integers(config.start_ms, config.end_ms, size=count)
    days = rng.uniform(config.ecc_degradation_min_days, config.ecc_degradation_max_days, size=count)
    fails = rng.random(count) < config.ecc_degradation_failure_probability
    initial = rng.uniform(*_DEGRADATION_INITIAL_RATE, size=count)
    final = rng.uniform(*_DEGRADATION_FINAL_RATE, size=count)
    names = [name for name, _ in DEGRADATION_FAILURE_TEMPLATES]
    weights = np.array([weight for _, weight in DEGRADATION_FAILURE_TEMPLATES])
    templates = rng.choice(len(names), size=count, p=weights / weights.sum())
    order = sorted(range(count), key=lambda i: (int(starts[i]), int(nodes[i])))
    plans: list[DegradationPlan] = []
    for index, i in enumerate(order):
        start = int(starts[i])
        duration = round(float(days[i]) * MS_PER_DAY)
        failure = start + duration if bool(fails[i]) and start + duration < config.end_ms else None
        plans.append(
            DegradationPlan(
                index=index,
                node=int(nodes[i]),
                gpu=int(gpus[i]),
                start_ms=start,
                failure_ms=failure,
                duration_ms=duration,
                initial_rate=float(initial[i]),
                final_rate=float(final[i]),
                template=names[int(templates[i])],
            )
        )
    return tuple(plans)


def degradation_record(
    plan: DegradationPlan,
    failure_ms: int | None,
    fault_index: int | None,
    scrape_ms: Sequence[int],
    rng: np.random.Generator,
    events: list[EccEvent],
) -> DegradationRecord | None:
    """Write the SBE errors of a degrading GPU as ECC events and return what it became.

    Every scrape interval from the start to the failure (or the last scrape) gets at least one
    error, so the counter rises at every scrape; the errors of the interval that holds the
    failure are logged at the failure, just before the uncorrectable error.

    Parameters
    ----------
    plan
        The degradation.
    failure_ms, fault_index
        Actual onset and index of its uncorrectable error, ``None`` if it did not fail.
    scrape_ms
        Times of the DCGM scrapes.
    rng
        Draws the error counts.
    events
        Receives the :attr:`EccEventKind.SBE` events.

    Returns
    -------
    DegradationRecord | None
        ``None`` when no scrape after the start shows it (it started after the last scrape).
    """
    stop = failure_ms if failure_ms is not None else scrape_ms[-1]
    first = bisect.bisect_right(scrape_ms, plan.start_ms)
    onset: int | None = None
    total = 0
    for k in range(first, len(scrape_ms)):
        low = max(scrape_ms[k - 1], plan.start_ms) if k > 0 else plan.start_ms
        if low >= stop:
            break
        high = min(scrape_ms[k], stop)
        count = max(1, int(rng.poisson(plan.expected_errors(low, high))))
        events.append(EccEvent(high, EccEventKind.SBE, plan.node, plan.gpu, errors=count))
        total += count
        if onset is None:
            onset = scrape_ms[k]
    if onset is None:
        return None
    return DegradationRecord(plan, onset, failure_ms, fault_index, total)


# ---------------------------------------------------------------------------------------------
# XID storms


def plan_storms(config: SimulationConfig, rng: np.random.Generator) -> tuple[StormDraw, ...]:
    """Draw the XID storms: ``xid_storm_rate`` per 1000 node-days, uniform times and nodes.

    A storm only happens on a node that runs a job at that time (decided by the cluster).

    Returns
    -------
    tuple[StormDraw, ...]
        In time order.
    """
    count = int(rng.poisson(config.xid_storm_rate / 1000.0 * config.nodes * config.days))
    times = np.sort(rng.integers(config.start_ms, config.end_ms, size=count))
    nodes = rng.integers(0, config.nodes, size=count)
    durations = rng.integers(_STORM_MIN_MS, _STORM_MAX_MS + 1, size=count)
    low, high = _STORM_LINES
    lines = np.rint(np.exp(rng.uniform(math.log(low), math.log(high), size=count))).astype(np.int64)
    codes = rng.integers(0, len(STORM_XIDS), size=count)
    kills = rng.random(count) < config.xid_storm_kill_probability
    gpu_draws = rng.random(count)
    delay_draws = rng.random(count)
    return tuple(
        StormDraw(
            int(times[i]),
            int(nodes[i]),
            int(durations[i]),
            int(lines[i]),
            STORM_XIDS[int(codes[i])],
            bool(kills[i]),
            float(gpu_draws[i]),
            float(delay_draws[i]),
        )
        for i in range(count)
    )


def storm_window(draw: StormDraw, now: int, job_end_ms: int) -> int | None:
    """Planned last line of a storm that starts at ``now`` on a job ending at ``job_end_ms``.

    Returns
    -------
    int | None
        ``None`` when the job has too little run left for a storm (at least 20 minutes).
    """
    last = min(now + draw.duration_ms, job_end_ms - _STORM_MARGIN_MS)
    return last if last - now >= _STORM_MIN_MS else None


def storm_lines(
    storm: StormRecord, until_ms: int, pid: int, process: str, rng: np.random.Generator
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


# ---------------------------------------------------------------------------------------------
# NVLink flapping


def plan_flapping(
    config: SimulationConfig, rng: np.random.Generator
) -> tuple[tuple[FlapRecord, ...], list[XidRecord]]:
    """Plan flapping NVLinks (``nvlink_flapping_rate`` per 1000 node-days) and their XID lines.

    Returns
    -------
    tuple[tuple[FlapRecord, ...], list[XidRecord]]
        The episodes (onset order) and their XID 144 lines (pid unknown: the driver logs them).
    """
    count = int(rng.poisson(config.nvlink_flapping_rate / 1000.0 * config.nodes * config.days))
    starts = np.sort(rng.integers(config.start_ms, config.end_ms, size=count))
    nodes = rng.integers(0, config.nodes, size=count)
    gpn = config.gpus_per_node
    episodes: list[tuple[int, int, tuple[int, ...], list[XidRecord]]] = []
    for start, node in zip(starts.tolist(), nodes.tolist(), strict=True):
        length = round(rng.uniform(*_FLAP_HOURS) * MS_PER_HOUR)
        involved = int(rng.integers(2, min(gpn, _FLAP_MAX_GPUS) + 1)) if gpn > 1 else 1
        order = [int(gpu) for gpu in rng.permutation(gpn)[:involved]]
        joins = [start, *sorted(rng.integers(start + 1, start + 3 * length // 4, involved - 1).tolist())]
        lines: list[XidRecord] = []
        burst = start
        while burst <= start + length and burst < config.end_ms:
            active = [gpu for gpu, joined in zip(order, joins, strict=True) if joined <= burst]
            ts_ms = burst
            for line in range(int(rng.integers(_FLAP_BURST_LINES[0], _FLAP_BURST_LINES[1] + 1))):
                if line:
                    ts_ms += int(rng.integers(50, 3_000))
                gpu = active[int(rng.integers(0, len(active)))]
                if ts_ms >= config.end_ms:
                    break
                lines.append(XidRecord(line_us(ts_ms, rng), node, gpu, NVLINK_FLAP_XID, None, ""))
            burst = ts_ms + int(rng.integers(_FLAP_GAP_MINUTES[0], _FLAP_GAP_MINUTES[1] + 1)) * MS_PER_MINUTE
        seen: list[int] = []
        for record in lines:
            if record.gpu not in seen:
                seen.append(record.gpu)
        episodes.append((start, node, tuple(seen), lines))
    records: list[FlapRecord] = []
    xids: list[XidRecord] = []
    for index, (start, node, gpus, lines) in enumerate(episodes):
        records.append(FlapRecord(index, node, gpus, start, lines[-1].ts_us // 1000, len(lines)))
        xids.extend(lines)
    return tuple(records), xids


# ---------------------------------------------------------------------------------------------
# Lemon nodes


def _busy_intervals(jobs: Sequence[JobRecord], nodes: set[int]) -> dict[int, list[JobRecord]]:
    """Jobs of each of ``nodes``, by start time."""
    by_node: dict[int, list[JobRecord]] = {node: [] for node in nodes}
    for job in jobs:
        for node in job.nodes:
            if node in by_node:
                by_node[node].append(job)
    for runs in by_node.values():
        runs.sort(key=lambda job: job.start_ms)
    return by_node


def lemon_xids(
    config: SimulationConfig, lemons: Sequence[int], jobs: Sequence[JobRecord], rng: np.random.Generator
) -> list[XidRecord]:
    """Extra application XIDs of lemon nodes (``lemon_extra_xids_per_day`` per node-day).

    Each is logged by the job running on the node at that time (none while it is idle).
    """
    runs = _busy_intervals(jobs, set(lemons))
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


# ---------------------------------------------------------------------------------------------
# Benign noise: maintenance reboots, SBE blips


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
    runs = _busy_intervals(jobs, chosen_nodes)
    done: dict[int, list[int]] = {}
    out: list[MaintenanceRecord] = []
    for pick, ts_ms in zip(picks, times, strict=True):
        node = candidates[pick]
        reboot = _idle_time(runs[node], ts_ms, config.end_ms)
        if reboot is None or reboot + 6 * MS_PER_SECOND >= config.end_ms:
            continue
        if any(abs(reboot - other) < MS_PER_DAY for other in done.get(node, ())):
            continue
        done.setdefault(node, []).append(reboot)
        out.append(MaintenanceRecord(reboot, node))
    out.sort(key=lambda item: (item.ts_ms, item.node))
    return tuple(out)


def _idle_time(runs: list[JobRecord], from_ms: int, end_ms: int) -> int | None:
    """First whole second at or after ``from_ms`` with no job on the node within 10 minutes."""
    busy = [(job.start_ms, job.end_ms if job.end_ms is not None else end_ms) for job in runs]
    candidate = -(-from_ms // MS_PER_SECOND) * MS_PER_SECOND
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
