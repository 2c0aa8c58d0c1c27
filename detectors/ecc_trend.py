"""ECC trend detector (SPEC 4.3, the model part): correctable-error spikes and sustained rises.

A GPU whose correctable (SBE) count keeps rising sample after sample is degrading: NVIDIA and
Kokolis et al. treat a rising correctable rate as the precursor of an uncorrectable error. A
single burst of one to three corrected bits, which most fleets show now and then, is not.

The model follows River's anomaly-detector protocol: ``learn_one(x)`` updates the state of one
GPU, ``score_one(x)`` scores a sample (high = anomalous) without changing it, and a separate
:class:`river.anomaly.ThresholdFilter` turns scores into decisions. The core clones one model per
GPU, and only for GPUs that have ever shown a correctable error (most never do).

Assumptions
-----------
* ``x["sbe_delta"]`` is the increase of the GPU's SBE counter since its previous sample, after
  counter-reset handling (:func:`detectors.ecc_rules.ecc_step`); ``x["hours"]`` is the time
  between the two samples. Gaps in sampling lengthen ``hours`` and lower the rate, never raise it.
* Warm-up: none is needed; a GPU with no history scores by persistence alone, so the first
  sample of a GPU can never reach the threshold unless it is a spike.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from river.base import AnomalyDetector
from river.base.typing import FeatureName

from detectors.thresholds import Threshold

__all__ = ["EccTrendScorer", "ecc_trend_filter"]


class EccTrendScorer(AnomalyDetector):
    """Scores a GPU's latest SBE delta by persistence and rate.

    ``score = max(rises / min_rises, rate / spike_rate_per_hour)`` where ``rises`` counts the
    samples among the last ``window`` (this one included) whose SBE counter went up. A score of
    1 means "``min_rises`` rises in ``window`` samples" or "a spike of ``spike_rate_per_hour``".

    Parameters
    ----------
    window
        How many recent samples persistence looks at.
    min_rises
        Rises within ``window`` samples that make a trend (score 1.0).
    spike_rate_per_hour
        Correctable errors per hour that make a spike on their own (score 1.0).

    Examples
    --------
    >>> model = EccTrendScorer()
    >>> for delta in (2, 0, 0, 0):   # one stray burst: not a trend
    ...     model.learn_one({"sbe_delta": delta, "hours": 6.0})
    >>> round(model.score_one({"sbe_delta": 1, "hours": 6.0}), 2)
    0.33
    >>> for delta in (3, 7):         # rising sample after sample
    ...     model.learn_one({"sbe_delta": delta, "hours": 6.0})
    >>> round(model.score_one({"sbe_delta": 15, "hours": 6.0}), 2)
    1.0
    """

    def __init__(self, window: int = 4, min_rises: int = 3, spike_rate_per_hour: float = 200.0) -> None:
        self.window = window
        self.min_rises = min_rises
        self.spike_rate_per_hour = spike_rate_per_hour
        self._recent: deque[int] = deque(maxlen=max(window - 1, 0))

    def learn_one(self, x: dict[FeatureName, Any]) -> None:
        """Remember the sample's delta."""
        if self._recent.maxlen:
            self._recent.append(int(x["sbe_delta"]))

    def score_one(self, x: dict[FeatureName, Any]) -> float:
        """Score the sample against the recent ones (the state is not changed)."""
        delta = int(x["sbe_delta"])
        rises = sum(1 for d in self._recent if d > 0) + (1 if delta > 0 else 0)
        hours = max(float(x.get("hours", 1.0)), 1e-3)
        return max(rises / self.min_rises, delta / hours / self.spike_rate_per_hour)

    @property
    def recent_deltas(self) -> tuple[int, ...]:
        """The deltas remembered (oldest first), for the incident's evidence."""
        return tuple(self._recent)


def ecc_trend_filter(threshold: float = 1.0, **params: Any) -> Threshold:
    """The template the core clones per GPU: an :class:`EccTrendScorer` behind a threshold.

    ``protect_anomaly_detector`` is off on purpose: a degrading GPU keeps degrading, and the
    persistence window must see every rise to stay above the threshold.
    """
    return Threshold(EccTrendScorer(**params), threshold=threshold, protect_anomaly_detector=False)
