"""The threshold object that turns a model's scores into decisions (River's ThresholdFilter).

It follows :class:`river.anomaly.ThresholdFilter` (a score at or above ``threshold`` is an
anomaly) but is built on :class:`river.base.AnomalyFilter` directly: importing
``river.anomaly`` imports scipy.stats through River's Gaussian scorer, about a second of every
command's start-up (a restarted worker's failover time included) for a six-line class.

River 0.26's ``AnomalyFilter.learn_one`` only ever updates the wrapped detector when
``protect_anomaly_detector`` is true (and the sample is normal); with protection off it learns
nothing at all. Our trend and spread models must see every sample, so this filter learns
unconditionally when unprotected and keeps River's behaviour otherwise.

The attributes are ThresholdFilter's (``anomaly_detector``, ``threshold``,
``protect_anomaly_detector``), so checkpoints pickled when this class derived from it load.

A plain ``clone()`` (the per-key model made from a template) unpickles a pristine clone made once:
River's clone walks the parameters through ``inspect.signature``, 150-320 µs for our models, and
a job-aware storm model is cloned for every job run.
"""

from __future__ import annotations

import pickle
from typing import Any, Self

from river.base import AnomalyDetector, AnomalyFilter
from river.base.typing import FeatureName

__all__ = ["Threshold"]


class Threshold(AnomalyFilter):
    """Flags a score at or above ``threshold``; an unprotected filter learns every sample.

    Parameters
    ----------
    anomaly_detector
        The wrapped scorer (high score = anomalous).
    threshold
        Scores at or above it are anomalies.
    protect_anomaly_detector
        If true, samples classified as anomalous are not learnt (River's default).

    Examples
    --------
    >>> from detectors.ecc_trend import EccTrendScorer
    >>> model = Threshold(EccTrendScorer(), threshold=1.0, protect_anomaly_detector=False)
    >>> for delta in (1, 2, 3):
    ...     model.learn_one({"sbe_delta": delta, "hours": 1.0})
    >>> model.anomaly_detector.recent_deltas
    (1, 2, 3)
    >>> model.is_anomaly(1.0), model.is_anomaly(0.99)
    (True, False)
    """

    def __init__(
        self,
        anomaly_detector: AnomalyDetector,
        threshold: float,
        protect_anomaly_detector: bool = True,
    ) -> None:
        super().__init__(anomaly_detector=anomaly_detector, protect_anomaly_detector=protect_anomaly_detector)
        self.threshold = threshold

    def clone(self, new_params: dict[str, Any] | None = None, include_attributes: bool = False) -> Self:
        """A fresh, unfitted copy with the same parameters (River's ``clone``).

        >>> from detectors.ecc_trend import EccTrendScorer
        >>> template = Threshold(EccTrendScorer(), threshold=1.0, protect_anomaly_detector=False)
        >>> copy = template.clone()
        >>> copy.learn_one({"sbe_delta": 4, "hours": 1.0})
        >>> copy.anomaly_detector.recent_deltas, template.clone().anomaly_detector.recent_deltas
        ((4,), ())
        """
        if new_params or include_attributes:
            return super().clone(new_params, include_attributes)
        pristine: bytes | None = self.__dict__.get("_pristine")
        if pristine is None:
            # Made on first use, not in __init__: a template unpickled from an older checkpoint
            # has none yet. Parameters are never changed in place (River's convention), so the
            # copy stays the template's.
            pristine = pickle.dumps(super().clone(), protocol=pickle.HIGHEST_PROTOCOL)
            self.__dict__["_pristine"] = pristine
        fresh: Self = pickle.loads(pristine)
        return fresh

    def classify(self, score: float) -> bool:
        """Whether ``score`` is an anomaly."""
        return score >= self.threshold

    def learn_one(self, x: dict[FeatureName, Any], **kwargs: Any) -> None:
        """Update the wrapped detector (unless protected and ``x`` scores as anomalous)."""
        if self.protect_anomaly_detector:
            super().learn_one(x, **kwargs)
        else:
            self.anomaly_detector.learn_one(x, **kwargs)

    def is_anomaly(self, score: float) -> bool:
        """Typed form of :meth:`classify`."""
        return self.classify(score)
