"""ECC trend detector (SPEC 4.3, the model part): correctable-error spikes and upward trends.

A GPU whose correctable (SBE) rate climbs above its own usual rate is degrading: NVIDIA and
Kokolis et al. treat a rising correctable rate as the precursor of an uncorrectable error. A GPU
that has always corrected a few bits a day is not, nor is a one-off burst of one to three bits.

The model follows River's anomaly-detector protocol: ``learn_one(x)`` updates the state of one
GPU, ``score_one(x)`` scores a sample (high = anomalous) without changing it, and a separate
threshold object (:class:`detectors.thresholds.Threshold`) turns scores into decisions. The core
clones one model per GPU, only for GPUs that have shown a correctable error (most never do).

Score: the correctable errors of the last ``window`` samples (this one included) against what
the GPU's baseline rate predicts for that time, as a Poisson surprise ``-log10 P(N >= n)``. The
baseline is the GPU's mean rate (time-weighted, forgetting slowly), never below ``floor_per_day``; the
threshold filter is protecting, so samples scored as anomalous do not raise the baseline and a
degradation stays anomalous as it grows. A sudden spike is the same test over a short time.

Assumptions
-----------
* ``x["sbe_delta"]`` is the increase of the SBE counter since the GPU's previous sample, after
  counter-reset handling (:func:`detectors.ecc_rules.ecc_step`); ``x["hours"]`` is the time
  between the two samples, so gaps in sampling are accounted for, not mistaken for bursts.
* Warm-up: until the GPU has been watched for ``warmup_hours`` (``x["watched_hours"]``, time
  since its first sample), its own rate is not scored: a GPU with a steady rate above the floor
  must not look anomalous on its first samples. A GPU watched for long that starts to correct
  errors is scored from its first error, against the floor.
* The fleet: a GPU with no trusted past of its own (errors from its first samples: a new GPU, or
  one already degrading when the history began, whose own past holds the rise) is compared with
  the fleet, ``x["fleet_per_day"]`` (the highest correctable errors per day a healthy GPU of the
  fleet is expected to reach, :mod:`detectors.fleet`; absent or negative when the fleet has
  none): the errors of the trend window against that rate, from its first samples on. A rate that
  peers show is usual; one that none of them shows is not, however smoothly it rose.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from river.base import AnomalyDetector
from river.base.typing import FeatureName

from detectors.surprise import poisson_surprise
from detectors.thresholds import Threshold

__all__ = ["EccTrendScorer", "ecc_trend_filter"]


class EccTrendScorer(AnomalyDetector):
    """Scores a GPU's recent correctable errors against its own baseline rate, now and as it was.

    Parameters
    ----------
    window
        Samples (this one included) whose errors are tested together against the baseline
        (the spike test).
    baseline_half_life_hours
        Half-life of a sample's weight in the baseline once the GPU has been watched for long;
        before that the baseline is the mean rate over the whole time it was watched. Time, not
        samples: a 30-second and a 6-hour scrape forget alike (80 h is a weight of 0.05 per
        6-hour sample).
    floor_per_day
        The lowest baseline rate: what a healthy GPU may plausibly correct per day.
    warmup_hours
        Observation time before a GPU's samples are scored.
    trend_hours
        The trend test counts the errors of this long (this sample included) ...
    reference_lag_hours
        ... against the baseline as it was at least this long ago. A slow, smooth rise moves
        the baseline along with it, so that each sample looks like the last; the rate a day ago
        does not move, and a GPU correcting far more than it did then is degrading.
    fleet_margin
        A GPU without a trusted past is anomalous when it corrects far more than this many times
        the fleet's healthy ceiling (``x["fleet_per_day"]``): an estimate from the fleet's spread
        of rates, which a real fleet's tail exceeds now and then.

    Examples
    --------
    >>> model = EccTrendScorer()
    >>> for step, delta in enumerate((1, 0, 1, 1, 0, 1, 1, 0), start=1):   # ~2.5 a day: its normal
    ...     model.learn_one({"sbe_delta": delta, "hours": 6.0, "watched_hours": 6.0 * step})
    >>> round(model.score_one({"sbe_delta": 2, "hours": 6.0, "watched_hours": 54.0}), 1)
    0.7
    >>> round(model.score_one({"sbe_delta": 40, "hours": 6.0, "watched_hours": 54.0}), 1)  # far above
    36.2

    A GPU clean for a week whose errors then rise smoothly, a little more each 15-minute scrape
    (a rate rising linearly from zero to 200 a day over 3.5 days): the spike test alone follows
    the rise; the trend test flags it within the first day.

    >>> model = EccTrendScorer()
    >>> model.learn_one({"sbe_delta": 0, "hours": 168.0, "watched_hours": 168.0})
    >>> first = None
    >>> for k in range(1, 4 * 84):
    ...     x = {"sbe_delta": round(200 / 24 * (k / (4 * 84)) / 4), "hours": 0.25,
    ...          "watched_hours": 168.0 + k / 4}
    ...     if first is None and model.score_one(x) >= 6.0:
    ...         first = k / 4
    ...     model.learn_one(x)
    >>> first is not None and first < 24
    True

    A GPU correcting 60 errors a day from its first sample has no past to compare with, but the
    fleet (whose healthy GPUs reach 10 a day at most) says it is far above its peers:

    >>> model = EccTrendScorer()
    >>> model.learn_one({"sbe_delta": 15, "hours": 6.0, "watched_hours": 6.0})
    >>> x = {"sbe_delta": 15, "hours": 6.0, "watched_hours": 12.0}
    >>> model.score_one(x), round(model.score_one({**x, "fleet_per_day": 10.0}), 1)
    (0.0, 9.3)
    """

    def __init__(
        self,
        window: int = 4,
        baseline_half_life_hours: float = 80.0,
        floor_per_day: float = 1.0,
        warmup_hours: float = 24.0,
        trend_hours: float = 24.0,
        reference_lag_hours: float = 24.0,
        fleet_margin: float = 1.5,
    ) -> None:
        self.window = window
        self.baseline_half_life_hours = baseline_half_life_hours
        self.floor_per_day = floor_per_day
        self.warmup_hours = warmup_hours
        self.trend_hours = trend_hours
        self.reference_lag_hours = reference_lag_hours
        self.fleet_margin = fleet_margin
        self._recent: deque[tuple[int, float]] = deque(maxlen=max(window - 1, 0))
        # The baseline starts at the floor, a prior worth one sample: a GPU clean until now that
        # corrects its first errors must not have them taken as its normal rate.
        self._baseline = floor_per_day / 24.0
        # Errors of the trend window in bins of about an hour (so a 30-second scrape keeps a day
        # in two dozen entries): [first sample's start, last sample's end, errors], watched hours.
        self._errors: deque[list[float]] = deque()
        # Baselines as they were, (watched hours, per hour), about one an hour.
        self._history: deque[tuple[float, float]] = deque()
        self._reference: float | None = None  # the newest baseline at least the lag old
        self._created_watched: float | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a worker checkpoint from before the trend test: its per-sample
        ``baseline_alpha`` becomes the default half-life, and the trend test starts from the floor
        prior as for a GPU that corrects its first errors (it has a day's history within a day)."""
        state.pop("baseline_alpha", None)
        state.setdefault("baseline_half_life_hours", 80.0)
        state.setdefault("trend_hours", 24.0)
        state.setdefault("reference_lag_hours", 24.0)
        state.setdefault("fleet_margin", 1.5)
        state.setdefault("_errors", deque())
        state.setdefault("_history", deque())
        state.setdefault("_reference", None)
        state.setdefault("_created_watched", None)
        self.__dict__.update(state)

    def _watched(self, x: dict[FeatureName, Any]) -> float:
        hours = max(float(x["hours"]), 1e-3)
        return max(float(x.get("watched_hours", hours)), hours)

    def learn_one(self, x: dict[FeatureName, Any]) -> None:
        """Fold the sample into the baseline, the recent window and the trend window."""
        delta, hours = int(x["sbe_delta"]), max(float(x["hours"]), 1e-3)
        watched = self._watched(x)
        if self._created_watched is None:
            self._created_watched = watched - hours
        # The time-weighted mean rate over everything watched so far (a GPU clean for weeks has a
        # near-zero baseline however its first errors look), until that weight drops below the
        # forgetting of the half-life; then an exponentially weighted mean that follows slow
        # changes only.
        forget = 1.0 - math.exp(-hours * math.log(2.0) / self.baseline_half_life_hours)
        weight = max(forget, hours / watched)
        self._baseline += weight * (delta / hours - self._baseline)
        if self._recent.maxlen:
            self._recent.append((delta, hours))
        if delta > 0:
            if self._errors and watched - self._errors[-1][0] < 1.0:
                self._errors[-1][1] = watched
                self._errors[-1][2] += delta
            else:
                self._errors.append([watched - hours, watched, float(delta)])
        # A baseline from before the warm-up is a guess from a few samples: never a reference.
        if watched >= self.warmup_hours and (not self._history or watched - self._history[-1][0] >= 1.0):
            self._history.append((watched, self._baseline))
        self._forget(watched)

    def _forget(self, watched: float) -> None:
        while self._errors and self._errors[0][1] <= watched - self.trend_hours:
            self._errors.popleft()
        while self._history and self._history[0][0] <= watched - self.reference_lag_hours:
            self._reference = self._history.popleft()[1]

    def score_one(self, x: dict[FeatureName, Any]) -> float:
        """The largest surprise of the spike test, the trend test and, for a GPU with no trusted
        past, the fleet test (the state is not changed)."""
        watched = float(x.get("watched_hours", self.warmup_hours))
        reference = self.reference_per_hour(watched, float(x["hours"]))
        fleet = 0.0
        if reference is None and float(x.get("fleet_per_day", -1.0)) >= 0.0:
            usual = max(self.fleet_margin * float(x["fleet_per_day"]), self.floor_per_day) / 24.0
            recent, span = self._trend_errors(x, watched)
            fleet = poisson_surprise(recent, usual * span)
        if watched < self.warmup_hours:
            return fleet
        errors = int(x["sbe_delta"]) + sum(delta for delta, _ in self._recent)
        hours = max(float(x["hours"]), 1e-3) + sum(h for _, h in self._recent)
        spike = poisson_surprise(errors, self.baseline_per_hour * hours)
        if reference is None:
            return max(spike, fleet)
        recent, span = self._trend_errors(x, watched)
        return max(spike, poisson_surprise(recent, reference * span))

    def fleet_could_flag(self, x: dict[FeatureName, Any], threshold: float) -> bool:
        """Whether the fleet test could reach ``threshold`` on ``x`` whatever the fleet's rate:
        the rate it is tested against is never below the floor, so errors unsurprising against
        the floor need no fleet reference (the score then is what it would be with one: the fleet
        test cannot decide it)."""
        watched = float(x.get("watched_hours", self.warmup_hours))
        recent, span = self._trend_errors(x, watched)
        return poisson_surprise(recent, self.floor_per_day / 24.0 * span) >= threshold

    def _trend_errors(self, x: dict[FeatureName, Any], watched: float) -> tuple[int, float]:
        """The errors of the samples that ended within the trend window, this one included, and
        the hours those samples cover: a sample after a gap of three days brings three days of
        errors."""
        start = watched - max(float(x["hours"]), 1e-3)
        recent = int(x["sbe_delta"])
        for begun, ended, binned in self._errors:
            if ended > watched - self.trend_hours:
                recent += int(binned)
                start = min(start, begun)
        return recent, min(max(self.trend_hours, watched - start), watched)

    def reference_per_hour(self, watched_hours: float, hours: float = 0.0) -> float | None:
        """The baseline as it was ``reference_lag_hours`` before ``watched_hours`` (never below the
        floor); None while there is none to trust (a GPU with errors from its first samples,
        watched for less than the warm-up and the lag). ``hours``: the time since the previous
        sample, which dates a model's first sample (not learnt yet)."""
        reference = self._reference
        for at, baseline in self._history:
            if at > watched_hours - self.reference_lag_hours:
                break
            reference = baseline
        if reference is None:
            created = self._created_watched
            if created is None and hours > 0:  # a new model: dated by its first sample
                created = watched_hours - hours
            # A GPU clean through its warm-up that starts to correct errors: its rate then was
            # the floor's.
            if created is None or created < self.warmup_hours:
                return None
            reference = self.floor_per_day / 24.0
        return max(reference, self.floor_per_day / 24.0)

    @property
    def baseline_per_hour(self) -> float:
        """The GPU's usual correctable-error rate, per hour (never below the floor)."""
        return max(self._baseline, self.floor_per_day / 24.0)

    @property
    def recent_deltas(self) -> tuple[int, ...]:
        """The deltas of the window (oldest first), for the incident's evidence."""
        return tuple(delta for delta, _ in self._recent)


def ecc_trend_filter(threshold: float = 6.0, **params: Any) -> Threshold:
    """The template the core clones per GPU: an :class:`EccTrendScorer` behind a threshold.

    Protected: a sample scored anomalous does not enter the baseline, so a degrading GPU is not
    learned as normal while it degrades. The default threshold is a one-in-a-million surprise.
    """
    return Threshold(EccTrendScorer(**params), threshold=threshold, protect_anomaly_detector=True)
