"""The threshold object that turns a model's scores into decisions (River's ThresholdFilter).

River 0.26's ``AnomalyFilter.learn_one`` only ever updates the wrapped detector when
``protect_anomaly_detector`` is true (and the sample is normal); with protection off it learns
nothing at all. Our trend and spread models must see every sample, so this subclass learns
unconditionally when unprotected and keeps River's behaviour otherwise.
"""

from __future__ import annotations

from typing import Any

from river import anomaly
from river.base.typing import FeatureName

__all__ = ["Threshold"]


class Threshold(anomaly.ThresholdFilter):
    """A :class:`river.anomaly.ThresholdFilter` whose unprotected ``learn_one`` does learn.

    Examples
    --------
    >>> from detectors.ecc_trend import EccTrendScorer
    >>> model = Threshold(EccTrendScorer(), threshold=1.0, protect_anomaly_detector=False)
    >>> for delta in (1, 2, 3):
    ...     model.learn_one({"sbe_delta": delta, "hours": 1.0})
    >>> model.anomaly_detector.recent_deltas
    (1, 2, 3)
    """

    def learn_one(self, x: dict[FeatureName, Any], **kwargs: Any) -> None:
        """Update the wrapped detector (unless protected and ``x`` scores as anomalous)."""
        if self.protect_anomaly_detector:
            super().learn_one(x, **kwargs)
        else:
            self.anomaly_detector.learn_one(x, **kwargs)

    def is_anomaly(self, score: float) -> bool:
        """Typed form of :meth:`classify`."""
        return bool(self.classify(score))  # type: ignore[no-untyped-call]
