"""LemonTracker.evaluate keeps what it derives between evaluations; its verdicts must be exactly those
of evaluating the whole fleet afresh each time (the algorithm before it kept anything), to the last
bit of every score, through node additions, out-of-order facts, take-backs, expiry and a
pickle round trip in the middle."""

from __future__ import annotations

import copy
import math
import pickle
import random
from typing import Any

import pytest

from detectors.lemon import _ALL_SIGNALS, _LOAD_SCALED, SIGNALS, LemonConfig, LemonTracker, LemonVerdict
from detectors.surprise import poisson_surprise
from schemas.timeutil import DAY_MS, HOUR_MS

# The evaluation as it was before it kept derived state: every node, every time.


def _reference_expire(self: LemonTracker, now_ms: int) -> None:
    start = now_ms - self.config.window_ms
    for state in self._nodes.values():
        for times in state.signals.values():
            while times and times[0] <= start:
                times.popleft()
        while state.failed and state.failed[0][0] <= start:
            state.failed_jobs.discard(state.failed.popleft()[1])


def reference_evaluate(self: LemonTracker, now_ms: int) -> list[LemonVerdict]:
    """Verdicts for the window ending at ``now_ms``: the lemons, in node order.

    Each node is compared with the rest of the fleet without its top nodes (in a fleet of 32,
    two lemons would otherwise raise the mean they are compared with), scaled to its exposure
    (time in the window, since its first fact) and, for the load-scaled signals, its work.
    """
    _reference_expire(self, now_ms)
    nodes = self._nodes
    fleet = len(nodes)
    if fleet == 0 or self._first_ms is None or now_ms - self._first_ms < self.config.min_history_ms:
        return []
    start = now_ms - self.config.window_ms
    # Node by node in the tracker's order (the float sums below add in that order), by index:
    # each node's exposure in days and its count of each signal (SIGNALS, then job_runs).
    names = list(nodes)
    # A node's exposure starts with its first fact if telemetry showed it, else with the fleet's.
    exposure = [
        max(now_ms - max(start, state.first_ms if state.present else self._first_ms), 0) / DAY_MS
        for state in nodes.values()
    ]
    counts_of = [tuple(map(len, _ALL_SIGNALS(state.signals))) for state in nodes.values()]
    totals = [sum(column) for column in zip(*counts_of, strict=True)]
    # The exposures of the nodes telemetry showed in the tracker's order, the others' all at once.
    absent = [not state.present for state in nodes.values()]
    fleet_days = max(now_ms - max(start, self._first_ms), 0) / DAY_MS
    total_exposure = sum(0.0 if gone else days for gone, days in zip(absent, exposure, strict=True))
    total_exposure += sum(absent) * fleet_days
    by_name = sorted(range(fleet), key=names.__getitem__)
    # The reference leaves out the node itself and the fleet's top nodes of each signal (2%,
    # at least one): in a week-old fleet of 32, another lemon must not make a lemon look usual.
    trim = max(1, math.ceil(self.config.trim_share * fleet))
    tops: list[frozenset[int]] = []
    # Counts and exposure of the top ``trim`` and ``trim + 1`` nodes of each signal.
    top_counts: list[tuple[int, int]] = []
    top_days: list[tuple[float, float]] = []
    for signal in range(len(totals)):
        fewer = [-counts[signal] for counts in counts_of]
        top = sorted(by_name, key=fewer.__getitem__)[: trim + 1]  # stable: ties by name
        tops.append(frozenset(top))
        top_counts.append(
            (sum(counts_of[i][signal] for i in top[:trim]), sum(counts_of[i][signal] for i in top))
        )
        top_days.append((sum(exposure[i] for i in top[:trim]), sum(exposure[i] for i in top)))
    prior = self.config.prior_fault_rate / 1000.0
    min_surprise = max(
        self.config.min_signal_surprise,
        math.log10(fleet) - math.log10(1.0 - self.config.min_confidence),
    )
    runs_index = len(SIGNALS)  # where a node's job runs are in its counts
    verdicts = []
    for index in by_name:
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
        expected = [
            max(rates[k] * days * load, prior * days) if _LOAD_SCALED[k] else max(rates[k], prior) * days
            for k in range(runs_index)
        ]
        surprises = [poisson_surprise(counts[k], expected[k]) for k in range(runs_index)]
        score = sum(surprises)
        strongest = max(surprises)
        if score < self.config.threshold or strongest < min_surprise:
            continue
        name = names[index]
        verdicts.append(
            LemonVerdict(
                node=name,
                score=score,
                counts=dict(zip(SIGNALS, counts[:runs_index], strict=True)),
                expected={s: round(e, 4) for s, e in zip(SIGNALS, expected, strict=True)},
                crossed=tuple(s for s, surprise in zip(SIGNALS, surprises, strict=True) if surprise >= 2.0),
                jobs_hurt=tuple(job for _, job in list(nodes[name].failed)[-20:]),
                confidence=max(0.0, 1.0 - fleet * 10.0 ** (-strongest)),
                exposure_days=round(days, 3),
            )
        )
    return verdicts


