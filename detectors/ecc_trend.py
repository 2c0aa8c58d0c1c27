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
  since its first sample), samples are learned and scored 0: a GPU with a steady rate above the
  floor must not look anomalous on its first samples. A GPU watched for long that starts to
  correct errors is scored from its first error, against the floor.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from river.base import AnomalyDetector
from river.base.typing import FeatureName

from detectors.surprise import poisson_surprise
from detectors.thresholds import Threshold

__all__ = ["EccTrendScorer", "ecc_trend_filter"]


class EccTrendScorer(AnomalyDetector):
    """Scores a GPU's recent correctable errors against its own baseline rate.

    Parameters
    ----------
    window
        Samples (this one included) whose errors are tested together.
    baseline_alpha
        Weight of each new sample in the baseline rate once the GPU has been watched for long;
        before that the baseline is the mean rate over the whole time it was watched.
    floor_per_day
        The lowest baseline rate: what a healthy GPU may plausibly correct per day.
    warmup_hours
        Observation time before a GPU's samples are scored.

    Examples
    --------
    >>> model = EccTrendScorer()
    >>> for step, delta in enumerate((1, 0, 1, 1, 0, 1, 1, 0), start=1):   # ~2.5 a day: its normal
    ...     model.learn_one({"sbe_delta": delta, "hours": 6.0, "watched_hours": 6.0 * step})
    >>> round(model.score_one({"sbe_delta": 2, "hours": 6.0, "watched_hours": 54.0}), 1)
    0.6
    >>> round(model.score_one({"sbe_delta": 40, "hours": 6.0, "watched_hours": 54.0}), 1)  # far above
    35.5
    """

    def __init__(
        self,
        window: int = 4,
        baseline_alpha: float = 0.05,
        floor_per_day: float = 1.0,
        warmup_hours: float = 24.0,
    ) -> None:
        self.window = window
        self.baseline_alpha = baseline_alpha
        self.floor_per_day = floor_per_day
        self.warmup_hours = warmup_hours
        self._recent: deque[tuple[int, float]] = deque(maxlen=max(window - 1, 0))
        # The baseline starts at the floor, a prior worth one sample: a GPU clean until now that
        # corrects its first errors must not have them taken as its normal rate.
        self._baseline = floor_per_day / 24.0

    def learn_one(self, x: dict[FeatureName, Any]) -> None:
        """Fold the sample into the baseline and the recent window."""
        delta, hours = int(x["sbe_delta"]), max(float(x["hours"]), 1e-3)
        # The time-weighted mean rate over everything watched so far (a GPU clean for weeks has a
        # near-zero baseline however its first errors look), until that weight drops below alpha;
        # then an exponentially weighted mean that follows slow changes only.
        watched = max(float(x.get("watched_hours", hours)), hours)
        weight = max(self.baseline_alpha, hours / watched)
        self._baseline += weight * (delta / hours - self._baseline)
        if self._recent.maxlen:
            self._recent.append((delta, hours))

    def score_one(self, x: dict[FeatureName, Any]) -> float:
        """Poisson surprise of the recent errors given the baseline (the state is not changed)."""
        if float(x.get("watched_hours", self.warmup_hours)) < self.warmup_hours:
            return 0.0
        errors = int(x["sbe_delta"]) + sum(delta for delta, _ in self._recent)
        hours = max(float(x["hours"]), 1e-3) + sum(h for _, h in self._recent)
        return poisson_surprise(errors, self.baseline_per_hour * hours)

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
