"""How surprising a count is: the Poisson tail in ``-log10`` units, shared by the count detectors."""

from __future__ import annotations

import math

__all__ = ["poisson_surprise"]


def poisson_surprise(count: int, mean: float) -> float:
    """``-log10 P(N >= count)`` for ``N ~ Poisson(mean)``: 0 when unsurprising, large when rare.

    >>> poisson_surprise(0, 0.2)
    0.0
    >>> round(poisson_surprise(3, 0.2), 2)
    2.94
    """
    if count <= 0:
        return 0.0
    if mean <= 0:
        return 300.0
    # P(N >= count) = 1 - sum_{k < count} pmf(k), summed from the tail when the tail is tiny.
    # pmf(k) = pmf(k - 1) * mean / k is 3-4x cheaper than exp(log-pmf) per term (this runs for
    # every ECC sample's trend score) and agrees with it to ~1e-11; exp(-mean) underflows past
    # ~745, so large means stay in log space.
    if mean < 700.0:
        term = math.exp(-mean)
        below = term
        for k in range(1, count):
            term *= mean / k
            below += term
    else:
        log_mean = math.log(mean)
        below = sum(math.exp(k * log_mean - mean - math.lgamma(k + 1)) for k in range(count))
    if below < 0.999:
        return max(0.0, -math.log10(max(1.0 - below, 1e-300)))
    tail = 0.0
    k = count
    term = math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
    while term > tail * 1e-12 and k < count + 1000:
        tail += term
        k += 1
        term *= mean / k
    return -math.log10(max(tail, 1e-300))
