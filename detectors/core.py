"""The detection core: one event-time state machine shared by embedded replay and Faust workers.

Feed it records in (roughly) event-time order with :meth:`DetectionCore.process`; collect what
it decided with :meth:`DetectionCore.drain`. It keeps a watermark, ``max event time seen minus
the allowed lateness``: a record older than the watermark is *late* and refused (the caller
dead-letters it), and every time-driven decision (attributing a failed job, resolving a quiet
incident, closing an MTTF window) waits until the watermark has passed the instant it depends
on. That is what makes the output independent of replay speed and batching.

The core is pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from river import stats

from detectors.attribution import HardwareEvent, NodeEvidenceLog
from detectors.ecc_rules import ecc_step
from detectors.ecc_trend import EccTrendScorer, ecc_trend_filter
from detectors.incidents import EvidenceItem, IncidentTracker, incident_id
from detectors.lemon import DAY_MS, LemonConfig, LemonTracker
from detectors.mttf import MS_PER_HOUR, SizeBuckets, window_slices
from detectors.thresholds import Threshold
from detectors.xid_burst import XidSpreadScorer, XidStormScorer, spread_filter, storm_filter
from detectors.xid_catalog import XidCategory, classify_xid
from schemas.outputs import Incident, IncidentStatus, JobAttribution, MttfPartial, Severity
from schemas.records import EccSample, JobEvent, JobState, XidEvent

__all__ = ["CoreConfig", "DetectionCore", "EccRow", "Emitted"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Tunables of the detection core (the CLI and the worker fill it from settings).

    Attributes
    ----------
    windows_s
        Tumbling MTTF window lengths in seconds.
    size_buckets
        Job-size buckets for MTTF rows.
    allowed_lateness_ms
        How far behind the newest event a record may arrive and still be used.
    quiet_period_ms
        An incident without new evidence for this long is resolved.
    attribution_before_ms, attribution_after_ms
        Attribution window around a failed job's end (the paper: 10 min before, 5 min after).
    gpus_per_node
        GPUs of a node, for projections and for jobs that do not state their GPU count.
    ecc_keep_interval_ms
        ECC samples that change nothing are stored at most this often per GPU (downsampling).
    storm_window_hours, storm_min_events
        XID storm detector: window, and the fewest XIDs from one GPU that can make a storm.
    spread_window_hours, spread_min_events, spread_min_gpus
        NVLink flapping detector: window, errors and distinct GPUs of one node it takes.
    ecc_trend_window, ecc_trend_floor_per_day, ecc_trend_threshold
        ECC trend detector: samples tested together, the lowest baseline correctable rate, and
        the Poisson surprise (``-log10`` probability) that makes an anomaly.
    lemon
        Lemon-node detection (fleet statistics over a sliding window).
    quiet_period_by_kind_ms
        Quiet periods of the slow detectors, longer than the default on purpose: a degradation
        is seen once per ECC scrape, a lemon verdict once a day.
    """

    windows_s: tuple[int, ...] = (3600, 86400)
    size_buckets: SizeBuckets = field(default_factory=SizeBuckets)
    allowed_lateness_ms: int = 5 * 60_000
    quiet_period_ms: int = 60 * 60_000
    attribution_before_ms: int = 10 * 60_000
    attribution_after_ms: int = 5 * 60_000
    gpus_per_node: int = 8
    ecc_keep_interval_ms: int = DAY_MS
    storm_window_hours: float = 1.0
    storm_min_events: int = 20
    spread_window_hours: float = 24.0
    spread_min_events: int = 6
    spread_min_gpus: int = 2
    ecc_trend_window: int = 4
    ecc_trend_floor_per_day: float = 1.0
    ecc_trend_threshold: float = 6.0
    lemon: LemonConfig = field(default_factory=LemonConfig)
    quiet_period_by_kind_ms: tuple[tuple[str, int], ...] = (
        ("ecc_trend", 2 * DAY_MS),
        ("nvlink_flapping", DAY_MS),
        ("xid_storm", 2 * 60 * 60_000),
        ("lemon_node", 3 * DAY_MS),
    )


