"""XID burst detectors (SPEC 4.2): storms on one GPU, and NVLink errors spreading over a node.

Two River-protocol scorers, each cloned per key by the core:

* :class:`XidStormScorer`, per GPU: how many XIDs the GPU logged in the last ``window_hours``,
  in units of the count that is *not* surprising — the larger of a floor, the GPU's own
  long-run rate and the fleet's usual window count. Application XIDs are routine one at a time
  (a crashing program logs a few); dozens from one GPU within the hour is a storm.
* :class:`XidSpreadScorer`, per node and fault family: how many errors of the family the node
  logged in the last ``window_hours``, in how many separate bursts and on how many distinct
  GPUs. NVLink errors that *recur*, burst after burst, are a flapping link or a bad NVSwitch
  path; one burst, even over several GPUs, is what the links log when they go down once (a GPU
  reset, a reboot, a peer GPU's fault: NVIDIA's XID 74 text and the XID 144-150 decode sheet's
  link-down reasons), and is no flapping.

``x["t"]`` is the event time in hours (any origin, increasing per key). Both scorers keep only
the events of their window and a few counts of it (kept as it changes, so a score costs the
events that leave the window, not a pass over it), so their state is a few hundred bytes per key.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from river.base import AnomalyDetector
from river.base.typing import FeatureName

from detectors.thresholds import Threshold

__all__ = ["XidSpreadScorer", "XidStormScorer", "spread_filter", "storm_filter"]


class XidStormScorer(AnomalyDetector):
    """Scores the XID count of one GPU's recent window against its own and the fleet's baseline.

    ``score = n / max(min_events, own_multiplier * own_expected, fleet_multiplier * fleet_usual)``
    where ``n`` counts this event and the GPU's others within ``window_hours``, ``own_expected``
    is the GPU's long-run rate (events before the window / hours watched before it) times the
    window, and ``fleet_usual`` is ``x["fleet_usual"]`` when given: a high quantile of window
    counts across the fleet, kept by the caller.

    Parameters
    ----------
    window_hours
        Length of the sliding window.
    min_events
        Floor of the unsurprising count: fewer events than this never make a storm.
    own_multiplier, fleet_multiplier
        How far above the GPU's own rate and the fleet's usual count a storm must be.

    Examples
    --------
    >>> gpu = XidStormScorer(window_hours=1.0, min_events=10)
    >>> for minute in range(0, 40, 4):
    ...     gpu.learn_one({"t": minute / 60})
    >>> round(gpu.score_one({"t": 40 / 60}), 1)   # 11 XIDs within the hour
    1.1
    >>> round(gpu.score_one({"t": 3.0}), 2)       # hours later, alone, against a 5/h history
    0.02
    """

    def __init__(
        self,
        window_hours: float = 1.0,
        min_events: int = 20,
        own_multiplier: float = 10.0,
        fleet_multiplier: float = 3.0,
    ) -> None:
        self.window_hours = window_hours
        self.min_events = min_events
        self.own_multiplier = own_multiplier
        self.fleet_multiplier = fleet_multiplier
        self._window: deque[float] = deque()
        self._before = 0  # events that left the window
        self._first: float | None = None
        self._peak = 0  # largest window count of the current burst
        self._finished_peak: int | None = None
        # Neighbours of the window out of time order (an XID learnt after a later one): while
        # there are none, the window is sorted and counting it is a bisection, not a scan (a
        # storm of thousands of lines an hour would otherwise cost a scan of them all a line).
        self._descents = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a checkpoint from before the window's order was kept track of."""
        self.__dict__.update(state)
        if "_descents" not in state:
            self._descents = _descents(self._window)

    def _expire(self, now: float) -> None:
        start = now - self.window_hours
        window = self._window
        while window and window[0] <= start:
            left = window.popleft()
            if window and window[0] < left:
                self._descents -= 1
            self._before += 1

    def window_count(self, t: float) -> int:
        """Events within the window ending at ``t``, not counting one at ``t`` being scored."""
        start = t - self.window_hours
        if not self._descents:
            return len(self._window) - bisect.bisect_right(self._window, start)
        return sum(1 for seen in self._window if seen > start)

    def learn_one(self, x: dict[FeatureName, Any]) -> None:
        """Record one XID of this GPU at ``x["t"]``."""
        t = float(x["t"])
        if self._first is None:
            self._first = t
        self._expire(t)
        if not self._window and self._peak:
            self._finished_peak, self._peak = self._peak, 0
        if self._window and t < self._window[-1]:
            self._descents += 1
        self._window.append(t)
        self._peak = max(self._peak, len(self._window))

    def take_finished_peak(self) -> int | None:
        """The peak window count of the burst that ended before the last learned event, once.

        The caller feeds these into the fleet's distribution of usual window counts: a burst
        enters it only when it is over, so a storm in progress never raises its own bar.
        """
        peak, self._finished_peak = self._finished_peak, None
        return peak

    def score_one(self, x: dict[FeatureName, Any]) -> float:
        """Score an XID at ``x["t"]`` (the state is not changed)."""
        t = float(x["t"])
        n = self.window_count(t) + 1
        own_expected = 0.0
        if self._first is not None:
            watched_before = t - self.window_hours - self._first
            if watched_before > 0:
                before = self._before + len(self._window) - self.window_count(t)
                own_expected = before / watched_before * self.window_hours
        fleet_usual = float(x.get("fleet_usual", 0.0))
        usual = max(self.min_events, self.own_multiplier * own_expected, self.fleet_multiplier * fleet_usual)
        return n / usual


