"""The split of the critical fault rate between healthy nodes, lemons and degradation failures.

``hardware_failure_rate`` stays the cluster-wide rate of critical faults per 1000 node-days.
Degradations that fail within the span take their expected share of it; the rest is split
between healthy nodes (rate ``b``) and lemons (``m x b``) so that, with ``L`` lemons out of ``N``
nodes, ``b x (1 + (m - 1) x L / N) + degradation share = hardware_failure_rate``
(:func:`fault_rates`). At the defaults (1.5% lemons, ``m = 15``) on 1000 nodes x 30 days:
``b`` ~ 4.98, lemons ~ 74.7, degradation failures ~ 0.48 per 1000 node-days.
"""

from __future__ import annotations

from typing import NamedTuple

from schemas.timeutil import DAY_MS
from stream.simulator.config import SimulationConfig

__all__ = ["FaultRates", "fault_rates"]


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
        config.ecc_degradation_min_days * DAY_MS,
        config.ecc_degradation_max_days * DAY_MS,
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
