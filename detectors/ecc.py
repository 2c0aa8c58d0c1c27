"""Per-GPU ECC state: each sample through the rules and the trend model, and which samples to keep.

:class:`EccTracker` remembers the counters of each GPU's previous sample. A new sample is compared
with them (:func:`detectors.ecc_rules.ecc_step`: deltas that survive resets, and the rules that
are always critical), scored by the GPU's trend model (:mod:`detectors.ecc_trend`), and kept for
storage when it changes something or when the GPU's last stored sample is old enough: most
samples repeat the previous one, and storing each would fill the store with copies.

The tracker only finds. The detection core turns its findings into incidents and hardware
evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from detectors.ecc_rules import EccFinding, ecc_step
from detectors.ecc_trend import EccTrendScorer, ecc_trend_filter
from detectors.incidents import EvidenceItem, Finding
from detectors.thresholds import Threshold
from schemas.outputs import IncidentKind, Severity
from schemas.records import EccSample
from schemas.timeutil import HOUR_MS

__all__ = ["NOTHING_OBSERVED", "EccObservation", "EccRow", "EccTracker", "JobsAt", "corrected_errors"]

#: Who runs on a node: the sorted ids of its running jobs (:meth:`detectors.jobs.JobTracker.jobs_at`).
JobsAt = Callable[[str], tuple[str, ...]]
#: The fleet's usual correctable errors per GPU-day at an event time (negative: none), asked for
#: only when a GPU has no trusted past of its own (:mod:`detectors.fleet`).
FleetRate = Callable[[int], float]

_SBE_COUNTERS = ("sbe_volatile", "sbe_aggregate")


def _no_fleet(ts_ms: int) -> float:
    return -1.0


def corrected_errors(deltas: Mapping[str, int]) -> int:
    """The correctable (SBE) errors among a sample's counter deltas: the volatile counter's, else
    the aggregate's (a GPU that reports only that one).

    >>> corrected_errors({"sbe_volatile": 3, "sbe_aggregate": 3}), corrected_errors({"sbe_aggregate": 2})
    (3, 2)
    """
    return deltas.get("sbe_volatile", deltas.get("sbe_aggregate", 0))


@dataclass(frozen=True, slots=True)
class EccRow:
    """An ECC sample worth storing, with its deltas against the GPU's previous sample."""

    sample: EccSample
    deltas: Mapping[str, int]
    reset: bool


@dataclass(frozen=True, slots=True)
class EccObservation:
    """What one ECC sample brought.

    Attributes
    ----------
    rules
        Findings of the rules that fired: critical, and hardware evidence for attribution.
    trend
        The trend model's finding when the correctable errors rise anomalously, else None.
    row
        The sample to store, or None when it repeats the GPU's last stored one.
    """

    rules: tuple[Finding, ...]
    trend: Finding | None
    row: EccRow | None


#: What a sample that repeats its GPU's last one brings (the common case), always this object.
NOTHING_OBSERVED: Final = EccObservation((), None, None)


@dataclass(slots=True)
class _GpuEcc:
    counters: Mapping[str, int]
    last_stored_ms: int
    last_ms: int
    first_ms: int


