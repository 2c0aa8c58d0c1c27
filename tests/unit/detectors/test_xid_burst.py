"""The burst scorers keep counts as their windows change instead of scanning them a score: the
same scores, peaks and GPUs as a scan of the window would give (the scan below is how they were
computed before), in time order, out of it, and restored from a checkpoint without the counts."""

from __future__ import annotations

import pickle
import random
from collections import deque
from itertools import pairwise

import pytest

from detectors.xid_burst import XidSpreadScorer, XidStormScorer


class ScanningSpread:
    """The spread score by a scan of the window (the scorer's code before it kept counts)."""

    def __init__(
        self, window_hours: float, min_events: int, min_gpus: int, min_bursts: int, gap: float
    ) -> None:
        self.window_hours, self.min_events, self.min_gpus, self.min_bursts, self.gap = (
            window_hours, min_events, min_gpus, min_bursts, gap,
        )  # fmt: skip
        self.window: deque[tuple[float, str]] = deque()

    def learn_one(self, t: float, gpu: str) -> None:
        while self.window and self.window[0][0] <= t - self.window_hours:
            self.window.popleft()
        self.window.append((t, gpu))

    def score_one(self, t: float, gpu: str) -> float:
        recent = [(seen, g) for seen, g in self.window if seen > t - self.window_hours]
        gpus = len({g for _, g in recent} | {gpu})
        times = sorted([seen for seen, _ in recent] + [t])
        bursts = 1 + sum(1 for before, after in pairwise(times) if after - before > self.gap)
        return min((len(recent) + 1) / self.min_events, bursts / self.min_bursts, gpus / self.min_gpus)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(sorted({g for _, g in self.window}))


class ScanningStorm:
    """The storm score by a scan of the window (the scorer's code before it bisected)."""

    def __init__(self, window_hours: float, min_events: int) -> None:
        self.window_hours, self.min_events = window_hours, min_events
        self.window: deque[float] = deque()
        self.before = 0
        self.first: float | None = None
        self.peak = 0
        self.finished: int | None = None

    def learn_one(self, t: float) -> None:
        if self.first is None:
            self.first = t
        while self.window and self.window[0] <= t - self.window_hours:
            self.window.popleft()
            self.before += 1
        if not self.window and self.peak:
            self.finished, self.peak = self.peak, 0
        self.window.append(t)
        self.peak = max(self.peak, len(self.window))

    def score_one(self, t: float, fleet_usual: float) -> float:
        n = sum(1 for seen in self.window if seen > t - self.window_hours) + 1
        own = 0.0
        assert self.first is not None
        watched_before = t - self.window_hours - self.first
        if watched_before > 0:
            before = self.before + sum(1 for seen in self.window if seen <= t - self.window_hours)
            own = before / watched_before * self.window_hours
        return n / max(self.min_events, 10.0 * own, 3.0 * fleet_usual)


def error_times(seed: int, count: int, late_share: float) -> list[float]:
    """Hours of ``count`` errors: bursts of seconds apart, quiet gaps of minutes to days, and now
    and then one out of time order (up to two hours, as a long allowed lateness lets through).
    Every other seed puts them on a grid of quarter hours, so that an error falls exactly on the
    edge of another's window (one hour, one day) and two errors share a time."""
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(count):
        t += rng.choice((rng.uniform(0, 2 / 3600), rng.uniform(0, 0.5), rng.expovariate(1 / 6)))
        late = rng.random() < late_share
        at = max(t - rng.uniform(0, 2), 0.0) if late else t
        times.append(round(at * 4) / 4 if seed % 2 else at)
    return times


