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
``min_signal_surprise`` surprising: many mildly elevated counts that every busy node shows never
add up to a lemon. The verdict is re-evaluated each time the watermark crosses
``evaluate_every_ms``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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
        Event time watched before the first verdict: with a day of history, one fault is an
        outlier of a fleet that has barely had any.
    episode_gap_ms
        Critical incidents on a node closer than this are one fault episode.
    """

    window_ms: int = 28 * DAY_MS
    evaluate_every_ms: int = DAY_MS
    threshold: float = 8.0
    min_signal_surprise: float = 4.0
    min_history_ms: int = 7 * DAY_MS
    episode_gap_ms: int = 6 * HOUR_MS


@dataclass(frozen=True, slots=True)
class LemonVerdict:
    """One node found to be a lemon at one evaluation."""

    node: str
    score: float
    counts: dict[str, int]
    expected: dict[str, float]  # what an average node with this load would count
    crossed: tuple[str, ...]
    jobs_hurt: tuple[str, ...]


@dataclass(slots=True)
class _Node:
    signals: dict[str, deque[int]] = field(
        default_factory=lambda: {s: deque() for s in (*SIGNALS, "job_runs")}
    )
    failed: deque[tuple[int, str]] = field(default_factory=deque)


class LemonTracker:
    """Per-node signal counts over a sliding window and the fleet comparison.

    Examples
    --------
    >>> tracker = LemonTracker(LemonConfig(threshold=6.0, min_history_ms=0))
    >>> for n in range(50):
    ...     tracker.see_node(f"n{n}", 0)
    >>> for day in range(4):                      # a fault every day on n7
    ...     tracker.record("n7", "hw_incidents", day * DAY_MS)
    ...     tracker.record_failed_job("n7", f"j{day}", day * DAY_MS)
    >>> tracker.record("n3", "hw_incidents", 0)   # one fault on n3: bad luck, not a lemon
    >>> [v.node for v in tracker.evaluate(5 * DAY_MS)]
    ['n7']
    """

    def __init__(self, config: LemonConfig) -> None:
        self.config = config
        self._nodes: dict[str, _Node] = {}
        self._first_ms: int | None = None

    def see_node(self, node: str, ts_ms: int) -> None:
        """Count a node in the fleet even if it never shows a signal (healthy nodes are the baseline)."""
        self._node(node, ts_ms)

    def _node(self, node: str, ts_ms: int) -> _Node:
        if self._first_ms is None or ts_ms < self._first_ms:
            self._first_ms = ts_ms
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        return state

    def record(self, node: str, signal: str, ts_ms: int) -> None:
        """Count one occurrence of ``signal`` on ``node`` at event time ``ts_ms``."""
        times = self._node(node, ts_ms).signals[signal]
        if signal == "hw_incidents" and times and ts_ms - times[-1] < self.config.episode_gap_ms:
            return  # the same fault episode
        times.append(ts_ms)

    def record_xid(self, node: str, ts_ms: int) -> None:
        """An XID on ``node``: counted once per day (``xid_days``)."""
        state = self._node(node, ts_ms)
        day = ts_ms - ts_ms % DAY_MS
        days = state.signals["xid_days"]
        if not days or days[-1] < day:
            days.append(day)

    def record_failed_job(self, node: str, job_id: str, ts_ms: int) -> None:
        """A failed job ran on ``node``; counted once per job and node."""
        state = self._node(node, ts_ms)
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
        if fleet == 0 or self._first_ms is None or now_ms - self._first_ms < self.config.min_history_ms:
            return []
        means = {
            s: sum(len(n.signals[s]) for n in self._nodes.values()) / fleet for s in (*SIGNALS, "job_runs")
        }
        verdicts = []
        for name in sorted(self._nodes):
            state = self._nodes[name]
            counts = {s: len(state.signals[s]) for s in SIGNALS}
            load = (len(state.signals["job_runs"]) + 1) / (means["job_runs"] + 1)
            expected = {s: means[s] * load if s in LOAD_SCALED else means[s] for s in SIGNALS}
            surprises = {s: poisson_surprise(counts[s], expected[s]) for s in SIGNALS}
            score = sum(surprises.values())
            if score < self.config.threshold or max(surprises.values()) < self.config.min_signal_surprise:
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
                )
            )
        return verdicts
