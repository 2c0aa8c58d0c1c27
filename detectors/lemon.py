"""Lemon nodes (SPEC 4.5): nodes that fail far more often than the fleet, by fleet statistics.

Kokolis et al. found 1.2% of nodes were lemons touching 13% of daily jobs. Their method, and
ours: per node, count reliability signals over a sliding window of event time (28 days), compare
each with the fleet's distribution, and flag the nodes whose signals sit far above it.

Signals per node (each an event count in the window):

``hw_incidents``
    hardware incidents opened on the node (one per fault episode, not per XID line);
``hw_failures``
    hardware-attributed job failures with evidence on the node;
``node_fails``
    NODE_FAIL ends of single-node jobs on the node (multi-node NODE_FAILs do not say which
    node, and count through ``hw_failures`` when there is evidence);
``failed_jobs``
    distinct failed jobs (FAILED or NODE_FAIL) that ran on the node.

Score: for each signal, how surprising the node's count is if it were an average node —
``-log10 P(Poisson(fleet mean) >= count)`` — summed over signals (Fisher-style evidence
combination). A node is a lemon when its score reaches the threshold *and* it had at least
``min_hardware`` hardware incidents or failures: fleet-wide noise in job failures alone never
makes a lemon. The verdict is re-evaluated each time the watermark crosses ``evaluate_every_ms``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["LemonConfig", "LemonTracker", "LemonVerdict", "poisson_surprise"]

SIGNALS = ("hw_incidents", "hw_failures", "node_fails", "failed_jobs")
DAY_MS = 86_400_000


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
    # P(N >= count) = 1 - sum_{k < count} pmf(k); summed in log space from the tail when the tail is tiny.
    log_pmf = [k * math.log(mean) - mean - math.lgamma(k + 1) for k in range(count)]
    below = sum(math.exp(value) for value in log_pmf)
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


@dataclass(frozen=True, slots=True)
class LemonConfig:
    """Tunables of lemon detection.

    Attributes
    ----------
    window_ms
        Sliding window of event time (the paper: 28 days).
    evaluate_every_ms
        How often verdicts are recomputed.
    threshold
        Summed surprise (``-log10`` probability) that makes a lemon.
    min_hardware
        Hardware incidents plus hardware failures a lemon must have, at least.
    """

    window_ms: int = 28 * DAY_MS
    evaluate_every_ms: int = DAY_MS
    threshold: float = 6.0
    min_hardware: int = 3


@dataclass(frozen=True, slots=True)
class LemonVerdict:
    """One node found to be a lemon at one evaluation."""

    node: str
    score: float
    counts: dict[str, int]
    fleet_means: dict[str, float]
    crossed: tuple[str, ...]
    jobs_hurt: tuple[str, ...]


@dataclass(slots=True)
class _Node:
    signals: dict[str, deque[int]] = field(default_factory=lambda: {s: deque() for s in SIGNALS})
    failed: deque[tuple[int, str]] = field(default_factory=deque)


class LemonTracker:
    """Per-node signal counts over a sliding window and the fleet comparison.

    Examples
    --------
    >>> tracker = LemonTracker(LemonConfig(threshold=4.0, min_hardware=2))
    >>> for n in range(50):
    ...     tracker.see_node(f"n{n}")
    >>> for day in range(4):
    ...     tracker.record("n7", "hw_incidents", day * DAY_MS)
    ...     tracker.record_failed_job("n7", f"j{day}", day * DAY_MS)
    >>> tracker.record("n3", "hw_incidents", 0)
    >>> [v.node for v in tracker.evaluate(5 * DAY_MS)]
    ['n7']
    """

    def __init__(self, config: LemonConfig) -> None:
        self.config = config
        self._nodes: dict[str, _Node] = {}

    def see_node(self, node: str) -> None:
        """Count a node in the fleet even if it never shows a signal (healthy nodes are the baseline)."""
        if node not in self._nodes:
            self._nodes[node] = _Node()

    def record(self, node: str, signal: str, ts_ms: int) -> None:
        """Count one occurrence of ``signal`` on ``node`` at event time ``ts_ms``."""
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        state.signals[signal].append(ts_ms)

    def record_failed_job(self, node: str, job_id: str, ts_ms: int) -> None:
        """A failed job ran on ``node``; counted once per job and node."""
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        if not any(job == job_id for _, job in state.failed):
            state.failed.append((ts_ms, job_id))
            state.signals["failed_jobs"].append(ts_ms)

    def _expire(self, now_ms: int) -> None:
        start = now_ms - self.config.window_ms
        for state in self._nodes.values():
            for times in state.signals.values():
                while times and times[0] <= start:
                    times.popleft()
            while state.failed and state.failed[0][0] <= start:
                state.failed.popleft()

    def evaluate(self, now_ms: int) -> list[LemonVerdict]:
        """Verdicts for the window ending at ``now_ms``: the lemons, in node order."""
        self._expire(now_ms)
        fleet = len(self._nodes)
        if fleet == 0:
            return []
        means = {s: sum(len(n.signals[s]) for n in self._nodes.values()) / fleet for s in SIGNALS}
        verdicts = []
        for name in sorted(self._nodes):
            state = self._nodes[name]
            counts = {s: len(state.signals[s]) for s in SIGNALS}
            if counts["hw_incidents"] + counts["hw_failures"] < self.config.min_hardware:
                continue
            surprises = {s: poisson_surprise(counts[s], means[s]) for s in SIGNALS}
            score = sum(surprises.values())
            if score < self.config.threshold:
                continue
            crossed = tuple(s for s in SIGNALS if surprises[s] >= 2.0)
            verdicts.append(
                LemonVerdict(
                    node=name,
                    score=score,
                    counts=counts,
                    fleet_means={s: round(means[s], 4) for s in SIGNALS},
                    crossed=crossed,
                    jobs_hurt=tuple(job for _, job in list(state.failed)[-20:]),
                )
            )
        return verdicts

    def __len__(self) -> int:
        return len(self._nodes)
