"""Whose errors are they on one node? A user's application failures against the other users' runs
there (job-aware verdicts for a user pinned to a node).

A user whose jobs crash wherever the scheduler puts them shows it by the number of nodes: the
fleet stage's share rule (:class:`detectors.fleet.FleetConfig`'s ``owner_*`` settings) sees most
of their runs fail within a day. A user who runs every job on one node (a debug node they name
with ``--nodelist``) shows nothing of the kind: every failure is on the same node, so by the
node's own counts it looks like a lemon. What tells the two apart there is the *other* users'
runs on that node: a node that fails jobs fails theirs too.

:class:`NodeUserTracker` keeps, per node, the runs started and the application failures (a failed
run with application-class XIDs and no hardware evidence) of each user over a sliding window of
event time, and judges a user *pinned* to the node (their errors are theirs, not the node's) when
over the window

* their application failures on the node (failed runs with no hardware evidence that logged
  application-class XIDs there) are at least ``min_failures``, and at least ``min_share`` of their
  runs there (the share rule's own thresholds), and
* the other users' runs there failed that way so seldom that a node failing jobs as
  often as it fails the user's would have failed more of them: ``P(Binomial(runs, share) <=
  failures) <= significance``, with the user's share of failures. With no other user's run on the
  node there is nothing to compare with, and the node is judged as before.

The tracker is pure and keeps only what the window holds; the fleet stage applies its facts in
event-time order, so every partitioning of the fleet judges alike.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from detectors.jobs import JobContext
from detectors.surprise import binomial_at_most

__all__ = ["NodeUserTracker", "PinnedFailure"]


@dataclass(frozen=True, slots=True)
class PinnedFailure:
    """One application failure of a user on a node: when, the job, and its context when known."""

    ts_ms: int
    job_id: str
    context: JobContext | None = None


@dataclass(slots=True)
class _NodeUsers:
    """One node's runs and application failures over the window, oldest first, and their counts by
    user."""

    runs: deque[tuple[int, str]] = field(default_factory=deque)
    failures: deque[tuple[int, str, PinnedFailure]] = field(default_factory=deque)
    runs_by: Counter[str] = field(default_factory=Counter)
    failures_by: Counter[str] = field(default_factory=Counter)
    #: Jobs that logged application-class XIDs on the node, oldest first, and how many of them each.
    xids: deque[tuple[int, str]] = field(default_factory=deque)
    xid_jobs: Counter[str] = field(default_factory=Counter)


class NodeUserTracker:
    """Per node, each user's runs and application failures over ``window_ms``.

    Examples
    --------
    ``dbg`` fails 5 of 6 runs on n1 where ``ann``'s 4 runs succeed: dbg's errors are dbg's.

    >>> tracker = NodeUserTracker(window_ms=100, min_failures=5, min_share=0.5, significance=0.05)
    >>> for t in range(6):
    ...     tracker.run("n1", "dbg", t)
    >>> for t in range(5):
    ...     tracker.app_xid("n1", f"j{t}", t)
    ...     tracker.app_failure("n1", "dbg", f"j{t}", t + 1)
    >>> tracker.pinned("dbg", "n1", 10)      # nobody else ran there: nothing to compare with
    False
    >>> for t in range(4):
    ...     tracker.run("n1", "ann", 20 + t)
    >>> tracker.pinned("dbg", "n1", 30), tracker.pinned("ann", "n1", 30)
    (True, False)
    >>> tracker.pinned("dbg", "n1", 106)     # the window has moved past dbg's failures
    False
    """

    def __init__(self, window_ms: int, min_failures: int, min_share: float, significance: float) -> None:
        self.window_ms = window_ms
        self.min_failures = min_failures
        self.min_share = min_share
        self.significance = significance
        self._nodes: dict[str, _NodeUsers] = {}

    def run(self, node: str, user: str, ts_ms: int) -> None:
        """A run of ``user`` started on ``node``."""
        state = self._nodes.setdefault(node, _NodeUsers())
        state.runs.append((ts_ms, user))
        state.runs_by[user] += 1
        self._expire(state, ts_ms)

    def app_xid(self, node: str, job_id: str, ts_ms: int) -> None:
        """Job ``job_id`` logged an application-class XID on ``node``."""
        state = self._nodes.setdefault(node, _NodeUsers())
        state.xids.append((ts_ms, job_id))
        state.xid_jobs[job_id] += 1
        self._expire(state, ts_ms)

    def app_failure(
        self, node: str, user: str, job_id: str, ts_ms: int, context: JobContext | None = None
    ) -> None:
        """A run of ``user`` that ran on ``node`` failed with application-class XIDs and no
        hardware evidence: a failure *on the node* when its XIDs were logged there (a run over many
        nodes whose XIDs were elsewhere says nothing about this one)."""
        state = self._nodes.get(node)
        if state is None or job_id not in state.xid_jobs:
            return
        state.failures.append((ts_ms, user, PinnedFailure(ts_ms, job_id, context)))
        state.failures_by[user] += 1
        self._expire(state, ts_ms)

    def _expire(self, state: _NodeUsers, now_ms: int) -> None:
        since = now_ms - self.window_ms
        while state.runs and state.runs[0][0] <= since:
            user = state.runs.popleft()[1]
            state.runs_by[user] -= 1
            if not state.runs_by[user]:
                del state.runs_by[user]
        while state.failures and state.failures[0][0] <= since:
            user = state.failures.popleft()[1]
            state.failures_by[user] -= 1
            if not state.failures_by[user]:
                del state.failures_by[user]
        # A job's XIDs are kept as long as a failure of it may still come (a run can last days).
        while state.xids and state.xids[0][0] <= since:
            job = state.xids.popleft()[1]
            state.xid_jobs[job] -= 1
            if not state.xid_jobs[job]:
                del state.xid_jobs[job]

    def pinned(self, user: str, node: str, now_ms: int) -> bool:
        """Whether ``user``'s application failures on ``node`` are theirs, not the node's: most of
        their runs there fail while the other users' runs there do not (see the module)."""
        state = self._nodes.get(node)
        if not user or state is None or state.failures_by.get(user, 0) < self.min_failures:
            return False
        self._expire(state, now_ms)
        failures = state.failures_by.get(user, 0)
        runs = max(state.runs_by.get(user, 0), failures)
        if failures < self.min_failures or failures < self.min_share * runs:
            return False
        others_failed = len(state.failures) - failures
        others_runs = max(len(state.runs) - state.runs_by.get(user, 0), others_failed)
        if others_runs == 0:
            return False
        return binomial_at_most(others_failed, others_runs, failures / runs) <= self.significance

    def share(self, user: str, node: str) -> float:
        """The share of ``user``'s runs on ``node`` in the window that failed with application errors."""
        state = self._nodes.get(node)
        failures = 0 if state is None else state.failures_by.get(user, 0)
        if not failures:
            return 0.0
        assert state is not None
        return failures / max(state.runs_by.get(user, 0), failures)

    def failures(self, user: str, node: str) -> list[PinnedFailure]:
        """``user``'s application failures on ``node`` in the window, oldest first."""
        state = self._nodes.get(node)
        if state is None:
            return []
        return [failure for _, who, failure in state.failures if who == user]

    def candidates(self, now_ms: int) -> list[tuple[str, str]]:
        """(user, node) pairs, in order, with enough application failures in the window to be
        judged; nodes left with nothing in the window are dropped."""
        pairs: list[tuple[str, str]] = []
        for node in sorted(self._nodes):
            state = self._nodes[node]
            self._expire(state, now_ms)
            if not state.runs and not state.failures and not state.xids:
                del self._nodes[node]
                continue
            pairs.extend(
                (user, node)
                for user in sorted(state.failures_by)
                if state.failures_by[user] >= self.min_failures
            )
        return pairs
