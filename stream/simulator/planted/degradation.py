"""ECC degradation: a GPU whose correctable error rate grows until an uncorrectable error.

``ecc_degradation``
    A GPU whose correctable (SBE) error rate grows (by default exponentially: the shapes are
    :data:`stream.simulator.config.DEGRADATION_SHAPES`) for 2 to 7 days, from a few
    errors per 6-hour scrape to hundreds (the rate doubles every 6 hours to 1.6 days), then, in
    most cases, suffers an uncorrectable error: that failure is a ``critical_hw`` fault of the
    cluster (XID 48, 94 or 95, DBE counters +1, the running job dies, repair and reboot).
    The others keep degrading, at the final rate, to the end of the span. A degrading GPU is on
    a non-lemon node of its own where no other critical fault strikes from ``repair_max_hours``
    + 1 h before its start to 1 h after its failure, and no maintenance reboot at all, so its
    volatile counter rises without a reset; it is none of the steady or one-off SBE GPUs.

:func:`plan_degradations` plans them before the cluster runs (which strikes the failures);
:func:`degradation_record` writes the SBE errors of one as ECC events afterwards.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from schemas.timeutil import DAY_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.events import EccEvent, EccEventKind

__all__ = [
    "DEGRADATION_FAILURE_TEMPLATES",
    "FAULT_KIND_ECC_DEGRADATION",
    "DegradationPlan",
    "DegradationRecord",
    "degradation_record",
    "plan_degradations",
]

FAULT_KIND_ECC_DEGRADATION: Final = "ecc_degradation"

#: Templates (names in :data:`stream.simulator.faults.HARDWARE_FAULT_TEMPLATES`) of the
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
# A bursty degradation logs at its final rate for this share of its duration (at least an hour),
# then at an eighth of its initial rate.
_BURST_SHARE: Final = 0.05
_BURST_MIN_MS: Final = 3_600_000
#: The shapes ``mixed`` draws from.
MIXED_SHAPES: Final[tuple[str, ...]] = ("step", "linear", "exponential", "quadratic", "bursty", "slow_boil")


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
    shape: str = "exponential"

    @property
    def doubling_ms(self) -> float:
        """Time in which the SBE rate doubles."""
        return self.duration_ms / math.log2(self.final_rate / self.initial_rate)

    def expected_errors(self, from_ms: int, to_ms: int) -> float:
        """Expected SBE errors between two times (the rate's integral; flat after the duration)."""
        return max(0.0, self._cumulative(to_ms) - self._cumulative(from_ms))

    def _cumulative(self, ts_ms: int) -> float:
        elapsed = max(0, ts_ms - self.start_ms)
        duration = self.duration_ms
        grow = min(elapsed, duration)
        after = max(0, elapsed - duration)
        shape, low, high = self.shape, self.initial_rate, self.final_rate
        if shape == "step":
            total = high / 4.0 * elapsed
        elif shape == "bursty":
            burst = max(_BURST_MIN_MS, round(_BURST_SHARE * duration))
            total = high * min(elapsed, burst) + low / 8.0 * max(0, elapsed - burst)
        elif shape in ("linear", "quadratic", "slow_boil"):
            if shape == "quadratic":
                low, high = 0.0, high / 4.0
            elif shape == "slow_boil":
                low, high = low / 8.0, high / 10.0
            total = low * grow + (high - low) * grow * grow / (2.0 * duration) + high * after
        else:
            doubling = self.doubling_ms
            total = low * doubling / math.log(2) * (math.pow(2.0, grow / doubling) - 1.0)
            total += high * after
        return total / DAY_MS


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


def plan_degradations(
    config: SimulationConfig, lemons: Sequence[int], rng: np.random.Generator
) -> tuple[DegradationPlan, ...]:
    """Plan the degrading GPUs: ``ecc_degradation_gpu_fraction`` of the GPUs per 30 days.

    Each is on its own healthy (non-lemon) node; the start is uniform over the span, or over the
    ``ecc_degradation_underway_days`` before it (degradations under way when the history begins).

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
    if config.ecc_degradation_underway_days > 0:
        earliest = config.start_ms - round(config.ecc_degradation_underway_days * DAY_MS)
        starts = rng.integers(earliest, config.start_ms, size=count)
    else:
        starts = rng.integers(config.start_ms, config.end_ms, size=count)
    days = rng.uniform(config.ecc_degradation_min_days, config.ecc_degradation_max_days, size=count)
    fails = rng.random(count) < config.ecc_degradation_failure_probability
    initial = rng.uniform(*_DEGRADATION_INITIAL_RATE, size=count)
    final = rng.uniform(*_DEGRADATION_FINAL_RATE, size=count)
    names = [name for name, _ in DEGRADATION_FAILURE_TEMPLATES]
    weights = np.array([weight for _, weight in DEGRADATION_FAILURE_TEMPLATES])
    templates = rng.choice(len(names), size=count, p=weights / weights.sum())
    # Drawn last, and only for a mix, so that one shape leaves the draws of the others as they were.
    if config.ecc_degradation_shape == "mixed":
        shapes = [MIXED_SHAPES[int(k)] for k in rng.integers(0, len(MIXED_SHAPES), size=count)]
    else:
        shapes = [config.ecc_degradation_shape] * count
    order = sorted(range(count), key=lambda i: (int(starts[i]), int(nodes[i])))
    plans: list[DegradationPlan] = []
    for index, i in enumerate(order):
        start = int(starts[i])
        duration = round(float(days[i]) * DAY_MS)
        ends = start + duration
        failure = ends if bool(fails[i]) and config.start_ms < ends < config.end_ms else None
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
                shape=shapes[i],
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

    The first scrape interval gets at least one error (the onset shows); with the ``exponential``
    shape every later interval of an hour or more does too, so the counter rises at every 6-hour
    scrape; other shapes and shorter intervals get what the rate gives (a 30-second scrape of a
    GPU that corrects a few errors a day mostly shows none). The errors of the interval that holds the
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
        count = int(rng.poisson(plan.expected_errors(low, high)))
        if onset is None or (plan.shape == "exponential" and high - low >= _BURST_MIN_MS):
            count = max(1, count)
        if count == 0:
            continue
        events.append(EccEvent(high, EccEventKind.SBE, plan.node, plan.gpu, errors=count))
        total += count
        if onset is None:
            onset = scrape_ms[k]
    if onset is None:
        return None
    return DegradationRecord(plan, onset, failure_ms, fault_index, total)
