"""Lemon nodes (SPEC 4.5): nodes that fail far more often than the fleet, by fleet statistics.

Kokolis et al. found 1.2% of nodes were lemons touching 13% of daily jobs. Their method, and
ours: per node, count reliability signals over a sliding window of event time (28 days), compare
each with the fleet's distribution, and flag the nodes whose signals sit far above it.

Signals per node (each an event count in the window):

``xid_days``
    days with at least one XID on the node: the paper's XID count, made robust to storms (a
    storm of 300 lines is one bad day, a node that logs XIDs every day is a lemon);
``hw_incidents``
    critical hardware fault episodes on the node: critical incidents opened, those within
    ``episode_gap_ms`` of the previous one counted once (a GPU falling off the bus with a DBE and
    a row-remap failure is one fault, not three);
``hw_failures``
    hardware-attributed job failures with evidence on the node;
``node_fails``
    NODE_FAIL ends of single-node jobs on the node (multi-node NODE_FAILs do not say which
    node, and count through ``hw_failures`` when there is evidence);
``failed_jobs``
    distinct failed jobs (FAILED or NODE_FAIL) that ran on the node.

Score: for each signal, how surprising the node's count is if it were an average node —
``-log10 P(Poisson(expected) >= count)`` — summed over signals (Fisher-style evidence
combination). Faults strike a node whether or not it works, so the hardware signals expect the
fleet mean; XIDs and failed jobs come mostly with work (a node running ten times more small jobs
logs more of them), so ``xid_days`` and ``failed_jobs`` expect the fleet's rate per job run times
the node's job runs in the window.

A node is a lemon when its score reaches the threshold *and* at least one signal alone is
``min_signal_surprise`` surprising, and surprising enough for the fleet's size: many mildly
elevated counts that every busy node shows never add up to a lemon, and in a fleet of 5,000 a
one-in-a-thousand count happens to five healthy nodes. The verdict states its confidence,
``1 - fleet x P(strongest signal)``, and needs ``min_confidence``. The verdict is re-evaluated
each time the watermark crosses ``evaluate_every_ms``.

Decided with the history there is: verdicts start after ``min_history_ms`` (2 days), not a full
window. Each node's expectation is the rest of the fleet's rate per node-day times the node's
exposure (its time within the window since it was first seen), and for the hardware signals never
below a prior healthy rate (``prior_fault_rate``, RSC-1's): in a week-old fleet of 32 nodes that
has had two faults, a node with five is a lemon, and a node with one is not.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

from detectors.surprise import poisson_surprise
from schemas.timeutil import DAY_MS, HOUR_MS

__all__ = ["LemonConfig", "LemonTracker", "LemonVerdict"]

SIGNALS = ("xid_days", "hw_incidents", "hw_failures", "node_fails", "failed_jobs")
#: Signals whose expectation scales with the node's work (job runs) rather than with time.
LOAD_SCALED = frozenset({"xid_days", "failed_jobs"})


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
    min_signal_surprise
        Surprise that at least one signal must reach on its own.
    min_history_ms
        Event time watched before the first verdict. Short: the prior below keeps a young
        fleet, that has barely had any fault, from calling its first unlucky node a lemon.
    episode_gap_ms
        Critical incidents on a node closer than this are one fault episode.
    prior_fault_rate
        Critical faults per 1000 node-days a healthy node is expected to have at the least
        (RSC-1's 6.5): the hardware signals of a node expect at least this rate times its
        exposure, however few faults the fleet has had so far.
    trim_share
        Share of the fleet's top nodes of a signal left out of the reference a node is compared
        with (at least one, besides the node itself).
    min_confidence
        Confidence a verdict needs: ``1 - fleet x P(strongest signal)``, the chance that no
        healthy node of a fleet this size would show the node's strongest signal by luck.
    """

    window_ms: int = 28 * DAY_MS
    evaluate_every_ms: int = 6 * HOUR_MS
    threshold: float = 8.0
    min_signal_surprise: float = 3.0
    min_history_ms: int = 2 * DAY_MS
    episode_gap_ms: int = 6 * HOUR_MS
    prior_fault_rate: float = 6.5
    min_confidence: float = 0.9
    trim_share: float = 0.02