@dataclass(frozen=True, slots=True)
class EccRow:
    """An ECC sample worth storing, with its deltas against the GPU's previous sample."""

    sample: EccSample
    deltas: Mapping[str, int]
    reset: bool


@dataclass(slots=True)
class Emitted:
    """Everything the core decided since the last :meth:`DetectionCore.drain`."""

    incidents: list[Incident] = field(default_factory=list)
    attributions: list[JobAttribution] = field(default_factory=list)
    mttf: list[MttfPartial] = field(default_factory=list)
    ecc_rows: list[EccRow] = field(default_factory=list)


@dataclass(slots=True)
class _Run:
    """One run of a job (a requeued job has several), from its start to its terminal state."""

    cluster: str
    job_id: str
    start_ms: int
    nodes: tuple[str, ...]
    gpus: int
    covered_ms: list[int]  # per window length: exposure already emitted up to here


@dataclass(slots=True)
class _GpuEcc:
    counters: Mapping[str, int]
    last_stored_ms: int
    last_ms: int
    first_ms: int


_FAILURE_STATES = frozenset({JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.TIMEOUT})
_NO_DEADLINE = 2**63


class DetectionCore:
    """XID classification, ECC rules, job attribution, incident lifecycle and MTTF partial rows.

    Examples
    --------
    >>> core = DetectionCore(CoreConfig())
    >>> core.process(XidEvent(ts_ms=0, cluster="c", node="n1", xid=79, pci_bus_id="0000:07:00"))
    True
    >>> [(i.kind, i.severity.value, i.status.value) for i in core.drain().incidents]
    [('gpu_bus', 'critical', 'open')]
    >>> core.process(XidEvent(ts_ms=-10 * 60_000, cluster="c", node="n1", xid=13))  # older than lateness
    False
    """

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.max_event_ms: int | None = None
        self._emitted = Emitted()
        self._incidents = IncidentTracker(config.quiet_period_ms, dict(config.quiet_period_by_kind_ms))
        self._evidence = NodeEvidenceLog(
            config.attribution_before_ms + config.attribution_after_ms + config.allowed_lateness_ms
        )
        self._gpus: dict[tuple[str, str, str], _GpuEcc] = {}
        self._runs: dict[tuple[str, str], _Run] = {}
        self._jobs_on_node: dict[str, set[str]] = {}
        self._ended_runs: dict[tuple[str, str, int], int] = {}
        # (decide-at, sequence, run, final event) for failed runs awaiting attribution.
        self._pending: list[tuple[int, int, _Run, JobEvent]] = []
        self._sequence = 0
        self._window_ms = tuple(seconds * 1000 for seconds in config.windows_s)
        self._next_close: list[int] | None = None
        self._next_deadline = _NO_DEADLINE
        # Online models, River protocol: one clone of each template per key, created on first use.
        self._storm_template = storm_filter(
            window_hours=config.storm_window_hours, min_events=config.storm_min_events
        )
        self._spread_template = spread_filter(
            window_hours=config.spread_window_hours,
            min_events=config.spread_min_events,
            min_gpus=config.spread_min_gpus,
        )
        self._trend_template = ecc_trend_filter(
            threshold=config.ecc_trend_threshold,
            window=config.ecc_trend_window,
            floor_per_day=config.ecc_trend_floor_per_day,
        )
        self._storms: dict[tuple[str, str, str], Threshold] = {}
        self._spreads: dict[tuple[str, str, str], Threshold] = {}
        self._trends: dict[tuple[str, str, str], Threshold] = {}
        # The fleet's usual XID burst: a high quantile of the peak window counts of finished bursts.
        self._fleet_window_counts = stats.Quantile(0.99)
        self._storming: set[tuple[str, str, str]] = set()  # GPUs whose current burst was flagged
        self._lemons = LemonTracker(config.lemon)
        self._cluster_of: dict[str, str] = {}
        self._next_lemon_ms: int | None = None

    # -- public API --------------------------------------------------------------------------

    @property
    def watermark_ms(self) -> int | None:
        """Event time before which every record is considered seen; None before the first one."""
        if self.max_event_ms is None:
            return None
        return self.max_event_ms - self.config.allowed_lateness_ms

    def process(self, record: XidEvent | EccSample | JobEvent) -> bool:
        """Process one record; return False (and do nothing) when it is later than allowed."""
        ts = record.ts_ms
        watermark = self.watermark_ms
        if watermark is not None and ts < watermark:
            return False
        if self.max_event_ms is None or ts > self.max_event_ms:
            self._advance_to(ts)
        if isinstance(record, EccSample):
            self._process_ecc(record)
        elif isinstance(record, XidEvent):
            self._process_xid(record)
        else:
            self._process_job(record)
        return True

    def drain(self) -> Emitted:
        """Return and forget what was decided since the previous call."""
        emitted, self._emitted = self._emitted, Emitted()
        return emitted

    def finish(self) -> Emitted:
        """End of input: decide every pending attribution and emit the exposure of running jobs.

        Running jobs contribute their exposure up to the last event time as partial rows with
        a version below that of any later, longer row of the same run, so continuing the replay
        later replaces them.
        """
        if self.max_event_ms is not None:
            end = self.max_event_ms
            self._advance_to(end + self.config.allowed_lateness_ms + 1, closing=False)
            while self._pending:
                _, _, run, event = heapq.heappop(self._pending)
                self._decide(run, event)
            for run in sorted(self._runs.values(), key=lambda r: (r.cluster, r.job_id, r.start_ms)):
                self._emit_exposure(run, end, None, final=False)
        return self.drain()

    # -- time ----------------------------------------------------------------------------------

    def _advance_to(self, max_event_ms: int, closing: bool = True) -> None:
        if self._next_close is None:
            self._next_close = [max_event_ms - max_event_ms % w + w for w in self._window_ms]
            every = self.config.lemon.evaluate_every_ms
            self._next_lemon_ms = max_event_ms - max_event_ms % every + every
            self._refresh_deadline()
        self.max_event_ms = max_event_ms
        watermark = max_event_ms - self.config.allowed_lateness_ms
        if watermark <= self._next_deadline:
            return
        # Time-driven work happens in event-time order: everything due before a lemon
        # evaluation instant is done before that evaluation, whatever size the watermark's jump.
        while closing and self._next_lemon_ms is not None and self._next_lemon_ms <= watermark:
            instant = self._next_lemon_ms
            self._run_due(instant, closing)
            self._evaluate_lemons(instant)
            self._next_lemon_ms = instant + self.config.lemon.evaluate_every_ms
        self._run_due(watermark, closing)
        self._evidence.prune(watermark - self.config.attribution_before_ms - self.config.attribution_after_ms)
        self._refresh_deadline()

    def _run_due(self, instant: int, closing: bool) -> None:
        while self._pending and self._pending[0][0] < instant:
            _, _, run, event = heapq.heappop(self._pending)
            self._decide(run, event)
        self._emitted.incidents.extend(self._incidents.resolve_idle(instant))
        if closing:
            self._close_windows(instant)

    def _refresh_deadline(self) -> None:
        candidates = [self._pending[0][0]] if self._pending else []
        if self._incidents.next_deadline_ms is not None:
            candidates.append(self._incidents.next_deadline_ms)
        if self._next_close is not None:
            candidates.extend(self._next_close)
        if self._next_lemon_ms is not None:
            candidates.append(self._next_lemon_ms)
        self._next_deadline = min(candidates) if candidates else _NO_DEADLINE

    def _close_windows(self, watermark: int) -> None:
        assert self._next_close is not None
        for index, window_ms in enumerate(self._window_ms):
            while self._next_close[index] <= watermark:
                close = self._next_close[index]
                for run in self._runs.values():
                    self._emit_exposure_window(run, index, close)
                self._next_close[index] = close + window_ms
        horizon = watermark - max(self._window_ms, default=0)
        if len(self._ended_runs) > 4096:
            self._ended_runs = {key: end for key, end in self._ended_runs.items() if end >= horizon}

    def _evaluate_lemons(self, now: int) -> None:
        for verdict in self._lemons.evaluate(now):
            crossed = ", ".join(
                f"{name} {verdict.counts[name]} where {verdict.expected[name]:.2g} is usual"
                for name in verdict.crossed
            )
            self._emitted.incidents.extend(
                self._incidents.observe(
                    self._cluster_of.get(verdict.node, ""),
                    "lemon_node",
                    verdict.node,
                    "",
                    Severity.WARN,
                    "lemon_fleet",
                    verdict.score,
                    "drain the node and run full diagnostics; replace parts or retire it if they fail",
                    f"Lemon node: signals far above the fleet over "
                    f"{self.config.lemon.window_ms // DAY_MS} d"
                    f" ({crossed or 'combined'})",
                    EvidenceItem(
                        now, counter_deltas=tuple(sorted(verdict.counts.items())), jobs=verdict.jobs_hurt
                    ),
                )
            )

    def _see(self, cluster: str, node: str, ts_ms: int) -> None:
        if node not in self._cluster_of:
            self._cluster_of[node] = cluster
            self._lemons.see_node(node, ts_ms)

    # -- XID -----------------------------------------------------------------------------------

    def _process_xid(self, event: XidEvent) -> None:
        self._see(event.cluster, event.node, event.ts_ms)
        self._lemons.record_xid(event.node, event.ts_ms)
        info = classify_xid(event.xid)
        gpu = event.gpu_key
        # NVLink errors come in bursts on several GPUs: the spread detector owns them, the storm
        # detector looks at everything else one GPU logs.
        if info.category is XidCategory.NVLINK:
            self._score_spread(event, gpu, "nvlink_flapping")
        else:
            self._score_storm(event, gpu)
        if info.severity is Severity.INFO:
            return  # application-class: stored with the raw events, never an incident on its own
        kind = "xid_unknown" if info.category is XidCategory.UNKNOWN else f"gpu_{info.category.value}"
        versions = self._incidents.observe(
            event.cluster,
            kind,
            event.node,
            gpu,
            info.severity,
            "xid_classifier",
            1.0 if info.severity is Severity.CRITICAL else 0.5,
            info.action,
            info.name,
            EvidenceItem(event.ts_ms, xid=event.xid, message=event.message, jobs=self._jobs_at(event.node)),
        )
        self._emitted.incidents.extend(versions)
        if (
            info.hardware
            and info.severity is Severity.CRITICAL
            and versions[-1].status is IncidentStatus.OPEN
        ):
            self._lemons.record(event.node, "hw_incidents", event.ts_ms)
        if info.hardware and info.severity is Severity.CRITICAL:
            self._evidence.add(HardwareEvent(event.ts_ms, event.node, gpu, kind, event.xid))

    def _score_storm(self, event: XidEvent, gpu: str) -> None:
        key = (event.cluster, event.node, gpu)
        model = self._storms.get(key)
        if model is None:
            model = self._storms[key] = self._storm_template.clone()
        usual = self._fleet_window_counts.get()
        x: dict[Any, Any] = {"t": event.ts_ms / MS_PER_HOUR, "fleet_usual": usual or 0.0}
        score = model.score_one(x)
        storming = model.is_anomaly(score)
        if storming:
            info = classify_xid(event.xid)
            self._emitted.incidents.extend(
                self._incidents.observe(
                    event.cluster,
                    "xid_storm",
                    event.node,
                    gpu,
                    Severity.WARN,
                    "xid_burst",
                    score,
                    "check the job on this GPU (a crash loop?) and the GPU; drain it if the storm persists",
                    f"XID storm from one GPU, far above its own and the fleet's rate ({info.name})",
                    EvidenceItem(
                        event.ts_ms, xid=event.xid, message=event.message, jobs=self._jobs_at(event.node)
                    ),
                )
            )
        model.learn_one(x)
        finished_peak = cast(XidStormScorer, model.anomaly_detector).take_finished_peak()
        if finished_peak is not None:
            if key in self._storming:
                self._storming.discard(key)  # a storm's peak is not what the fleet usually sees
            else:
                self._fleet_window_counts.update(finished_peak)
        if storming:
            self._storming.add(key)

    def _score_spread(self, event: XidEvent, gpu: str, kind: str) -> None:
        key = (event.cluster, event.node, kind)
        model = self._spreads.get(key)
        if model is None:
            model = self._spreads[key] = self._spread_template.clone()
        x: dict[Any, Any] = {"t": event.ts_ms / MS_PER_HOUR, "gpu": gpu}
        score = model.score_one(x)
        model.learn_one(x)
        if model.is_anomaly(score):
            gpus = cast(XidSpreadScorer, model.anomaly_detector).gpus
            self._emitted.incidents.extend(
                self._incidents.observe(
                    event.cluster,
                    kind,
                    event.node,
                    "",
                    Severity.WARN,
                    "xid_burst",
                    score,
                    "drain the node and check its NVLink/NVSwitch fabric (nvidia-smi nvlink -e, diagnostics)",
                    f"NVLink errors recurring across GPUs {', '.join(gpus)}",
                    EvidenceItem(
                        event.ts_ms, xid=event.xid, message=event.message, jobs=self._jobs_at(event.node)
                    ),
                )
            )

    # -- ECC -----------------------------------------------------------------------------------

    def _process_ecc(self, sample: EccSample) -> None:
        self._see(sample.cluster, sample.node, sample.ts_ms)
        key = (sample.cluster, sample.node, sample.gpu_key)
        state = self._gpus.get(key)
        step = ecc_step(state.counters if state is not None else None, sample.counters)
        for finding in step.findings:
            versions = self._incidents.observe(
                sample.cluster,
                finding.kind,
                sample.node,
                sample.gpu_key,
                finding.severity,
                "ecc_rules",
                1.0,
                finding.action,
                finding.title,
                EvidenceItem(
                    sample.ts_ms, counter_deltas=finding.counter_deltas, jobs=self._jobs_at(sample.node)
                ),
            )
            self._emitted.incidents.extend(versions)
            if versions[-1].status is IncidentStatus.OPEN:
                self._lemons.record(sample.node, "hw_incidents", sample.ts_ms)
            self._evidence.add(HardwareEvent(sample.ts_ms, sample.node, sample.gpu_key, finding.kind))
        if state is not None:
            self._score_trend(key, sample, step.deltas, state)
        store = (
            state is None
            or bool(step.deltas)
            or step.reset
            or sample.ts_ms - state.last_stored_ms >= self.config.ecc_keep_interval_ms
        )
        if store:
            self._emitted.ecc_rows.append(EccRow(sample, step.deltas, step.reset))
        if state is None:
            self._gpus[key] = _GpuEcc(sample.counters, sample.ts_ms, sample.ts_ms, sample.ts_ms)
        else:
            state.counters = sample.counters
            state.last_ms = sample.ts_ms
            if store:
                state.last_stored_ms = sample.ts_ms

    def _score_trend(
        self, key: tuple[str, str, str], sample: EccSample, deltas: Mapping[str, int], state: _GpuEcc
    ) -> None:
        sbe = deltas.get("sbe_volatile", deltas.get("sbe_aggregate", 0))
        model = self._trends.get(key)
        if model is None:
            if sbe <= 0:
                return  # most GPUs never correct an error: no model, no state
            model = self._trends[key] = self._trend_template.clone()
        x: dict[Any, Any] = {
            "sbe_delta": sbe,
            "hours": max(sample.ts_ms - state.last_ms, 1) / MS_PER_HOUR,
            "watched_hours": (sample.ts_ms - state.first_ms) / MS_PER_HOUR,
        }
        score = model.score_one(x)
        if model.is_anomaly(score):
            recent = (*cast(EccTrendScorer, model.anomaly_detector).recent_deltas, sbe)
            self._emitted.incidents.extend(
                self._incidents.observe(
                    sample.cluster,
                    "ecc_trend",
                    sample.node,
                    sample.gpu_key,
                    Severity.WARN,
                    "ecc_trend",
                    score,
                    "schedule a drain: run DCGM diagnostics and field tests; the GPU may be heading for an "
                    "uncorrectable error",
                    "Correctable ECC errors rising sample after sample "
                    f"(last deltas {', '.join(map(str, recent))})",
                    EvidenceItem(
                        sample.ts_ms, counter_deltas=(("sbe", sbe),), jobs=self._jobs_at(sample.node)
                    ),
                )
            )
        model.learn_one(x)

    # -- jobs ----------------------------------------------------------------------------------

    def _jobs_at(self, node: str) -> tuple[str, ...]:
        jobs = self._jobs_on_node.get(node)
        return tuple(sorted(jobs)) if jobs else ()

    def _process_job(self, event: JobEvent) -> None:
        key = (event.cluster, event.job_id)
        if event.state is JobState.RUNNING:
            start = event.start_ms if event.start_ms is not None else event.ts_ms
            if key in self._runs or (event.cluster, event.job_id, start) in self._ended_runs:
                return  # a redelivered start
            self._runs[key] = _Run(
                event.cluster,
                event.job_id,
                start,
                event.nodes,
                self._gpus_of(event),
                [start] * len(self._window_ms),
            )
            for node in event.nodes:
                self._see(event.cluster, node, event.ts_ms)
                self._lemons.record(node, "job_runs", start)
                self._jobs_on_node.setdefault(node, set()).add(event.job_id)
            return
        if not event.state.is_terminal:
            return
        run = self._runs.pop(key, None)
        if run is None:
            start = event.start_ms if event.start_ms is not None else event.ts_ms
            run = _Run(
                event.cluster,
                event.job_id,
                start,
                event.nodes,
                self._gpus_of(event),
                [start] * len(self._window_ms),
            )
        end = event.end_ms if event.end_ms is not None else event.ts_ms
        run_key = (run.cluster, run.job_id, run.start_ms)
        if run_key in self._ended_runs:
            return  # a redelivered end
        self._ended_runs[run_key] = end
        for node in run.nodes:
            jobs = self._jobs_on_node.get(node)
            if jobs is not None:
                jobs.discard(run.job_id)
                if not jobs:
                    del self._jobs_on_node[node]
        if event.state.may_be_hardware_failure:
            for node in run.nodes:
                self._lemons.record_failed_job(node, run.job_id, end)
            if event.state is JobState.NODE_FAIL and len(run.nodes) == 1:
                self._lemons.record(run.nodes[0], "node_fails", end)
            self._sequence += 1
            decide_at = end + self.config.attribution_after_ms
            heapq.heappush(self._pending, (decide_at, self._sequence, run, event))
            self._next_deadline = min(self._next_deadline, decide_at)
        else:
            self._emit_exposure(run, end, event.state, final=True)

    def _gpus_of(self, event: JobEvent) -> int:
        return event.gpus or max(len(event.nodes), 1) * self.config.gpus_per_node

    def _decide(self, run: _Run, event: JobEvent) -> None:
        end = event.end_ms if event.end_ms is not None else event.ts_ms
        evidence = self._evidence.between(
            run.nodes, end - self.config.attribution_before_ms, end + self.config.attribution_after_ms
        )
        hardware = bool(evidence)
        inc_id = incident_id(run.cluster, "job_hw_failure", f"job/{run.job_id}", end) if hardware else ""
        nodes = tuple(sorted({e.node for e in evidence}))
        buckets = self.config.size_buckets
        attribution = JobAttribution(
            cluster=run.cluster,
            job_id=run.job_id,
            state=event.state.value,
            start_ms=run.start_ms,
            end_ms=end,
            num_nodes=len(run.nodes),
            gpus=run.gpus,
            size_bucket=buckets.label(run.gpus),
            hardware=hardware,
            evidence_nodes=nodes,
            evidence_xids=tuple(sorted({e.xid for e in evidence if e.xid is not None})),
            evidence_kinds=tuple(sorted({e.kind for e in evidence})),
            incident_id=inc_id,
        )
        self._emitted.attributions.append(attribution)
        for node in nodes:
            self._lemons.record(node, "hw_failures", end)
        if hardware:
            self._emitted.incidents.append(self._job_incident(run, event, attribution, evidence))
        self._emit_exposure(run, end, event.state, final=True, failure=hardware)

    def _job_incident(
        self, run: _Run, event: JobEvent, attribution: JobAttribution, evidence: list[HardwareEvent]
    ) -> Incident:
        first = evidence[0]
        codes = ", ".join(f"XID {x}" for x in attribution.evidence_xids) or ", ".join(
            attribution.evidence_kinds
        )
        summary = (
            f"[warn] Job {run.job_id} ({run.gpus} GPUs on {len(run.nodes)} nodes) ended {event.state.value} "
            f"after {attribution.gpu_hours:.1f} GPU-hours; hardware evidence on "
            f"{', '.join(attribution.evidence_nodes)}"
            f" ({codes}). Action: requeue the job away from the evidence nodes"
        )
        return Incident(
            incident_id=attribution.incident_id,
            kind="job_hw_failure",
            severity=Severity.WARN,
            status=IncidentStatus.RESOLVED,
            cluster=run.cluster,
            node=first.node,
            gpu=first.gpu,
            first_evidence_ms=first.ts_ms,
            last_evidence_ms=max(evidence[-1].ts_ms, attribution.end_ms),
            detected_ms=attribution.end_ms + self.config.attribution_after_ms,
            detector="job_attribution",
            score=1.0,
            action="requeue away from the evidence nodes; the node incidents carry the hardware action",
            summary=summary,
            evidence={
                "job_id": run.job_id,
                "state": event.state.value,
                "gpus": run.gpus,
                "nodes": list(run.nodes[:64]),
                "num_nodes": len(run.nodes),
                "gpu_hours_lost": round(attribution.gpu_hours, 3),
                "hardware_events": [
                    {"ts": e.ts_ms, "node": e.node, "gpu": e.gpu, "kind": e.kind, "xid": e.xid}
                    for e in evidence[:20]
                ],
            },
            evidence_count=len(evidence),
            version=3,
        )

    # -- MTTF exposure -------------------------------------------------------------------------

    def _emit_exposure_window(self, run: _Run, index: int, close_ms: int) -> None:
        window_ms = self._window_ms[index]
        window_start = close_ms - window_ms
        begin = max(run.start_ms, window_start)
        if begin < close_ms:
            self._emitted.mttf.append(self._partial(run, index, window_start, close_ms - begin, close_ms * 4))
        run.covered_ms[index] = close_ms

    def _emit_exposure(
        self, run: _Run, end_ms: int, state: JobState | None, *, final: bool, failure: bool = False
    ) -> None:
        for index, window_ms in enumerate(self._window_ms):
            begin = max(run.start_ms, run.covered_ms[index])
            slices = list(window_slices(begin, end_ms, window_ms))
            if not slices and final:
                slices = [(end_ms - end_ms % window_ms, 0)]
            for number, (window_start, overlap_ms) in enumerate(slices):
                last = number == len(slices) - 1
                ended = final and last
                self._emitted.mttf.append(
                    self._partial(
                        run,
                        index,
                        window_start,
                        overlap_ms,
                        # Later coverage wins; at the end, a final row wins over a running one
                        # and a hardware verdict over none (a job spanning partitions is
                        # judged by each with its own nodes' evidence).
                        end_ms * 4 + 2 * int(final) + int(ended and failure),
                        ended=ended,
                        failed=ended and state in _FAILURE_STATES,
                        failure=ended and failure,
                    )
                )

    def _partial(
        self,
        run: _Run,
        index: int,
        window_start_ms: int,
        overlap_ms: int,
        version: int,
        *,
        ended: bool = False,
        failed: bool = False,
        failure: bool = False,
    ) -> MttfPartial:
        hours = overlap_ms / MS_PER_HOUR
        buckets = self.config.size_buckets
        return MttfPartial(
            window_seconds=self._window_ms[index] // 1000,
            window_start_ms=window_start_ms,
            cluster=run.cluster,
            size_bucket=buckets.label(run.gpus),
            job_id=run.job_id,
            run_start_ms=run.start_ms,
            size_bucket_min_gpus=buckets.lower_bound(run.gpus),
            node_hours=len(run.nodes) * hours if run.nodes else hours,
            gpu_hours=run.gpus * hours,
            job_hours=hours,
            jobs_ended=int(ended),
            jobs_failed=int(failed),
            failures=int(failure),
            version=version,
        )
