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

import bisect
import heapq
import math
import operator
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

from detectors.surprise import poisson_surprise
from schemas.timeutil import DAY_MS, HOUR_MS

__all__ = ["LemonConfig", "LemonTracker", "LemonVerdict"]

SIGNALS = ("xid_days", "hw_incidents", "hw_failures", "node_fails", "failed_jobs")
#: Signals whose expectation scales with the node's work (job runs) rather than with time.
LOAD_SCALED = frozenset({"xid_days", "failed_jobs"})
#: A node's signal deques in SIGNALS order, then its job runs (what evaluate counts).
_ALL_SIGNALS = operator.itemgetter(*SIGNALS, "job_runs")
_LOAD_SCALED = tuple(signal in LOAD_SCALED for signal in SIGNALS)
#: New nodes up to this many are inserted into the name order one by one, more are sorted in.
_FEW_NODES = 64


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
    first_ms: int | None = None  # first fact about the node
    # Whether routine telemetry (an ECC sample, a job run, the inventory) showed the node: then its
    # exposure starts with its first fact; a node named only by its failures (an XID) is taken as
    # part of the fleet since the fleet's history began.
    present: bool = False
    # The jobs of ``failed`` (one entry a job), asked of each failed job: a node where a user's
    # sweep crashes sees thousands within the window.
    failed_jobs: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Derived:
    """What :meth:`LemonTracker.evaluate` derives from the nodes' signals, kept between evaluations
    (never pickled: rebuilt from the signals after a restore)."""

    #: Node names in the tracker's order, their index, and the indexes in name order.
    names: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    by_name: list[int] = field(default_factory=list)
    #: Per index: the count of each signal (SIGNALS, then job runs) and the exposure in days of a
    #: node telemetry showed (0.0 for the others: theirs is ``fleet_days``); every node's sum.
    counts: list[tuple[int, ...]] = field(default_factory=list)
    exposure: list[float] = field(default_factory=list)
    total_exposure: float = 0.0
    #: Indexes of the nodes telemetry showed whose exposure may still grow (it starts within the
    #: window); of the nodes it did not show, whose exposure is the fleet's time in the window.
    young: set[int] = field(default_factory=set)
    absent: set[int] = field(default_factory=set)
    fleet_days: float = -1.0
    #: The fleet's total of each count.
    totals: list[int] = field(default_factory=lambda: [0] * (len(SIGNALS) + 1))
    #: Nodes holding any signal in the window; nodes with a new fact since the last derivation;
    #: nodes whose counts or failed jobs changed since the last evaluation.
    holding: set[str] = field(default_factory=set)
    #: The job runs of each node that has any in the window.
    runs: dict[str, int] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)
    #: Each holding node's oldest signal time, when it was derived (a heap: it leaves the window
    #: nothing that old any more is dropped when it comes up).
    expiries: list[tuple[int, str]] = field(default_factory=list)
    #: The verdicts of the last evaluation at the prior floor (see :meth:`LemonTracker._at_floor`),
    #: by node; the nodes whose score reached the threshold (whether a verdict or not, only the
    #: fleet's size decides then); and the fleet size they were decided at.
    floor_verdicts: dict[str, LemonVerdict] = field(default_factory=dict)
    floor_candidates: set[str] = field(default_factory=set)
    floor_of: int | None = None


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
        self._derived: _Derived | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The tracker's state without what :meth:`evaluate` derives from it (rebuilt after a restore)."""
        state = self.__dict__.copy()
        state.pop("_derived", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a worker checkpoint from before exposure and confidence: the settings it
        lacks take their defaults, and its nodes count as seen since the tracker's first fact."""
        old = state["config"]
        known = {f.name: getattr(old, f.name) for f in fields(LemonConfig) if hasattr(old, f.name)}
        state["config"] = LemonConfig(**known)
        for node in state["_nodes"].values():
            if not hasattr(node, "first_ms"):
                node.first_ms = state.get("_first_ms")
            if not hasattr(node, "failed_jobs"):
                node.failed_jobs = {job for _, job in node.failed}
            if not hasattr(node, "present"):
                node.present = True  # its exposure started with its first fact, as it did then
        self.__dict__.update(state)
        self._derived = None

    def see_node(self, node: str, ts_ms: int, present: bool = True) -> None:
        """Count a node in the fleet even if it never shows a signal (healthy nodes are the baseline).

        ``present``: routine telemetry showed the node at ``ts_ms`` (its exposure starts no later);
        false for a record that names it without saying since when it is in the fleet (an XID).
        """
        state = self._node(node, ts_ms)
        if present and not state.present:
            state.present = True

    def know_node(self, node: str) -> None:
        """A node of the fleet's inventory: in the fleet since its history began, failing or not
        (without an inventory, a fleet known only by its failures is all failing nodes)."""
        if node not in self._nodes:
            self._nodes[node] = _Node()
            if self._derived is not None:
                self._derived.touched.add(node)

    def _node(self, node: str, ts_ms: int) -> _Node:
        if self._first_ms is None or ts_ms < self._first_ms:
            self._first_ms = ts_ms
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        if state.first_ms is None or ts_ms < state.first_ms:
            state.first_ms = ts_ms
        if self._derived is not None:
            self._derived.touched.add(node)
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
        if job_id not in state.failed_jobs:
            state.failed_jobs.add(job_id)
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
        if self._derived is not None:
            self._derived.touched.add(node)
        times = state.signals[signal]
        value = ts_ms - ts_ms % DAY_MS if signal == "xid_days" else ts_ms
        if value in times:
            times.remove(value)
        if signal == "failed_jobs" and (ts_ms, job_id) in state.failed:
            state.failed.remove((ts_ms, job_id))
            state.failed_jobs.discard(job_id)

    def _expire(self, now_ms: int, derived: _Derived) -> None:
        """Drop what left the window: from the nodes touched since the last evaluation, and from
        those whose oldest signal is due (the others hold nothing that old)."""
        start = now_ms - self.config.window_ms
        nodes = self._nodes
        due = set(derived.touched)
        expiries = derived.expiries
        while expiries and expiries[0][0] <= start:
            due.add(heapq.heappop(expiries)[1])
        for name in due:
            state = nodes[name]
            for times in state.signals.values():
                if times and times[0] <= start:
                    while times and times[0] <= start:
                        times.popleft()
                    derived.touched.add(name)
            while state.failed and state.failed[0][0] <= start:
                state.failed_jobs.discard(state.failed.popleft()[1])
                derived.touched.add(name)
            oldest = min((times[0] for times in state.signals.values() if times), default=None)
            if oldest is not None:
                heapq.heappush(expiries, (oldest, name))

    def _derive(self, now_ms: int) -> _Derived:
        """The per-node counts and exposures evaluate reads, brought up to date: only the nodes
        touched since the last evaluation and those whose signals leave the window are looked at,
        so an evaluation costs what changed, not the fleet."""
        derived = self._derived
        if derived is None:
            derived = self._derived = _Derived()
            derived.touched.update(self._nodes)
        nodes = self._nodes
        if len(derived.names) < len(nodes):  # nodes are only ever added, in the dict's order
            added = list(nodes)[len(derived.names) :]
            for name in added:
                index = len(derived.names)
                derived.index[name] = index
                derived.names.append(name)
                derived.counts.append((0,) * (len(SIGNALS) + 1))
                derived.exposure.append(0.0)
                if len(added) <= _FEW_NODES:
                    bisect.insort(derived.by_name, index, key=derived.names.__getitem__)
                derived.touched.add(name)
            if len(added) > _FEW_NODES:  # an inventory: one sort, not an insertion each
                derived.by_name.extend(range(len(derived.names) - len(added), len(derived.names)))
                derived.by_name.sort(key=derived.names.__getitem__)
        self._expire(now_ms, derived)
        totals = derived.totals
        for name in derived.touched:
            index = derived.index[name]
            counts = tuple(map(len, _ALL_SIGNALS(nodes[name].signals)))
            for signal, (old, new) in enumerate(zip(derived.counts[index], counts, strict=True)):
                totals[signal] += new - old
            derived.counts[index] = counts
            if any(counts):
                derived.holding.add(name)
            else:
                derived.holding.discard(name)
            if counts[len(SIGNALS)]:
                derived.runs[name] = counts[len(SIGNALS)]
            else:
                derived.runs.pop(name, None)
        # A node's exposure starts with its first fact when telemetry showed it, else with the
        # fleet's history: a history of failures names a node first by its first failure, and
        # judging that failure against the few hours since would make every failing node a lemon.
        first_ms = self._first_ms
        start = now_ms - self.config.window_ms
        exposure = derived.exposure
        young, absent = derived.young, derived.absent
        fleet_days = 0.0 if first_ms is None else max(now_ms - max(start, first_ms), 0) / DAY_MS
        moved = False
        for name in derived.touched:
            index = derived.index[name]
            if nodes[name].present:
                if index in absent:
                    absent.discard(index)
                    moved = True
                young.add(index)  # its first fact may have moved: its exposure is recomputed below
            elif index not in absent:
                absent.add(index)  # its exposure is the fleet's: ``exposure`` keeps 0.0 for it
                moved = True
        derived.changed |= derived.touched
        derived.touched.clear()
        if fleet_days != derived.fleet_days:  # the nodes without telemetry, all at once
            derived.fleet_days = fleet_days
            derived.changed.update(name for name in derived.holding if not nodes[name].present)
            moved = True
        for index in list(young):
            name = derived.names[index]
            since = nodes[name].first_ms
            if since is None:
                since = now_ms
            days = max(now_ms - max(start, since), 0) / DAY_MS
            if days != exposure[index]:
                exposure[index] = days
                derived.changed.add(name)
                moved = True
            if since <= start:
                young.discard(index)  # a full window from now on: its exposure no longer changes
        if moved:
            # The exposures in the tracker's order (as the scores add up), the fleet's for the
            # nodes without telemetry added at once.
            derived.total_exposure = sum(exposure) + len(absent) * fleet_days
        return derived

    @staticmethod
    def _exposures(derived: _Derived) -> list[float]:
        """Every node's exposure by index (the fleet's time in the window for those without telemetry)."""
        absent, days = derived.absent, derived.fleet_days
        if not absent:
            return derived.exposure
        return [days if index in absent else own for index, own in enumerate(derived.exposure)]

    def _at_floor(self, derived: _Derived, days: float, trim: int) -> bool:
        """Whether every node's expectation of every signal is the prior floor (``prior x days``):
        the fleet's rate of each signal, whichever nodes the reference leaves out, is below the
        prior rate, and so is the rate times the largest work a node can have done. Then a node's
        verdict depends on its own counts and exposure and the fleet's size only — the case of a
        long sparse history, where most evaluations need look at nothing but what changed."""
        prior = self.config.prior_fault_rate / 1000.0
        if self.config.threshold <= 0 or prior <= 0:
            return False
        # The rate a node's reference sees is (total - left-out counts) / (the fleet's exposure -
        # the left-out nodes' exposure): at most the total over the exposure of all but trim + 2.
        others = derived.total_exposure - (trim + 2) * days
        totals = derived.totals
        load = max(derived.runs.values(), default=0) + 1  # no node's load is above its runs + 1
        for signal, total in enumerate(totals[: len(SIGNALS)]):
            if not total:
                continue
            if others <= 0:
                return False
            bound = total / others * (1.0 + 1e-9)  # a margin for the rounding of the exact rates
            if _LOAD_SCALED[signal]:
                bound *= load
            if bound >= prior:
                return False
        return True

    def evaluate(self, now_ms: int) -> list[LemonVerdict]:
        """Verdicts for the window ending at ``now_ms``: the lemons, in node order.

        Each node is compared with the rest of the fleet without its top nodes (in a fleet of 32,
        two lemons would otherwise raise the mean they are compared with), scaled to its exposure
        (the fleet's time in the window) and, for the load-scaled signals, its work.
        """
        derived = self._derive(now_ms)
        fleet = len(self._nodes)
        if fleet == 0 or self._first_ms is None or now_ms - self._first_ms < self.config.min_history_ms:
            derived.changed.clear()
            derived.floor_of = None
            return []
        # No node's exposure is longer than the fleet's time in the window.
        start = now_ms - self.config.window_ms
        days = max(now_ms - max(start, self._first_ms), 0) / DAY_MS
        trim = max(1, math.ceil(self.config.trim_share * fleet))
        min_surprise = max(
            self.config.min_signal_surprise,
            math.log10(fleet) - math.log10(1.0 - self.config.min_confidence),
        )
        if self._at_floor(derived, days, trim):
            return self._evaluate_at_floor(derived, fleet, min_surprise)
        derived.floor_of = None
        derived.changed.clear()
        return self._evaluate_all(derived, trim, min_surprise)

    def _evaluate_at_floor(self, derived: _Derived, fleet: int, min_surprise: float) -> list[LemonVerdict]:
        """The verdicts when every expectation is the prior floor: the last evaluation's, with the
        nodes whose counts or exposure changed since scored again. A score then does not depend on
        the fleet: when the fleet grew, only the nodes whose score reached the threshold are
        decided again (their confidence and the surprise a signal needs depend on its size)."""
        verdicts, candidates = derived.floor_verdicts, derived.floor_candidates
        if derived.floor_of is None:
            verdicts.clear()
            candidates.clear()
            rescore = set(derived.holding)
        else:
            rescore = derived.changed & derived.holding
            for name in derived.changed - derived.holding:
                verdicts.pop(name, None)
                candidates.discard(name)
        if derived.floor_of != fleet:
            rescore |= candidates
            derived.floor_of = fleet
        prior = self.config.prior_fault_rate / 1000.0
        for name in rescore:
            index = derived.index[name]
            days = derived.fleet_days if index in derived.absent else derived.exposure[index]
            expected = [prior * days] * len(SIGNALS)
            score, verdict = self._verdict(name, derived.counts[index], expected, days, fleet, min_surprise)
            if score >= self.config.threshold:
                candidates.add(name)
            else:
                candidates.discard(name)
            if verdict is None:
                verdicts.pop(name, None)
            else:
                verdicts[name] = verdict
        derived.changed.clear()
        return [verdicts[name] for name in sorted(verdicts)]

    def _evaluate_all(self, derived: _Derived, trim: int, min_surprise: float) -> list[LemonVerdict]:
        """Every node holding a signal scored against the fleet's rates (see :meth:`evaluate`)."""
        # Node by node in the tracker's order (the float sums below add in that order), by index:
        # each node's exposure in days and its count of each signal (SIGNALS, then job_runs).
        names = derived.names
        exposure = self._exposures(derived)
        counts_of = derived.counts
        totals = derived.totals
        total_exposure = derived.total_exposure
        by_name = derived.by_name
        fleet = len(names)
        # The nodes holding any signal, in name order: the only ones that can rank above another
        # by a count, or be a lemon.
        holding = sorted((derived.index[name] for name in derived.holding), key=names.__getitem__)
        # The reference leaves out the node itself and the fleet's top nodes of each signal (2%,
        # at least one): in a week-old fleet of 32, another lemon must not make a lemon look usual.
        tops: list[frozenset[int]] = []
        # Counts and exposure of the top ``trim`` and ``trim + 1`` nodes of each signal.
        top_counts: list[tuple[int, int]] = []
        top_days: list[tuple[float, float]] = []
        for signal in range(len(totals)):
            # The fleet's nodes by count, highest first, ties in name order: those with a count
            # (sorted stably), then those without, in name order, as many as the top needs.
            counted = [i for i in holding if counts_of[i][signal]]
            counted.sort(key=lambda i: -counts_of[i][signal])
            top = counted[: trim + 1]
            if len(top) < trim + 1:
                for index in by_name:
                    if not counts_of[index][signal]:
                        top.append(index)
                        if len(top) == trim + 1:
                            break
            tops.append(frozenset(top))
            top_counts.append(
                (sum(counts_of[i][signal] for i in top[:trim]), sum(counts_of[i][signal] for i in top))
            )
            top_days.append((sum(exposure[i] for i in top[:trim]), sum(exposure[i] for i in top)))
        prior = self.config.prior_fault_rate / 1000.0
        runs_index = len(SIGNALS)  # where a node's job runs are in its counts
        verdicts = []
        # With a positive threshold a node without signals is never a lemon (its surprises are 0).
        for index in holding if self.config.threshold > 0 else by_name:
            counts = counts_of[index]
            if not any(counts[:runs_index]) and self.config.threshold > 0:
                continue  # nothing seen: every surprise is 0 (most of a healthy fleet)
            days = exposure[index]
            rates = []
            for signal, total in enumerate(totals):
                if index in tops[signal]:  # the node is one of the top: leave the top trim + 1 out
                    count, others = top_counts[signal][1], top_days[signal][1]
                else:
                    count, others = top_counts[signal][0] + counts[signal], top_days[signal][0] + days
                others = total_exposure - others
                rates.append((total - count) / others if others > 0 else 0.0)
            load = (counts[runs_index] + 1) / (rates[runs_index] * days + 1)
            # No signal is expected below the healthy fault rate: every fault comes with an XID and
            # fails the jobs on the node. (In a sparse history the fleet's few XID days all sit in
            # the trimmed top: the reference would be 0, and one XID day would be a lemon.)
            expected = [
                max(rates[k] * days * load, prior * days) if _LOAD_SCALED[k] else max(rates[k], prior) * days
                for k in range(runs_index)
            ]
            _, verdict = self._verdict(names[index], counts, expected, days, fleet, min_surprise)
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts

    def _verdict(
        self,
        name: str,
        counts: tuple[int, ...],
        expected: list[float],
        days: float,
        fleet: int,
        min_surprise: float,
    ) -> tuple[float, LemonVerdict | None]:
        """The node's score and verdict, if its counts against what it was expected to count
        make a lemon."""
        surprises = [poisson_surprise(counts[k], expected[k]) for k in range(len(SIGNALS))]
        score = sum(surprises)
        strongest = max(surprises)
        if score < self.config.threshold or strongest < min_surprise:
            return score, None
        return score, LemonVerdict(
            node=name,
            score=score,
            counts=dict(zip(SIGNALS, counts[: len(SIGNALS)], strict=True)),
            expected={s: round(e, 4) for s, e in zip(SIGNALS, expected, strict=True)},
            crossed=tuple(s for s, surprise in zip(SIGNALS, surprises, strict=True) if surprise >= 2.0),
            jobs_hurt=tuple(job for _, job in list(self._nodes[name].failed)[-20:]),
            confidence=max(0.0, 1.0 - fleet * 10.0 ** (-strongest)),
            exposure_days=round(days, 3),
        )