@dataclass(frozen=True, slots=True)
class LemonVerdict:
    """One node found to be a lemon at one evaluation.

    ``confidence`` is ``1 - fleet x P(strongest signal | an average node)``; ``exposure_days``
    the node's time in the window (the history the verdict had).
    """

    node: str
    score: float
    counts: dict[str, int]
    expected: dict[str, float]  # what an average node with this load and exposure would count
    crossed: tuple[str, ...]
    jobs_hurt: tuple[str, ...]
    confidence: float = 1.0
    exposure_days: float = 0.0


@dataclass(slots=True)
class _Node:
    signals: dict[str, deque[int]] = field(
        default_factory=lambda: {s: deque() for s in (*SIGNALS, "job_runs")}
    )
    failed: deque[tuple[int, str]] = field(default_factory=deque)
    first_ms: int | None = None  # first fact about the node: its exposure starts here


class LemonTracker:
    """Per-node signal counts over a sliding window and the fleet comparison.

    Examples
    --------
    >>> tracker = LemonTracker(LemonConfig(threshold=6.0, min_history_ms=0))
    >>> for n in range(50):
    ...     tracker.see_node(f"n{n}", 0)
    >>> for day in range(4):                      # a fault every day on n7
    ...     tracker.record("n7", "hw_incidents", day * DAY_MS)
    ...     _ = tracker.record_failed_job("n7", f"j{day}", day * DAY_MS)
    >>> tracker.record("n3", "hw_incidents", 0)   # one fault on n3: bad luck, not a lemon
    >>> [v.node for v in tracker.evaluate(5 * DAY_MS)]
    ['n7']
    """

    def __init__(self, config: LemonConfig) -> None:
        self.config = config
        self._nodes: dict[str, _Node] = {}
        self._first_ms: int | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a worker checkpoint from before exposure and confidence: the settings it
        lacks take their defaults, and its nodes count as seen since the tracker's first fact."""
        old = state["config"]
        known = {f.name: getattr(old, f.name) for f in fields(LemonConfig) if hasattr(old, f.name)}
        state["config"] = LemonConfig(**known)
        for node in state["_nodes"].values():
            if not hasattr(node, "first_ms"):
                node.first_ms = state.get("_first_ms")
        self.__dict__.update(state)

    def see_node(self, node: str, ts_ms: int) -> None:
        """Count a node in the fleet even if it never shows a signal (healthy nodes are the baseline)."""
        self._node(node, ts_ms)

    def _node(self, node: str, ts_ms: int) -> _Node:
        if self._first_ms is None or ts_ms < self._first_ms:
            self._first_ms = ts_ms
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        if state.first_ms is None or ts_ms < state.first_ms:
            state.first_ms = ts_ms
        return state

    def record(self, node: str, signal: str, ts_ms: int) -> None:
        """Count one occurrence of ``signal`` on ``node`` at event time ``ts_ms``."""
        times = self._node(node, ts_ms).signals[signal]
        if signal == "hw_incidents" and times and ts_ms - times[-1] < self.config.episode_gap_ms:
            return  # the same fault episode
        times.append(ts_ms)

    def record_xid(self, node: str, ts_ms: int) -> bool:
        """An XID on ``node``: counted once per day (``xid_days``); whether it opened its day."""
        state = self._node(node, ts_ms)
        day = ts_ms - ts_ms % DAY_MS
        days = state.signals["xid_days"]
        if not days or days[-1] < day:
            days.append(day)
            return True
        return False

    def record_failed_job(self, node: str, job_id: str, ts_ms: int) -> bool:
        """A failed job ran on ``node``; counted once per job and node (whether it was counted now)."""
        state = self._node(node, ts_ms)
        if not any(job == job_id for _, job in state.failed):
            state.failed.append((ts_ms, job_id))
            state.signals["failed_jobs"].append(ts_ms)
            return True
        return False

    def forget(self, node: str, signal: str, ts_ms: int, job_id: str = "") -> None:
        """Take back one signal :meth:`record`, :meth:`record_xid` or :meth:`record_failed_job`
        counted (nothing if the window has dropped it already).

        >>> tracker = LemonTracker(LemonConfig())
        >>> tracker.record_failed_job("n1", "7", 1_000)
        True
        >>> tracker.forget("n1", "failed_jobs", 1_000, "7")
        >>> tracker.record_failed_job("n1", "7", 1_000)  # counted afresh: it was taken back
        True
        """
        state = self._nodes.get(node)
        if state is None:
            return
        times = state.signals[signal]
        value = ts_ms - ts_ms % DAY_MS if signal == "xid_days" else ts_ms
        if value in times:
            times.remove(value)
        if signal == "failed_jobs" and (ts_ms, job_id) in state.failed:
            state.failed.remove((ts_ms, job_id))

    def _expire(self, now_ms: int) -> None:
        start = now_ms - self.config.window_ms
        for state in self._nodes.values():
            for times in state.signals.values():
                while times and times[0] <= start:
                    times.popleft()
            while state.failed and state.failed[0][0] <= start:
                state.failed.popleft()

    def evaluate(self, now_ms: int) -> list[LemonVerdict]:
        """Verdicts for the window ending at ``now_ms``: the lemons, in node order.

        Each node is compared with the rest of the fleet without its top nodes (in a fleet of 32,
        two lemons would otherwise raise the mean they are compared with), scaled to its exposure
        (time in the window, since its first fact) and, for the load-scaled signals, its work.
        """
        self._expire(now_ms)
        fleet = len(self._nodes)
        if fleet == 0 or self._first_ms is None or now_ms - self._first_ms < self.config.min_history_ms:
            return []
        start = now_ms - self.config.window_ms
        exposure = {
            name: max(now_ms - max(start, state.first_ms if state.first_ms is not None else now_ms), 0)
            / DAY_MS
            for name, state in self._nodes.items()
        }
        names = (*SIGNALS, "job_runs")
        counts_of = {name: {s: len(state.signals[s]) for s in names} for name, state in self._nodes.items()}
        totals = {s: sum(c[s] for c in counts_of.values()) for s in names}
        total_exposure = sum(exposure.values())
        # The reference leaves out the node itself and the fleet's top nodes of each signal (2%,
        # at least one): in a week-old fleet of 32, another lemon must not make a lemon look usual.
        trim = max(1, math.ceil(self.config.trim_share * fleet))
        tops = {s: _top_nodes(counts_of, s, trim + 1) for s in names}
        # Counts and exposure of the top ``trim`` and ``trim + 1`` nodes of each signal.
        top_counts = {
            s: (sum(counts_of[n][s] for n in tops[s][:trim]), sum(counts_of[n][s] for n in tops[s]))
            for s in names
        }
        top_days = {
            s: (sum(exposure[n] for n in tops[s][:trim]), sum(exposure[n] for n in tops[s])) for s in names
        }
        prior = self.config.prior_fault_rate / 1000.0
        min_surprise = max(
            self.config.min_signal_surprise,
            math.log10(fleet) - math.log10(1.0 - self.config.min_confidence),
        )
        verdicts = []
        for name in sorted(self._nodes):
            state = self._nodes[name]
            counts = {s: len(state.signals[s]) for s in SIGNALS}
            if not any(counts.values()) and self.config.threshold > 0:
                continue  # nothing seen: every surprise is 0 (most of a healthy fleet)
            days = exposure[name]
            rates = {}
            for s in names:
                if name in tops[s]:  # the node is one of the top: leave the top trim + 1 out
                    count, others = top_counts[s][1], top_days[s][1]
                else:
                    count, others = top_counts[s][0] + counts_of[name][s], top_days[s][0] + days
                others = total_exposure - others
                rates[s] = (totals[s] - count) / others if others > 0 else 0.0
            runs = len(state.signals["job_runs"])
            load = (runs + 1) / (rates["job_runs"] * days + 1)
            expected = {
                s: rates[s] * days * load if s in LOAD_SCALED else max(rates[s], prior) * days
                for s in SIGNALS
            }
            surprises = {s: poisson_surprise(counts[s], expected[s]) for s in SIGNALS}
            score = sum(surprises.values())
            strongest = max(surprises.values())
            if score < self.config.threshold or strongest < min_surprise:
                continue
            crossed = tuple(s for s in SIGNALS if surprises[s] >= 2.0)
            verdicts.append(
                LemonVerdict(
                    node=name,
                    score=score,
                    counts=counts,
                    expected={s: round(expected[s], 4) for s in SIGNALS},
                    crossed=crossed,
                    jobs_hurt=tuple(job for _, job in list(state.failed)[-20:]),
                    confidence=max(0.0, 1.0 - fleet * 10.0 ** (-strongest)),
                    exposure_days=round(days, 3),
                )
            )
        return verdicts


def _top_nodes(counts_of: dict[str, dict[str, int]], signal: str, count: int) -> list[str]:
    """The ``count`` nodes with the most of ``signal`` (ties by name: deterministic)."""
    return sorted(counts_of, key=lambda node: (-counts_of[node][signal], node))[:count]
