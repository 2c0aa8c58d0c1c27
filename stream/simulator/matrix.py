"""The scenario matrix: seedable cells of fault shapes, scrape intervals, fleet sizes and histories.

Each :class:`MatrixCell` is a :class:`~stream.simulator.config.SimulationConfig` recipe that
plants enough faults of one family (ECC degradations of one shape, XID storms of one density,
flapping NVLinks, lemons with few or many failures) for a score to mean something on a fleet of
its size, at one DCGM scrape interval and one history length; the ground truth comes with it
(``truth.json``), as for any simulation. The job-aware cells plant no fault but application
errors that follow a user: a user whose jobs crash wherever they run, one whose jobs all crash on
one node, a debug user on one node whose jobs fail a few times a day, and (a lemon cell)
crash-looping users on a fleet with lemons. The trace cell replays a real cluster's fault process
(:mod:`stream.simulator.trace`): its faults are the critical ones, its worst servers the lemons.
:func:`cell_config` makes the configuration of a cell for a seed.

Seeds are split: :data:`TUNING_SEEDS` are the ones the detectors' thresholds were tuned on (with
the project's long-standing seeds 1 to 3 at 1,000 nodes); :data:`HELD_OUT_SEEDS` were never looked
at while tuning, and the table in ``docs/detection.md`` reports them. :data:`QUICK_CELLS` is a
subset small enough for CI (a few minutes for every cell with one seed).

The module is pure: configurations in, no I/O (``faultstream evaluate --matrix`` runs the cells,
:mod:`stream.reports.matrix`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from stream.simulator.config import SimulationConfig
from stream.simulator.trace import TRACES, trace_overrides

__all__ = [
    "CELLS",
    "HELD_OUT_SEEDS",
    "QUICK_CELLS",
    "TUNING_SEEDS",
    "MatrixCell",
    "cell_config",
    "cells_named",
]

#: Seeds the detectors were tuned on.
TUNING_SEEDS: Final[tuple[int, ...]] = (1, 2)
#: Seeds never used while tuning: the reported ones.
HELD_OUT_SEEDS: Final[tuple[int, ...]] = (1001, 1002)

#: Healthy critical-fault rate per 1000 node-days (RSC-1), kept for the non-lemon nodes of a cell.
_HEALTHY_RATE: Final = 6.5


@dataclass(frozen=True, slots=True)
class MatrixCell:
    """One cell of the matrix.

    Attributes
    ----------
    name
        Unique, e.g. ``ecc-quadratic-15m-64n-14d``.
    family
        The truth kind the cell is about: ``ecc_degradation``, ``xid_storm`` (half of its storms
        a faulty GPU's, half a job's own: ``job_xid_storm``), ``nvlink_flapping``, ``lemon_node``
        or ``job_aware`` (no planted fault: crash-looping users, scored by the job-aware figures);
        every cell also has the background critical faults.
    nodes, days, scrape_minutes
        Fleet size, history length and DCGM scrape interval.
    overrides
        Further :class:`SimulationConfig` fields (the planted family's rates and shapes).
    lemon_faults
        For lemon cells: the critical faults a lemon is expected to log over the history (its
        fault-rate multiplier follows from it, and the healthy nodes keep RSC-1's rate).
    """

    name: str
    family: str
    nodes: int
    days: float
    scrape_minutes: float
    overrides: Mapping[str, Any] = field(default_factory=dict)
    lemon_faults: float = 0.0

    @property
    def kinds(self) -> tuple[str, ...]:
        """The truth kinds the cell is scored on, besides the critical faults every cell has."""
        if self.family == "xid_storm":
            return ("xid_storm", "job_xid_storm")
        if self.family == "job_aware":
            return ()
        return (self.family,)

    @property
    def big(self) -> bool:
        """More than 20,000 node-days: the matrix runs it with the first seed of a set only."""
        return self.nodes * self.days > 20_000


def _ecc(shape: str, scrape: float, nodes: int, days: float, tag: str = "", **extra: Any) -> MatrixCell:
    label = {0.5: "30s", 1: "1m", 15: "15m", 360: "6h"}.get(scrape, f"{scrape:g}m")
    if scrape <= 0:
        raise ValueError("scrape interval must be > 0")
    # About eight degradations per cell whatever the fleet: a share of its GPUs per 30 days.
    gpus = nodes * 8
    fraction = min(1.0, 8.0 / gpus * 30.0 / days)
    overrides: dict[str, Any] = {
        "ecc_degradation_shape": shape,
        "ecc_degradation_gpu_fraction": round(fraction, 6),
        **extra,
    }
    return MatrixCell(
        f"ecc-{shape}{tag}-{label}-{nodes}n-{days:g}d", "ecc_degradation", nodes, days, scrape, overrides
    )


def _storm(lines: tuple[int, int], minutes: tuple[float, float], nodes: int, days: float) -> MatrixCell:
    # About ten storms of faulty GPUs and ten of jobs per cell (a storm happens only on a busy
    # node: ~85% of the drawn ones).
    rate = 24.0 * 1000.0 / (nodes * days)
    return MatrixCell(
        f"storm-{lines[1]}l-{minutes[1]:g}min-{nodes}n-{days:g}d",
        "xid_storm",
        nodes,
        days,
        360,
        {
            "xid_storm_rate": round(rate, 4),
            "xid_storm_lines_min": lines[0],
            "xid_storm_lines_max": lines[1],
            "xid_storm_minutes_min": minutes[0],
            "xid_storm_minutes_max": minutes[1],
            "xid_storm_gpu_fraction": 0.5,
        },
    )


def _flap(nodes: int, days: float) -> MatrixCell:
    # About ten flapping links per cell, and the realistic negative case: half of the reboots
    # (repairs, maintenance) log a burst of the same NVLink XIDs as the links go down.
    rate = 10.0 * 1000.0 / (nodes * days)
    overrides = {"nvlink_flapping_rate": rate, "nvlink_reset_burst_probability": 0.5}
    return MatrixCell(f"flap-{nodes}n-{days:g}d", "nvlink_flapping", nodes, days, 360, overrides)


def _lemon(faults: float, nodes: int, days: float, lemons: int, **extra: Any) -> MatrixCell:
    kind = "few" if faults < 5 else "many"
    tag = "-crashloop" if extra.get("crash_loop_users") else ""
    return MatrixCell(
        f"lemon-{kind}{tag}-{nodes}n-{days:g}d",
        "lemon_node",
        nodes,
        days,
        360,
        {"lemon_node_fraction": lemons / nodes, **extra},
        lemon_faults=faults,
    )


def _aware(tag: str, nodes: int, days: float, **overrides: Any) -> MatrixCell:
    return MatrixCell(f"aware-{tag}-{nodes}n-{days:g}d", "job_aware", nodes, days, 360, overrides)


def _trace(name: str) -> MatrixCell:
    # Scored as a lemon cell: the trace's faults GPU telemetry shows, and its worst servers.
    source = TRACES[name]
    overrides = {k: v for k, v in trace_overrides(name).items() if k not in ("nodes", "days")}
    label = f"trace-{name}-{source.servers}n-{source.days:g}d"
    return MatrixCell(label, "lemon_node", source.servers, source.days, 360, overrides)


#: Every cell. Scrape intervals: 30 seconds (dcgm-exporter's default collection interval; the
#: cells write only the series that changed, so days of 30 s scrapes stay small), 15 minutes and
#: 6 hours.
CELLS: Final[tuple[MatrixCell, ...]] = (
    # ECC degradations: every shape at 15-minute scrapes, the quadratic rise at all three
    # intervals, and fleets and histories from 16 nodes x 7 days to 1,000 nodes x 30 days.
    *(_ecc(shape, 15, 64, 14) for shape in ("step", "linear", "exponential", "quadratic", "bursty")),
    _ecc("slow_boil", 15, 64, 21, ecc_degradation_min_days=3.0, ecc_degradation_max_days=10.0),
    _ecc("quadratic", 0.5, 16, 7, ecc_degradation_min_days=3.5, ecc_degradation_max_days=3.5),
    _ecc("quadratic", 15, 32, 7, ecc_degradation_min_days=3.5, ecc_degradation_max_days=3.5),
    _ecc("quadratic", 360, 64, 14),
    # Rises under way when the history begins (a replay of the last days' logs, a monitor switched
    # on mid-degradation): the GPU's own past already holds the rise; only the fleet shows it.
    _ecc(
        "quadratic",
        15,
        256,
        4,
        tag="-underway",
        # About three a seed: a few at once in 2,048 GPUs (Meta's rate is 0.3% of them in 30 days).
        ecc_degradation_gpu_fraction=0.011,
        ecc_degradation_underway_days=2.0,
        ecc_degradation_min_days=3.5,
        ecc_degradation_max_days=5.0,
    ),
    _ecc("mixed", 360, 1000, 30),
    _ecc("mixed", 15, 16, 90),
    # XID storms from 10 lines in minutes to 10,000 lines over a day.
    _storm((10, 20), (2.0, 10.0), 64, 14),
    _storm((40, 400), (20.0, 180.0), 64, 14),
    _storm((1000, 3000), (60.0, 360.0), 64, 14),
    _storm((5000, 10000), (600.0, 1440.0), 256, 7),
    # Flapping NVLinks.
    _flap(64, 14),
    _flap(5000, 3),
    # Lemons: few and many failures, short and long histories (the 32 nodes x 7 days).
    _lemon(5.0, 32, 7, 2),
    _lemon(3.0, 32, 7, 2),
    _lemon(4.0, 256, 30, 4),
    _lemon(10.0, 256, 30, 4),
    _lemon(3.0, 64, 3, 2),
    _lemon(12.0, 500, 90, 6),
    # Job-aware verdicts: application errors that follow a user are no node's fault. A user whose
    # jobs crash wherever they run; one whose every job runs, and crashes, on one node (the issue's
    # case, on the 96-node fleet); a debug user on one node whose jobs fail a few times a
    # day, most but not all of them, with one to five application XID lines each (no storm, never
    # five failures within a day); lemons with many users' failures beside a crash loop.
    _aware("anywhere", 256, 14, crash_loop_users=2),
    _aware("pinned", 96, 14, crash_loop_users=1, crash_loop_pinned_users=1),
    _aware(
        "pinned-debug",
        96,
        14,
        crash_loop_users=1,
        crash_loop_pinned_users=1,
        crash_loop_jobs_per_day=4.0,
        crash_loop_failed_fraction=0.75,
        crash_loop_max_lines=5,
    ),
    _lemon(10.0, 128, 21, 3, crash_loop_users=1),
    # A real fault process: InfiniteHBD-Trace, 584 faults on 400 GPU servers over 349 days.
    _trace("infinitehbd"),
)

#: Cells small enough for CI: a few minutes for all of them with one seed.
QUICK_CELLS: Final[tuple[str, ...]] = (
    "ecc-quadratic-15m-32n-7d",
    "ecc-exponential-15m-64n-14d",
    "storm-400l-180min-64n-14d",
    "lemon-many-32n-7d",
)


def cells_named(names: tuple[str, ...] | None = None) -> tuple[MatrixCell, ...]:
    """The cells with these names (every cell for ``None``), in matrix order.

    Raises
    ------
    KeyError
        For a name that is no cell.
    """
    if names is None:
        return CELLS
    known = {cell.name: cell for cell in CELLS}
    missing = [name for name in names if name not in known]
    if missing:
        raise KeyError(f"no such matrix cell: {', '.join(missing)}")
    return tuple(cell for cell in CELLS if cell.name in set(names))


def cell_config(cell: MatrixCell, seed: int, **overrides: Any) -> SimulationConfig:
    """The simulation of ``cell`` with ``seed``.

    Every cell writes only the DCGM series that changed (the detectors see the same counter
    changes as with full scrapes); a lemon cell sets the lemons' fault multiplier so that each
    is expected to log :attr:`MatrixCell.lemon_faults` critical faults, and raises the
    cluster-wide rate so that healthy nodes keep RSC-1's.

    >>> config = cell_config(cells_named(("lemon-many-32n-7d",))[0], seed=1001)
    >>> config.nodes, config.days, round(config.lemon_fault_multiplier, 1)
    (32, 7.0, 109.9)
    """
    fields: dict[str, Any] = {
        "nodes": cell.nodes,
        "days": cell.days,
        "seed": seed,
        "ecc_interval_minutes": cell.scrape_minutes,
        "dcgm_changed_only": True,
        **cell.overrides,
    }
    if cell.family == "lemon_node":
        multiplier = max(1.0, cell.lemon_faults / (_HEALTHY_RATE / 1000.0 * cell.days))
        lemons = round(float(fields["lemon_node_fraction"]) * cell.nodes)
        fields["lemon_fault_multiplier"] = multiplier
        fields["hardware_failure_rate"] = _HEALTHY_RATE * (1.0 + (multiplier - 1.0) * lemons / cell.nodes)
    fields.update(overrides)
    known = {item.name for item in dataclasses.fields(SimulationConfig)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown simulation fields: {', '.join(sorted(unknown))}")
    return SimulationConfig(**fields)
