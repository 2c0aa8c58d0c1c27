"""How surprising a count is: the Poisson tail in ``-log10`` units, shared by the count detectors, and
the binomial lower tail (how unlikely so few failures among so many runs are)."""

from __future__ import annotations

import math

__all__ = ["binomial_at_most", "poisson_surprise"]


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


def binomial_at_most(count: int, trials: int, p: float) -> float:
    """``P(N <= count)`` for ``N ~ Binomial(trials, p)``: how likely as few as ``count`` successes are.

    >>> binomial_at_most(0, 4, 0.5), binomial_at_most(0, 1, 1.0), binomial_at_most(3, 3, 0.9)
    (0.0625, 0.0, 1.0)
    >>> round(binomial_at_most(1, 10, 0.6), 5)
    0.00168
    """
    if count >= trials or p <= 0.0:
        return 1.0
    if count < 0:
        return 0.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for k in range(count + 1):
        log_comb = math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
        total += math.exp(log_comb + k * log_p + (trials - k) * log_q)
    return min(total, 1.0)