@pytest.mark.parametrize("late_share", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(6))
def test_spread_scores_as_a_scan_of_its_window(seed: int, late_share: float) -> None:
    rng = random.Random(seed)
    params = {
        "window_hours": 24.0,
        "min_events": 6,
        "min_gpus": 2,
        "min_bursts": 2,
        "burst_gap_hours": 10 / 60,
    }
    scorer = XidSpreadScorer(**params)
    scan = ScanningSpread(24.0, 6, 2, 2, 10 / 60)
    for step, t in enumerate(error_times(seed, 600, late_share)):
        gpu = f"0000:{rng.randrange(8):02x}:00.0"
        assert scorer.score_one({"t": t, "gpu": gpu}) == scan.score_one(t, gpu), step
        scorer.learn_one({"t": t, "gpu": gpu})
        scan.learn_one(t, gpu)
        assert scorer.gpus == scan.gpus, step
        if step % 97 == 0:  # a checkpoint, then the worker carries on from it
            scorer = pickle.loads(pickle.dumps(scorer))


@pytest.mark.parametrize("late_share", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(6))
def test_storm_scores_as_a_scan_of_its_window(seed: int, late_share: float) -> None:
    scorer = XidStormScorer(window_hours=1.0, min_events=20)
    scan = ScanningStorm(1.0, 20)
    for step, t in enumerate(error_times(seed, 600, late_share)):
        fleet_usual = 4.0 if step % 3 else 0.0
        if scan.first is not None:
            x = {"t": t, "fleet_usual": fleet_usual}
            assert scorer.score_one(x) == scan.score_one(t, fleet_usual), step
            assert scorer.window_count(t) == sum(1 for seen in scan.window if seen > t - 1.0), step
        scorer.learn_one({"t": t})
        scan.learn_one(t)
        finished, scan.finished = scan.finished, None
        assert scorer.take_finished_peak() == finished, step
        if step % 97 == 0:
            scorer = pickle.loads(pickle.dumps(scorer))


def test_a_checkpoint_from_before_the_counts_restores_them() -> None:
    """A worker checkpoint pickled before the scorers kept counts: counted from its window once."""
    spread = XidSpreadScorer(window_hours=24.0, min_events=3, min_gpus=1, min_bursts=1)
    for t, gpu in ((0.0, "a"), (0.5, "b"), (0.4, "c"), (3.0, "a")):  # one out of order
        spread.learn_one({"t": t, "gpu": gpu})
    state = dict(spread.__dict__)
    for name in ("_gpu_errors", "_gaps", "_descents"):
        del state[name]
    old = XidSpreadScorer.__new__(XidSpreadScorer)
    old.__setstate__(state)
    assert (old._gpu_errors, old._gaps, old._descents) == ({"a": 2, "b": 1, "c": 1}, 2, 1)
    assert old.score_one({"t": 3.5, "gpu": "d"}) == spread.score_one({"t": 3.5, "gpu": "d"})

    storm = XidStormScorer(window_hours=1.0, min_events=2)
    for t in (0.0, 0.3, 0.2, 0.9):
        storm.learn_one({"t": t})
    state = dict(storm.__dict__)
    del state["_descents"]
    old_storm = XidStormScorer.__new__(XidStormScorer)
    old_storm.__setstate__(state)
    assert old_storm._descents == 1
    assert old_storm.window_count(1.1) == storm.window_count(1.1) == 3


def test_a_flapping_links_errors_cost_no_pass_over_the_window() -> None:
    """Thousands of errors within the window: each score looks at what leaves the window (here
    nothing), not at the thousands before it; also once an error learnt out of order has left."""
    spread = XidSpreadScorer(window_hours=24.0)
    storm = XidStormScorer(window_hours=24.0)
    for t, gpu in ((0.0, "0"), (0.5, "1"), (0.2, "2")):  # out of order, a day before the rest
        spread.learn_one({"t": t, "gpu": gpu})
        storm.learn_one({"t": t})
    for k in range(5000):
        spread.learn_one({"t": 30 + k / 1000, "gpu": str(k % 8)})
        storm.learn_one({"t": 30 + k / 1000})
    spread._window = _Untouchable(spread._window)  # type: ignore[assignment]
    storm._window = _Untouchable(storm._window)  # type: ignore[assignment]
    assert spread.score_one({"t": 35.0, "gpu": "9"}) == 0.5  # one burst of the two needed
    assert storm.window_count(35.0) == 5000


class _Untouchable(deque):  # type: ignore[type-arg]
    """A window whose iteration fails: only its ends and its length may be read."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the window was scanned")