class _CountingTracker(LemonTracker):
    """A tracker that counts its evaluations at the prior floor (the shortcut under test)."""

    at_floor = 0

    def _evaluate_at_floor(self, *args: Any) -> list[LemonVerdict]:
        type(self).at_floor += 1
        return super()._evaluate_at_floor(*args)


@pytest.mark.parametrize("seed", range(8))
def test_incremental_verdicts_equal_evaluating_the_whole_fleet_afresh(seed: int) -> None:
    rng = random.Random(seed)
    config = LemonConfig(window_ms=7 * DAY_MS, evaluate_every_ms=6 * HOUR_MS, threshold=4.0,
                         min_signal_surprise=2.0, min_history_ms=DAY_MS, trim_share=0.05)  # fmt: skip
    tracker = LemonTracker(config)
    fleet = [f"node{n:03d}" for n in range(rng.randint(20, 60))]
    lemons = set(rng.sample(fleet, 3))
    recorded: list[tuple[str, str, int, str]] = []
    now = 0
    compared = 0
    for step in range(240):  # 60 days of 6-hour evaluations
        end = now + 6 * HOUR_MS
        for _ in range(rng.randint(0, 6)):
            node = rng.choice(fleet[: 10 + step // 3])  # the fleet grows: nodes appear over time
            if node in lemons and rng.random() < 0.5:
                node = rng.choice(sorted(lemons))
            ts = rng.randint(now - 10 * 60_000, end)  # a few minutes out of order
            kind = rng.random()
            if kind < 0.3:
                tracker.see_node(node, ts)
            elif kind < 0.5:
                tracker.record_xid(node, ts)
                recorded.append((node, "xid_days", ts, ""))
            elif kind < 0.7:
                signal = rng.choice(["hw_incidents", "hw_failures", "node_fails", "job_runs"])
                tracker.record(node, signal, ts)
                recorded.append((node, signal, ts, ""))
            elif kind < 0.9:
                job = f"j{rng.randint(0, 400)}"
                tracker.record_failed_job(node, job, ts)
                recorded.append((node, "failed_jobs", ts, job))
            elif recorded:
                node, signal, ts, job = rng.choice(recorded)
                tracker.forget(node, signal, ts, job)
        now = end
        reference = copy.deepcopy(tracker)
        got = tracker.evaluate(now)
        expected = reference_evaluate(reference, now)
        assert got == expected, (seed, step)
        compared += len(got)
        if step == 120:  # a worker restored from a checkpoint: the derived state is rebuilt
            tracker = pickle.loads(pickle.dumps(tracker))
    assert compared > 0, "no verdict to compare: the test would prove nothing"


@pytest.mark.parametrize("seed", range(3))
def test_a_sparse_history_evaluated_at_the_floor_equals_evaluating_the_whole_fleet(seed: int) -> None:
    """Years of a large fleet's rare failures (nodes named first by them, some known from an
    inventory, a few bad nodes failing again and again): most evaluations take the shortcut at the
    prior floor, and every verdict equals the whole fleet's evaluation to the last bit."""
    rng = random.Random(100 + seed)
    config = LemonConfig(window_ms=28 * DAY_MS, evaluate_every_ms=6 * HOUR_MS)
    tracker = _CountingTracker(config)
    _CountingTracker.at_floor = 0
    fleet = [f"n{n:04d}" for n in range(rng.randint(200, 400))]
    for name in fleet[: len(fleet) // 2]:  # an inventory of half the fleet
        tracker.see_node(name, 0)
    bad = rng.sample(fleet, 3)
    now = 0
    compared = evaluations = 0
    for step in range(600):  # 150 days
        end = now + 6 * HOUR_MS
        failing = [node for node in bad if rng.random() < 0.04]  # a bad node: every 6 days
        if rng.random() < 0.08:  # the rest of the fleet: 0.3 failures a day
            failing.append(rng.choice(fleet))
        for node in failing:
            ts = rng.randint(now - 30 * 60_000, end)
            tracker.see_node(node, ts, present=False)
            tracker.record_xid(node, ts)
            tracker.record(node, "hw_incidents", ts)
            if step < 200 and rng.random() < 0.2:  # job records for the first 50 days only
                tracker.record(node, "job_runs", ts)
            if rng.random() < 0.05:
                tracker.see_node(rng.choice(fleet), ts)  # telemetry shows a node late
        now = end
        reference = copy.deepcopy(tracker)
        got = tracker.evaluate(now)
        expected = reference_evaluate(reference, now)
        assert got == expected, (seed, step)
        compared += len(got)
        evaluations += 1
        if step == 300:
            tracker = pickle.loads(pickle.dumps(tracker))
    assert compared > 0, "no verdict to compare: the test would prove nothing"
    assert _CountingTracker.at_floor > evaluations // 4, "the shortcut was hardly taken"