class XidSpreadScorer(AnomalyDetector):
    """Scores a node's errors of one family by how many recur, in how many bursts, on how many GPUs.

    ``score = min(n / min_events, bursts / min_bursts, gpus / min_gpus)`` over the last
    ``window_hours``, where a burst is a run of errors each within ``burst_gap_hours`` of the one
    before: enough errors, in enough separate bursts, on enough distinct GPUs are all needed, so
    a single burst (the links going down at a reset, however many GPUs log it) never scores 1.

    Examples
    --------
    >>> node = XidSpreadScorer(window_hours=24, min_events=6, min_gpus=1, min_bursts=2)
    >>> for second in range(8):  # eight errors within seconds on four GPUs: one burst
    ...     node.learn_one({"t": second / 3600, "gpu": "abcd"[second % 4]})
    >>> node.score_one({"t": 9 / 3600, "gpu": "a"})
    0.5
    >>> node.score_one({"t": 0.5, "gpu": "a"})  # half an hour later: the errors recur
    1.0
    """

    def __init__(
        self,
        window_hours: float = 24.0,
        min_events: int = 6,
        min_gpus: int = 1,
        min_bursts: int = 2,
        burst_gap_hours: float = 10 / 60,
    ) -> None:
        self.window_hours = window_hours
        self.min_events = min_events
        self.min_gpus = min_gpus
        self.min_bursts = min_bursts
        self.burst_gap_hours = burst_gap_hours
        self._window: deque[tuple[float, str]] = deque()
        # Kept as the window changes, so that a score costs the errors leaving the window, not a
        # pass over the window (NVLink errors come by the thousand an hour when a link flaps):
        # the errors of each GPU, the neighbours further apart than a burst's gap, and the
        # neighbours out of time order (while there are none, the window is sorted).
        self._gpu_errors: dict[str, int] = {}
        self._gaps = 0
        self._descents = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a checkpoint from before bursts were counted (one burst is enough, as
        then) or before the window's counts were kept (counted from the window)."""
        state.setdefault("min_bursts", 1)
        state.setdefault("burst_gap_hours", 10 / 60)
        self.__dict__.update(state)
        if "_gpu_errors" not in state:
            self._gpu_errors = {}
            for _, gpu in self._window:
                self._gpu_errors[gpu] = self._gpu_errors.get(gpu, 0) + 1
            times = [seen for seen, _ in self._window]
            self._gaps = sum(1 for before, after in pairwise(times) if after - before > self.burst_gap_hours)
            self._descents = _descents(times)

    def learn_one(self, x: dict[FeatureName, Any]) -> None:
        """Record one error of the family at ``x["t"]`` on GPU ``x["gpu"]``."""
        t = float(x["t"])
        window, errors = self._window, self._gpu_errors
        while window and window[0][0] <= t - self.window_hours:
            left, gpu = window.popleft()
            if errors[gpu] == 1:
                del errors[gpu]
            else:
                errors[gpu] -= 1
            if window:
                after = window[0][0]
                self._gaps -= after - left > self.burst_gap_hours
                self._descents -= after < left
        gpu = str(x["gpu"])
        if window:
            last = window[-1][0]
            self._gaps += t - last > self.burst_gap_hours
            self._descents += t < last
        window.append((t, gpu))
        errors[gpu] = errors.get(gpu, 0) + 1

    def score_one(self, x: dict[FeatureName, Any]) -> float:
        """Score an error at ``x["t"]`` on ``x["gpu"]`` (the state is not changed)."""
        t = float(x["t"])
        gpu = str(x["gpu"])
        start = t - self.window_hours
        window = self._window
        if self._descents or (window and t < window[-1][0]):
            return self._score_unsorted(t, gpu)
        # The window is sorted and ``t`` comes last: what would leave the window is at its front.
        gone = 0
        gaps = self._gaps
        left_errors: dict[str, int] = {}
        while gone < len(window) and window[gone][0] <= start:
            left, left_gpu = window[gone]
            left_errors[left_gpu] = left_errors.get(left_gpu, 0) + 1
            gone += 1
            if gone < len(window):
                gaps -= window[gone][0] - left > self.burst_gap_hours
        n = len(window) - gone + 1
        if gone < len(window):
            gaps += t - window[-1][0] > self.burst_gap_hours
        else:
            gaps = 0
        errors = self._gpu_errors
        if left_errors:
            present = [g for g, count in errors.items() if count > left_errors.get(g, 0)]
        else:
            present = list(errors)
        gpus = len(present) + (gpu not in present)
        bursts = 1 + gaps
        return min(n / self.min_events, bursts / self.min_bursts, gpus / self.min_gpus)

    def _score_unsorted(self, t: float, gpu: str) -> float:
        """:meth:`score_one` over the window as it is: an error learnt out of time order."""
        recent = [(seen, g) for seen, g in self._window if seen > t - self.window_hours]
        n = len(recent) + 1
        gpus = len({g for _, g in recent} | {gpu})
        times = sorted([seen for seen, _ in recent] + [t])
        gaps = sum(1 for before, after in pairwise(times) if after - before > self.burst_gap_hours)
        bursts = 1 + gaps
        return min(n / self.min_events, bursts / self.min_bursts, gpus / self.min_gpus)

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPUs with an error in the window, sorted (the incident's evidence)."""
        return tuple(sorted(self._gpu_errors))


def _descents(times: Iterable[float]) -> int:
    """How many neighbours of ``times`` are out of order (0: sorted).

    >>> _descents([1.0, 2.0, 2.0]), _descents([1.0, 3.0, 2.0, 4.0])
    (0, 1)
    """
    return sum(1 for before, after in pairwise(times) if after < before)


def storm_filter(threshold: float = 1.0, **params: Any) -> Threshold:
    """Template cloned per GPU: :class:`XidStormScorer` behind a threshold.

    The filter protects the scorer: XIDs of a storm do not raise the GPU's own baseline, so a
    GPU that storms every day keeps being flagged.
    """
    return Threshold(XidStormScorer(**params), threshold=threshold, protect_anomaly_detector=True)


def spread_filter(threshold: float = 1.0, **params: Any) -> Threshold:
    """Template cloned per node and family: :class:`XidSpreadScorer` behind a threshold.

    Not protected: the window must hold every error, flagged or not, to measure the spread.
    """
    return Threshold(XidSpreadScorer(**params), threshold=threshold, protect_anomaly_detector=False)