class EccTracker:
    """ECC counters, trend models and storage downsampling of every GPU seen.

    Parameters
    ----------
    keep_interval_ms
        Samples that change nothing are stored at most this often per GPU.
    trend_threshold, trend_window, trend_floor_per_day
        The trend model's Poisson surprise (``-log10`` probability) that makes an anomaly, the
        samples tested together, and the lowest baseline correctable rate.

    Examples
    --------
    >>> ecc = EccTracker(keep_interval_ms=86_400_000, trend_threshold=6.0, trend_window=4,
    ...                  trend_floor_per_day=1.0)
    >>> def sample(ts_ms, dbe):
    ...     return EccSample(ts_ms=ts_ms, cluster="c", node="n1", gpu=0, counters={"dbe_volatile": dbe})
    >>> def no_jobs(node):
    ...     return ()
    >>> ecc.observe(sample(0, 0), no_jobs).row is not None      # a GPU's first sample is stored
    True
    >>> ecc.observe(sample(60_000, 0), no_jobs).row is None     # nothing changed
    True
    >>> [(f.kind.value, f.severity.value) for f in ecc.observe(sample(120_000, 1), no_jobs).rules]
    [('gpu_memory', 'critical')]
    """

    def __init__(
        self, *, keep_interval_ms: int, trend_threshold: float, trend_window: int, trend_floor_per_day: float
    ) -> None:
        self.keep_interval_ms = keep_interval_ms
        self._gpus: dict[tuple[str, str, str], _GpuEcc] = {}
        # Online models, River protocol: one clone of the template per GPU, created on first use.
        self._trend_template = ecc_trend_filter(
            threshold=trend_threshold, window=trend_window, floor_per_day=trend_floor_per_day
        )
        self._trends: dict[tuple[str, str, str], Threshold] = {}

    def observe(
        self, sample: EccSample, jobs_at: JobsAt, fleet_rate: FleetRate = _no_fleet
    ) -> EccObservation:
        """Compare a sample with its GPU's previous one; ``jobs_at`` names the jobs on a node,
        ``fleet_rate`` the fleet's usual correctable rate (for a GPU without a trusted past). What
        ``fleet_rate`` raises propagates before anything of the tracker changed (a caller may hold
        the sample and observe it again), exactly when :meth:`needs_fleet` says True."""
        key = (sample.cluster, sample.node, sample.gpu_key)
        state = self._gpus.get(key)
        step = ecc_step(state.counters if state is not None else None, sample.counters)
        # Nearly every sample fires no rule: skip the call then (this is the hot path).
        rules = _rule_findings(sample, step.findings, jobs_at) if step.findings else ()
        trend = None
        # A GPU without a trend model that corrected nothing since its last sample is not scored
        # (most GPUs never correct an error): no call on the hot path.
        if state is not None and (step.deltas or key in self._trends):
            trend = self._score_trend(key, sample, step.deltas, state, jobs_at, fleet_rate)
        store = (
            state is None
            or bool(step.deltas)
            or step.reset
            or sample.ts_ms - state.last_stored_ms >= self.keep_interval_ms
        )
        if state is None:
            self._gpus[key] = _GpuEcc(sample.counters, sample.ts_ms, sample.ts_ms, sample.ts_ms)
        else:
            state.counters = sample.counters
            state.last_ms = sample.ts_ms
            if store:
                state.last_stored_ms = sample.ts_ms
        if not rules and trend is None and not store:
            return NOTHING_OBSERVED  # the common case: a sample that repeats the last one
        return EccObservation(rules, trend, EccRow(sample, step.deltas, step.reset) if store else None)

    def needs_fleet(self, sample: EccSample) -> bool:
        """Whether scoring ``sample`` asks for the fleet's usual rate: its GPU has no trusted past
        of its own and either has a trend model or corrected errors since its previous sample
        (the same answer before the sample is observed as while it is)."""
        key = (sample.cluster, sample.node, sample.gpu_key)
        state = self._gpus.get(key)
        if state is None:
            return False  # a GPU's first sample is not scored
        model = self._trends.get(key)
        if model is None:
            # Most GPUs never correct an error: no model, and nothing corrected since the last
            # sample (asked of every ECC sample a worker releases, so without a loop).
            new, old = sample.counters, state.counters
            if new.get("sbe_volatile", 0) == old.get("sbe_volatile", 0) and new.get(
                "sbe_aggregate", 0
            ) == old.get("sbe_aggregate", 0):
                return False
            model = self._trend_template  # a new model: the template's state, not learnt yet
        watched = (sample.ts_ms - state.first_ms) / HOUR_MS
        hours = max(sample.ts_ms - state.last_ms, 1) / HOUR_MS
        scorer = cast(EccTrendScorer, model.anomaly_detector)
        if scorer.reference_per_hour(watched, hours) is not None:
            return False
        deltas = ecc_step(state.counters, sample.counters).deltas
        x: dict[Any, Any] = {
            "sbe_delta": corrected_errors(deltas),
            "hours": hours,
            "watched_hours": watched,
        }
        return scorer.fleet_could_flag(x, model.threshold)

    def _score_trend(
        self,
        key: tuple[str, str, str],
        sample: EccSample,
        deltas: Mapping[str, int],
        state: _GpuEcc,
        jobs_at: JobsAt,
        fleet_rate: FleetRate,
    ) -> Finding | None:
        sbe = corrected_errors(deltas)
        model = self._trends.get(key)
        if model is None:
            if sbe <= 0:
                return None  # most GPUs never correct an error: no model, no state
            model = self._trend_template.clone()
        x: dict[Any, Any] = {
            "sbe_delta": sbe,
            "hours": max(sample.ts_ms - state.last_ms, 1) / HOUR_MS,
            "watched_hours": (sample.ts_ms - state.first_ms) / HOUR_MS,
        }
        scorer = cast(EccTrendScorer, model.anomaly_detector)
        if scorer.reference_per_hour(x["watched_hours"], x["hours"]) is None and scorer.fleet_could_flag(
            x, model.threshold
        ):
            # May raise (a worker's core without the period's reference): nothing is changed yet,
            # so the caller can hold the sample and give it again once the reference is known.
            x["fleet_per_day"] = fleet_rate(sample.ts_ms)
        self._trends[key] = model
        score = model.score_one(x)
        finding = None
        if model.is_anomaly(score):
            recent = (*cast(EccTrendScorer, model.anomaly_detector).recent_deltas, sbe)
            finding = Finding(
                cluster=sample.cluster,
                kind=IncidentKind.ECC_TREND,
                node=sample.node,
                gpu=sample.gpu_key,
                severity=Severity.WARN,
                detector="ecc_trend",
                score=score,
                action="schedule a drain: run DCGM diagnostics and field tests; the GPU may be heading "
                "for an uncorrectable error",
                title="Correctable ECC errors rising sample after sample "
                f"(last deltas {', '.join(map(str, recent))})",
                evidence=EvidenceItem(
                    sample.ts_ms, counter_deltas=(("sbe", sbe),), jobs=jobs_at(sample.node)
                ),
            )
        model.learn_one(x)
        return finding


def _rule_findings(sample: EccSample, fired: tuple[EccFinding, ...], jobs_at: JobsAt) -> tuple[Finding, ...]:
    """The rules that fired on a sample, as findings about its GPU."""
    jobs = jobs_at(sample.node)
    return tuple(
        Finding(
            cluster=sample.cluster,
            kind=rule.kind,
            node=sample.node,
            gpu=sample.gpu_key,
            severity=rule.severity,
            detector="ecc_rules",
            score=1.0,
            action=rule.action,
            title=rule.title,
            evidence=EvidenceItem(sample.ts_ms, counter_deltas=rule.counter_deltas, jobs=jobs),
        )
        for rule in fired
    )
