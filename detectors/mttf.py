"""MTTF windows, job-size buckets and the paper's reliability model (SPEC 3).

Exposure is counted per job run and tumbling window as partial rows
(:class:`schemas.outputs.MttfPartial`); ClickHouse sums them. The formulas are those of
Kokolis et al. (HPCA 2025):

* failure rate ``r_f`` = hardware-attributed failures per node-day of exposure
  (reported per 1000 node-days);
* ``MTTF(N) = 1 / (N_nodes * r_f)`` for a job of N GPUs;
* ``E[ETTR] ~ (1 - N_nodes * r_f * (u0 + dt_cp / 2)) / (1 + w_cp / dt_cp)`` with the
  checkpoint interval that maximises it ``dt_cp* = sqrt(2 * w_cp / (N_nodes * r_f))``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

__all__ = [
    "SizeBuckets",
    "ettr",
    "optimal_checkpoint_interval_hours",
    "projected_mttf_hours",
    "window_slices",
]


@dataclass(frozen=True, slots=True)
class SizeBuckets:
    """Job-size buckets by GPU count; each bucket is named by its range.

    >>> buckets = SizeBuckets((1, 8, 64, 512, 1024, 4096))
    >>> buckets.label(1), buckets.label(8), buckets.label(600), buckets.label(16384)
    ('1-7', '8-63', '512-1023', '4096+')
    """

    lower_bounds: tuple[int, ...] = (1, 8, 64, 512, 1024, 4096)

    def __post_init__(self) -> None:
        bounds = self.lower_bounds
        if not bounds or bounds[0] < 1 or any(b >= c for b, c in pairwise(bounds)):
            raise ValueError(f"size buckets must be increasing GPU counts starting at >= 1, got {bounds}")

    def index(self, gpus: int) -> int:
        """Index of the bucket holding a job of ``gpus`` GPUs (jobs below the first bound go first)."""
        return max(bisect_right(self.lower_bounds, gpus) - 1, 0)

    def label(self, gpus: int) -> str:
        """Human name of the bucket of a job of ``gpus`` GPUs."""
        return self.labels[self.index(gpus)]

    def lower_bound(self, gpus: int) -> int:
        """Smallest GPU count of the bucket of a job of ``gpus`` GPUs (sorts the buckets)."""
        return self.lower_bounds[self.index(gpus)]

    @property
    def labels(self) -> tuple[str, ...]:
        """All bucket names in order."""
        return _bucket_labels(self.lower_bounds)


@cache
def _bucket_labels(bounds: tuple[int, ...]) -> tuple[str, ...]:
    names = [f"{low}-{high - 1}" if high - 1 > low else str(low) for low, high in pairwise(bounds)]
    names.append(f"{bounds[-1]}+")
    return tuple(names)


def window_slices(start_ms: int, end_ms: int, window_ms: int) -> Iterator[tuple[int, int]]:
    """Yield ``(window_start_ms, overlap_ms)`` for each tumbling window that [start, end) touches.

    >>> list(window_slices(1_800_000, 5_400_000, 3_600_000))
    [(0, 1800000), (3600000, 1800000)]
    """
    if end_ms <= start_ms:
        return
    window_start = start_ms - start_ms % window_ms
    while window_start < end_ms:
        window_end = window_start + window_ms
        yield window_start, min(end_ms, window_end) - max(start_ms, window_start)
        window_start = window_end


def projected_mttf_hours(gpus: int, rf_per_node_day: float, gpus_per_node: int = 8) -> float:
    """Project the MTTF of a job of ``gpus`` GPUs from a measured failure rate.

    >>> round(projected_mttf_hours(16384, 6.5 / 1000), 1)   # the paper's RSC-1, 16k GPUs
    1.8
    """
    nodes = max(gpus / gpus_per_node, 1.0)
    if rf_per_node_day <= 0:
        return math.inf
    return 24.0 / (nodes * rf_per_node_day)


def ettr(
    gpus: int,
    rf_per_node_day: float,
    checkpoint_interval_hours: float,
    checkpoint_write_hours: float,
    restart_overhead_hours: float,
    gpus_per_node: int = 8,
) -> float:
    """Expected effective training time ratio of a job (the paper's first-order model).

    >>> round(ettr(16384, 6.5 / 1000, 0.5, 1 / 60, 5 / 60), 3)
    0.789
    """
    nodes = max(gpus / gpus_per_node, 1.0)
    rate_per_hour = nodes * rf_per_node_day / 24.0
    lost = rate_per_hour * (restart_overhead_hours + checkpoint_interval_hours / 2)
    return max(0.0, (1.0 - lost) / (1.0 + checkpoint_write_hours / checkpoint_interval_hours))


def optimal_checkpoint_interval_hours(
    gpus: int, rf_per_node_day: float, checkpoint_write_hours: float, gpus_per_node: int = 8
) -> float:
    """Checkpoint interval that maximises :func:`ettr`: ``sqrt(2 w_cp / (N_nodes r_f))``.

    >>> round(optimal_checkpoint_interval_hours(16384, 6.5 / 1000, 1 / 60) * 60, 1)  # minutes
    14.7
    """
    nodes = max(gpus / gpus_per_node, 1.0)
    rate_per_hour = nodes * rf_per_node_day / 24.0
    if rate_per_hour <= 0:
        return math.inf
    return math.sqrt(2.0 * checkpoint_write_hours / rate_per_hour)
