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

from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any, cast

from detectors.attribution import HardwareEvent
from detectors.ecc import NOTHING_OBSERVED, EccObservation, EccRow, EccTracker, corrected_errors
from detectors.exposure import ExposureTracker
from detectors.fleet import (
    APP_XID,
    ECC_FLAGGED,
    ECC_SBE,
    PEAK,
    PRESENT,
    RUN,
    SEEN,
    SIGNAL,
    FleetConfig,
    FleetCore,
    FleetFact,
    JobPart,
)
from detectors.incidents import EvidenceItem, Finding, IncidentTracker
from detectors.jobs import Decided, JobRun, JobTracker
from detectors.lemon import LemonConfig
from detectors.mttf import SizeBuckets
from detectors.sxid_catalog import classify_sxid
from detectors.thresholds import Threshold
from detectors.xid_burst import XidSpreadScorer, XidStormScorer, spread_filter, storm_filter
from detectors.xid_catalog import CONTEXT_WINDOW_MS, XidCategory, XidInfo, XidOverride, classify_xid
from detectors.xid_reports import XidReports
from schemas.outputs import Incident, IncidentKind, IncidentStatus, JobAttribution, MttfPartial, Severity
from schemas.records import EccSample, JobEvent, JobState, XidEvent
from schemas.timeutil import DAY_MS, HOUR_MS, MINUTE_MS

__all__ = ["CoreConfig", "DetectionCore", "EccRow", "Emitted", "FleetBaselineMissing"]


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
        XID storm detector: window, and the fewest XIDs from one GPU that can make a storm (a
        job's storm too, :attr:`storm_owner_window_hours`).
    spread_window_hours, spread_min_events, spread_min_gpus
        NVLink flapping detector: window, and the errors and distinct GPUs of one node it takes
        (and :attr:`spread_min_bursts`).
    ecc_trend_window, ecc_trend_floor_per_day, ecc_trend_threshold
        ECC trend detector: samples tested together, the lowest baseline correctable rate, and
        the Poisson surprise (``-log10`` probability) that makes an anomaly.
    lemon
        Lemon-node detection (fleet statistics over a sliding window).
    storm_baseline_period_ms
        Period of the fleet's storm baseline (:mod:`detectors.fleet`): events of a period are
        judged against the bursts the fleet finished before the previous period began.
    quiet_period_by_kind_ms
        Quiet periods of the slow detectors, longer than the default on purpose: a degradation
        is seen once per ECC scrape, a lemon verdict once a day.
    storm_owner_window_hours
        Job-aware storms: a storm of application-class XIDs from the one job running on its node
        is that job's (``job_xid_storm``, addressed to its owner, no node verdict); it is the
        GPU's (``xid_storm``) when the same GPU stormed under another user's job within this
        many hours before (evidence that stays with the GPU across users).
    spread_min_bursts
        NVLink flapping detector: the separate bursts (more than 10 minutes apart) the errors
        must come in within the window; one burst is the links going down once (a reset).
    storm_baseline_min_gpus
        The fleet's usual burst is never above what at least this many distinct GPUs reached
        (:mod:`detectors.fleet`).
    ecc_reference_period_ms, ecc_reference_window_ms, ecc_reference_min_gpus
        The fleet's healthy ceiling of correctable rates, which a GPU without a trusted past of its
        own is compared with (:mod:`detectors.fleet`): decided every period, over the window, from
        the rates of at least this many GPUs.
    """

    windows_s: tuple[int, ...] = (3600, 86400)
    size_buckets: SizeBuckets = field(default_factory=SizeBuckets)
    allowed_lateness_ms: int = 5 * MINUTE_MS
    quiet_period_ms: int = HOUR_MS
    attribution_before_ms: int = 10 * MINUTE_MS
    attribution_after_ms: int = 5 * MINUTE_MS
    gpus_per_node: int = 8
    ecc_keep_interval_ms: int = DAY_MS
    storm_window_hours: float = 1.0
    storm_min_events: int = 10
    spread_window_hours: float = 24.0
    spread_min_events: int = 6
    spread_min_gpus: int = 1
    ecc_trend_window: int = 4
    ecc_trend_floor_per_day: float = 1.0
    ecc_trend_threshold: float = 6.0
    lemon: LemonConfig = field(default_factory=LemonConfig)
    storm_baseline_period_ms: int = DAY_MS
    quiet_period_by_kind_ms: tuple[tuple[IncidentKind, int], ...] = (
        (IncidentKind.ECC_TREND, 2 * DAY_MS),
        (IncidentKind.NVLINK_FLAPPING, DAY_MS),
        (IncidentKind.XID_STORM, 2 * HOUR_MS),
        (IncidentKind.JOB_XID_STORM, 2 * HOUR_MS),
        (IncidentKind.LEMON_NODE, 3 * DAY_MS),
    )
    # New fields go last: a worker checkpoint pickles the configuration as its values in order.
    storm_owner_window_hours: float = 168.0
    spread_min_bursts: int = 2
    storm_baseline_min_gpus: int = 10
    ecc_reference_period_ms: int = HOUR_MS
    ecc_reference_window_ms: int = 7 * DAY_MS
    ecc_reference_min_gpus: int = 10

    def __post_init__(self) -> None:
        if self.storm_owner_window_hours < 0:
            raise ValueError("the storm owner window must not be negative")
        if self.allowed_lateness_ms + self.attribution_after_ms >= self.storm_baseline_period_ms:
            raise ValueError(
                "the storm baseline period must be longer than the allowed lateness plus the "
                "attribution window after a job's end"
            )
        if self.ecc_reference_period_ms <= 0:
            raise ValueError("the ECC reference period must be positive")
        if self.ecc_reference_min_gpus < 1:
            raise ValueError("the ECC reference needs at least 1 GPU")

    @property
    def ecc_period_ms(self) -> int:
        """The ECC reference period in use: ``ecc_reference_period_ms``, or the smallest multiple
        of it longer than the allowed lateness plus the attribution window after a job's end (a
        period's reference is decided once every core's horizon passed the period before)."""
        period = self.ecc_reference_period_ms
        return period * ((self.allowed_lateness_ms + self.attribution_after_ms) // period + 1)

    def fleet_config(self) -> FleetConfig:
        """The fleet stage's share of this configuration."""
        return FleetConfig(
            lemon=self.lemon,
            baseline_period_ms=self.storm_baseline_period_ms,
            attribution_before_ms=self.attribution_before_ms,
            attribution_after_ms=self.attribution_after_ms,
            windows_s=self.windows_s,
            size_buckets=self.size_buckets,
            quiet_period_ms=dict(self.quiet_period_by_kind_ms).get(
                IncidentKind.LEMON_NODE, self.quiet_period_ms
            ),
            baseline_min_gpus=self.storm_baseline_min_gpus,
            ecc_reference_period_ms=self.ecc_period_ms,
            ecc_reference_window_ms=self.ecc_reference_window_ms,
            ecc_reference_min_gpus=self.ecc_reference_min_gpus,
        )


@dataclass(slots=True)
class Emitted:
    """Everything the core decided since the last :meth:`DetectionCore.drain`."""

    incidents: list[Incident] = field(default_factory=list)
    attributions: list[JobAttribution] = field(default_factory=list)
    mttf: list[MttfPartial] = field(default_factory=list)
    ecc_rows: list[EccRow] = field(default_factory=list)
    #: For a fleet stage elsewhere (a core made with ``local_fleet=False``): its facts, the
    #: failed runs it decided, and its horizon (no more facts before it).
    facts: list[FleetFact] = field(default_factory=list)
    job_parts: list[JobPart] = field(default_factory=list)
    fleet_horizon_ms: int | None = None


class FleetBaselineMissing(RuntimeError):
    """A core without a local fleet stage was given a record of a period whose storm baseline (or
    ECC reference) it has not learnt (:meth:`DetectionCore.learn_baselines`); the caller holds
    such records."""


_NO_DEADLINE = 2**63


@dataclass(slots=True)
class _JobStorm:
    """The application-class burst of one job on one GPU (job-aware storms)."""

    run: tuple[str, int]  # (job id, start): a new run on the GPU starts a new burst
    model: Threshold
    flagged: bool = False


@dataclass(slots=True)
class _RecentXids:
    """The XIDs one GPU logged in the last ``CONTEXT_WINDOW_MS`` (time, code), in the order they
    came, with how many of each code and how many neighbours are out of time order, kept as they
    come: a storm logs hundreds a minute, and each of its lines asks which codes came before it."""

    seen: deque[tuple[int, int]] = field(default_factory=deque)
    codes: dict[int, int] = field(default_factory=dict)
    descents: int = 0

    @classmethod
    def of(cls, seen: deque[tuple[int, int]]) -> _RecentXids:
        """The counts of a window kept as a bare deque (a checkpoint from before the counts)."""
        recent = cls(seen)
        for _, code in seen:
            recent.codes[code] = recent.codes.get(code, 0) + 1
        recent.descents = sum(1 for (before, _), (after, _) in pairwise(seen) if after < before)
        return recent

    def take(self, ts_ms: int, code: int) -> tuple[int, ...]:
        """The codes logged from ``CONTEXT_WINDOW_MS`` before ``ts_ms`` to ``ts_ms``, each once;
        then forget older ones and remember this one."""
        seen, codes = self.seen, self.codes
        since = ts_ms - CONTEXT_WINDOW_MS
        while seen and seen[0][0] < since:
            left, old = seen.popleft()
            codes[old] -= 1
            if not codes[old]:
                del codes[old]
            if seen and seen[0][0] < left:
                self.descents -= 1
        if not self.descents and (not seen or seen[-1][0] <= ts_ms):
            before = tuple(codes)  # in time order: every one is within the window
        else:
            before = tuple(dict.fromkeys(c for ts, c in seen if since <= ts <= ts_ms))
        if seen and ts_ms < seen[-1][0]:
            self.descents += 1
        seen.append((ts_ms, code))
        codes[code] = codes.get(code, 0) + 1
        return before


def _complete_config(config: CoreConfig) -> CoreConfig:
    """``config``, with the fields a configuration pickled before they existed lacks at their
    defaults (a frozen dataclass with slots unpickles its values in field order)."""
    names = [item.name for item in fields(CoreConfig)]
    present = {name: getattr(config, name) for name in names if hasattr(config, name)}
    return config if len(present) == len(names) else CoreConfig(**present)


class DetectionCore:
    """XID classification, ECC rules, job attribution, incident lifecycle and MTTF partial rows.

    The facade both runtimes call. XIDs are classified and scored here; each other concern has its
    tracker: ECC samples :class:`~detectors.ecc.EccTracker`, job runs and their attribution
    :class:`~detectors.jobs.JobTracker`, MTTF exposure :class:`~detectors.exposure.ExposureTracker`,
    incidents :class:`~detectors.incidents.IncidentTracker`, lemon nodes
    :class:`~detectors.lemon.LemonTracker`. The core feeds them, routes what one decides to the
    others and to the outputs, and runs their time-driven work in event-time order.

    Examples
    --------
    >>> core = DetectionCore(CoreConfig())
    >>> core.process(XidEvent(ts_ms=0, cluster="c", node="n1", xid=79, pci_bus_id="0000:07:00"))
    True
    >>> [(i.kind.value, i.severity.value, i.status.value) for i in core.drain().incidents]
    [('gpu_bus', 'critical', 'open')]
    >>> core.process(XidEvent(ts_ms=-10 * 60_000, cluster="c", node="n1", xid=13))  # older than lateness
    False
    """

    def __init__(
        self,
        config: CoreConfig,
        *,
        owns: Callable[[str], bool] | None = None,
        local_fleet: bool = True,
        xid_overrides: Iterable[XidOverride] = (),
    ) -> None:
        self.config = config
        #: Catalog entries changed or added (``FAULTSTREAM_XID_CATALOG_FILE``, ``faultstream diff
        #: --catalog``); kept out of ``config`` so that a worker checkpoint's pickled config keeps
        #: its layout.
        self._xid_overrides = {override.code: override for override in xid_overrides}
        #: Which nodes this core judges (None: all). A core of a Kafka partition owns the nodes
        #: keyed to it; it hands the fleet stage facts about those only, whatever else it sees.
        self.owns = owns
        #: The fleet stage, in process (embedded replay), or None: the caller carries the facts
        #: in :attr:`Emitted.facts` to a stage elsewhere and brings back its baselines.
        self.fleet = FleetCore(config.fleet_config()) if local_fleet else None
        self._baselines: dict[int, float] = {}
        self._ecc_references: dict[int, float] = {}
        self._ecc_period_ms = config.ecc_period_ms  # asked for each ECC sample a worker holds
        # Nodes routine telemetry showed (an ECC sample, a job run), and nodes only an XID named.
        self._seen: set[str] = set()
        self._named: set[str] = set()
        self._xid_day: dict[str, int] = {}
        self.max_event_ms: int | None = None
        self._emitted = Emitted()
        self._incidents = IncidentTracker(config.quiet_period_ms, dict(config.quiet_period_by_kind_ms))
        self._jobs = JobTracker(
            attribution_before_ms=config.attribution_before_ms,
            attribution_after_ms=config.attribution_after_ms,
            allowed_lateness_ms=config.allowed_lateness_ms,
            gpus_per_node=config.gpus_per_node,
            size_buckets=config.size_buckets,
        )
        self._exposure = ExposureTracker(config.windows_s, config.size_buckets)
        self._ecc = EccTracker(
            keep_interval_ms=config.ecc_keep_interval_ms,
            trend_threshold=config.ecc_trend_threshold,
            trend_window=config.ecc_trend_window,
            trend_floor_per_day=config.ecc_trend_floor_per_day,
        )
        self._next_deadline = _NO_DEADLINE
        # Online models, River protocol: one clone of each template per key, created on first use.
        self._storm_template = storm_filter(
            window_hours=config.storm_window_hours, min_events=config.storm_min_events
        )
        self._spread_template = spread_filter(
            window_hours=config.spread_window_hours,
            min_events=config.spread_min_events,
            min_gpus=config.spread_min_gpus,
            min_bursts=config.spread_min_bursts,
        )
        self._storms: dict[tuple[str, str, str], Threshold] = {}
        # Job-aware storms: per GPU, the application-class burst of the one job running there, and
        # the owners whose job storms the GPU flagged within the owner window.
        self._job_storms: dict[tuple[str, str, str], _JobStorm] = {}
        self._storm_owners: dict[tuple[str, str, str], deque[tuple[int, str]]] = {}
        self._spreads: dict[tuple[str, str, str], Threshold] = {}
        self._storming: set[tuple[str, str, str]] = set()  # GPUs whose current burst was flagged
        self._clock_started = False
        # XIDs each GPU logged in the last CONTEXT_WINDOW_MS: what 48 with 63/64 and 45 solo-or-not
        # are classified against (look-back only, so a line's verdict never waits for later lines).
        self._recent_xids: dict[tuple[str, str, str], _RecentXids] = {}
        # The UTC day of the last unknown-XID incident per (cluster, node): at most one a day.
        self._unknown_day: dict[tuple[str, str], int] = {}
        # The kernel line and the DCGM gauge change of one XID: the second one taken is a repeat.
        self._reports = XidReports()

    @property
    def xid_overrides(self) -> tuple[XidOverride, ...]:
        """The catalog entries changed or added, by code."""
        return tuple(self._xid_overrides[code] for code in sorted(self._xid_overrides))

    @xid_overrides.setter
    def xid_overrides(self, overrides: Iterable[XidOverride]) -> None:
        self._xid_overrides = {override.code: override for override in overrides}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a worker checkpoint from before the per-GPU XID context, the unknown-XID
        day and job-aware storms existed: they start empty (at worst one more unknown-XID incident,
        a 63 right after the restart read without the 48 before it, a job's storm counted from the
        restart on), and configuration fields added since take their defaults, instead of the
        checkpoint being refused."""
        state["_recent_xids"] = {
            key: _RecentXids.of(recent) if isinstance(recent, deque) else recent
            for key, recent in state.get("_recent_xids", {}).items()
        }
        state.setdefault("_unknown_day", {})
        state.setdefault("_xid_overrides", {})
        state.setdefault("_job_storms", {})
        state.setdefault("_storm_owners", {})
        state.setdefault("_ecc_references", {})
        state.setdefault("_reports", XidReports())
        state.setdefault("_named", set())
        state["config"] = _complete_config(state["config"])
        state["_ecc_period_ms"] = state["config"].ecc_period_ms
        self.__dict__.update(state)

    # -- public API --------------------------------------------------------------------------

    @property
    def watermark_ms(self) -> int | None:
        """Event time before which every record is considered seen; None before the first one."""
        if self.max_event_ms is None:
            return None
        return self.max_event_ms - self.config.allowed_lateness_ms

    def process(self, record: XidEvent | EccSample | JobEvent) -> bool:
        """Process one record; return False (and do nothing) when it is later than allowed.

        An XID that repeats one already taken (the same XID from the kernel log and from DCGM's
        gauge of the last XID: :mod:`detectors.xid_reports`) is accepted and passed over; ask
        :meth:`repeats` before processing it to know.

        Raises
        ------
        FleetBaselineMissing
            With a fleet stage elsewhere, for an ECC sample that needs the fleet's ECC reference
            of a period not learnt yet (:meth:`ready_for` says so beforehand). What changed before
            the raise (the watermark, the node's first sighting) is what processing the sample
            again does the same way, so it can be held and processed again once the reference is
            learnt.
        """
        if isinstance(record, EccSample):
            return self.process_ecc(record)
        ts = record.ts_ms
        watermark = self.watermark_ms
        if watermark is not None and ts < watermark:
            return False
        if self.max_event_ms is None or ts > self.max_event_ms:
            self._advance_to(ts)
        if isinstance(record, XidEvent):
            self._process_xid(record)
        else:
            self._process_job(record)
        return True

    def repeats(self, record: XidEvent | EccSample | JobEvent) -> bool:
        """Whether ``record`` is an XID another report of which was already taken: :meth:`process`
        passes it over, and it is not a raw event of its own (the runtimes do not store it)."""
        return isinstance(record, XidEvent) and self._reports.repeats(record)

    def process_ecc(self, sample: EccSample) -> bool:
        """:meth:`process` for an ECC sample, for a caller that knows it has one: nine records in
        ten a cluster sends are samples, and a runtime calling this directly saves the dispatch.
        Raises what :meth:`process` raises. Below, the second sample came past the watermark.

        >>> from schemas.records import EccSample
        >>> core = DetectionCore(CoreConfig(allowed_lateness_ms=1_000))
        >>> core.process_ecc(EccSample(ts_ms=5_000, cluster="c", node="n", gpu=0, counters={}))
        True
        >>> core.process_ecc(EccSample(ts_ms=3_000, cluster="c", node="n", gpu=0, counters={}))
        False
        """
        ts = sample.ts_ms
        newest = self.max_event_ms
        if newest is None or ts > newest:
            self._advance_to(ts)
        elif ts < newest - self.config.allowed_lateness_ms:
            return False
        if sample.node not in self._seen:  # nearly always seen: the call only when not
            self._see(sample.cluster, sample.node, ts)
        self._process_ecc(sample)
        return True

    def process_ecc_run(self, samples: Sequence[EccSample]) -> tuple[list[int], int | None]:
        """:meth:`process_ecc` for each of ``samples`` in turn: a worker's merge releases an ECC
        partition's samples in runs of hundreds, and one call a run saves two calls a sample
        (~0.15 µs of ~1.5).

        Returns the indices of the samples that came past the watermark (not processed; the
        caller dead-letters them), and the index of the first sample that needs a fleet reference
        this core has not learnt (:class:`FleetBaselineMissing`), or None: that sample and the
        ones after it were not processed, the core changed nothing for them beyond its watermark
        (the caller holds them and gives them again).

        >>> from schemas.records import EccSample
        >>> core = DetectionCore(CoreConfig(allowed_lateness_ms=1_000))
        >>> core.process_ecc_run([EccSample(ts_ms=t, cluster="c", node="n", gpu=0, counters={})
        ...                       for t in (5_000, 3_000, 6_000)])
        ([1], None)
        """
        late: list[int] = []
        lateness = self.config.allowed_lateness_ms
        seen = self._seen
        observe, jobs_at, fleet_rate = self._ecc.observe, self._jobs.jobs_at, self._fleet_ecc_rate
        for index, sample in enumerate(samples):
            ts = sample.ts_ms
            newest = self.max_event_ms
            if newest is None or ts > newest:
                self._advance_to(ts)
            elif ts < newest - lateness:
                late.append(index)
                continue
            if sample.node not in seen:
                self._see(sample.cluster, sample.node, ts)
            try:
                observed = observe(sample, jobs_at, fleet_rate)
            except FleetBaselineMissing:
                return late, index
            if observed is not NOTHING_OBSERVED:
                self._apply_observation(sample, observed)
        return late, None

    def drain(self) -> Emitted:
        """Return and forget what was decided since the previous call (with a local fleet stage,
        what it decided too)."""
        emitted, self._emitted = self._emitted, Emitted()
        if self.fleet is not None:
            decided = self.fleet.drain()
            emitted.incidents.extend(decided.incidents)
            emitted.attributions.extend(decided.attributions)
            emitted.mttf.extend(decided.mttf)
        elif self.max_event_ms is not None:
            emitted.fleet_horizon_ms = self.fleet_horizon_ms
        return emitted

    @property
    def has_pending_decisions(self) -> bool:
        """Whether failed runs wait for their attribution window to pass: with no more records, the
        core would still hand the fleet stage their parts once its watermark moves."""
        return self._jobs.next_decision_ms is not None

    @property
    def fleet_horizon_ms(self) -> int | None:
        """Event time before which this core hands the fleet stage no more facts: the watermark,
        less the attribution window after a job's end (a run's failure is decided that late)."""
        watermark = self.watermark_ms
        return None if watermark is None else watermark - self.config.attribution_after_ms

    def advance(self, ts_ms: int) -> None:
        """Let the watermark move as a record at ``ts_ms`` would, without the record: decide what
        is due, so that the fleet horizon moves too. A runtime feeding a fleet stage elsewhere
        calls it before a record whose storm baseline is not known yet (:meth:`ready_for`)."""
        if self.max_event_ms is None or ts_ms > self.max_event_ms:
            self._advance_to(ts_ms)

    def ready_for(self, record: XidEvent | EccSample | JobEvent) -> bool:
        """Whether ``record`` can be processed now. With a fleet stage elsewhere, an XID that could
        make a storm waits for the storm baseline of its period, an ECC sample of a GPU without a
        trusted past for the fleet's ECC reference of its period; everything else goes at once (a
        late record is refused anyway). For an ECC sample, asking costs about what processing it
        costs: a caller may instead process it and hold it on :class:`FleetBaselineMissing`
        (:meth:`process`), as the worker does."""
        if self.fleet is not None:
            return True
        # Asked of every record a worker releases (nine in ten are ECC samples), so spelt out:
        # the period starts, the watermark and the ECC tracker's cheap answers inline.
        ts = record.ts_ms
        newest = self.max_event_ms
        late = newest is not None and ts < newest - self.config.allowed_lateness_ms
        if type(record) is EccSample:
            if late or ts - ts % self._ecc_period_ms in self._ecc_references:
                return True
            return not self._ecc.needs_fleet(record)
        if late or ts - ts % self.config.storm_baseline_period_ms in self._baselines:
            return True
        return not self._may_storm(record)

    def _may_storm(self, record: XidEvent | EccSample | JobEvent) -> bool:
        """Whether the storm score of ``record`` can depend on the fleet's baseline: only an XID
        that brings its GPU's window count to the storm floor (below it, no baseline makes a
        storm: the score is at most ``count / min_events``). An application-class XID of the one
        job on its node never does: it scores that job's storm, which has no fleet baseline."""
        if not isinstance(record, XidEvent) or self._classify(record.xid).category is XidCategory.NVLINK:
            return False
        if record.device == "nvswitch" or self._storm_run(record) is not None:
            return False  # a switch's SXid, or a job's storm: no fleet baseline involved
        model = self._storms.get((record.cluster, record.node, record.gpu_key))
        if model is None:
            return self.config.storm_min_events <= 1
        scorer = cast(XidStormScorer, model.anomaly_detector)
        return scorer.window_count(record.ts_ms / HOUR_MS) + 1 >= scorer.min_events

    def learn_baselines(
        self, baselines: dict[int, float], ecc_references: dict[int, float] | None = None
    ) -> None:
        """Storm baselines from a fleet stage elsewhere, period start (ms) -> usual burst, and its
        ECC references, period start (ms) -> usual correctable errors per GPU-day."""
        self._baselines.update(baselines)
        if ecc_references:
            self._ecc_references.update(ecc_references)
            # Periods before the watermark are never asked for again (a record before it is late):
            # the checkpoint keeps the rest only.
            watermark = self.watermark_ms
            if watermark is not None and len(self._ecc_references) > 24 * 8:
                keep = self.ecc_reference_needed_ms(watermark)
                self._ecc_references = {k: v for k, v in self._ecc_references.items() if k >= keep}

    def ecc_reference_needed_ms(self, ts_ms: int) -> int:
        """The period start whose ECC reference an ECC sample at ``ts_ms`` may need."""
        return ts_ms - ts_ms % self._ecc_period_ms

    def baseline_needed_ms(self, ts_ms: int) -> int:
        """The period start whose storm baseline a record at ``ts_ms`` may need."""
        return ts_ms - ts_ms % self.config.storm_baseline_period_ms

    def finish(self, end_ms: int | None = None) -> Emitted:
        """End of input: decide every pending attribution and emit the exposure of running jobs.

        Running jobs contribute their exposure up to the end of the input as partial rows with
        a version below that of any later, longer row of the same run, so continuing the replay
        later replaces them.

        Parameters
        ----------
        end_ms
            The end of the whole input, when this core saw only part of it (one partition of
            several): its running jobs accrue up to there, as they would in one core, not up to
            its own last event (default: its last event).
        """
        if self.max_event_ms is not None:
            end = self.max_event_ms if end_ms is None else max(self.max_event_ms, end_ms)
            self._advance_to(end + self.config.allowed_lateness_ms + 1, closing=False)
            for decided in self._jobs.decide_all():
                self._decided(decided)
            for run in sorted(self._jobs.running, key=lambda r: (r.cluster, r.job_id, r.start_ms)):
                self._emitted.mttf.extend(self._exposure.run_so_far(run, end))
        return self.drain()

    # -- time ----------------------------------------------------------------------------------

    def _advance_to(self, max_event_ms: int, closing: bool = True) -> None:
        if not self._clock_started:  # the first event: align the clocks on it
            self._clock_started = True
            self._exposure.start_clock(max_event_ms)
            self._refresh_deadline()
        self.max_event_ms = max_event_ms
        watermark = max_event_ms - self.config.allowed_lateness_ms
        if watermark > self._next_deadline:
            self._run_due(watermark, closing)
            self._jobs.forget_evidence(watermark)
            self._refresh_deadline()
        fleet = self.fleet
        if closing and fleet is not None:
            # The stage decides its instants (lemon verdicts, storm baselines) once this core's
            # horizon passes them, after every fact before them.
            horizon = watermark - self.config.attribution_after_ms
            due = fleet.next_instant_ms
            if due is None or horizon >= due:
                fleet.advance(0, horizon)

    def _run_due(self, instant: int, closing: bool) -> None:
        for decided in self._jobs.decide_due(instant):
            self._decided(decided)
        self._emitted.incidents.extend(self._incidents.resolve_idle(instant))
        if closing:
            self._emitted.mttf.extend(self._exposure.close_windows(instant, self._jobs.running))
            self._jobs.forget_ended(instant - self._exposure.longest_window_ms)

    def _refresh_deadline(self) -> None:
        candidates = [
            deadline
            for deadline in (
                self._jobs.next_decision_ms,
                self._incidents.next_deadline_ms,
                self._exposure.next_close_ms,
            )
            if deadline is not None
        ]
        self._next_deadline = min(candidates) if candidates else _NO_DEADLINE

    # -- the fleet stage -----------------------------------------------------------------------

    def _mine(self, node: str) -> bool:
        return self.owns is None or self.owns(node)

    def _fact(self, fact: FleetFact) -> None:
        if self.fleet is not None:
            self.fleet.add(0, (fact,))
        else:
            self._emitted.facts.append(fact)

    def _signal(self, node: str, name: str, ts_ms: int, key: str = "") -> None:
        if self._mine(node):
            self._fact(FleetFact(ts_ms, SIGNAL, node, name, key))

    def _see(self, cluster: str, node: str, ts_ms: int) -> None:
        """Routine telemetry showed ``node`` at ``ts_ms``: part of the fleet since then at least."""
        if node not in self._seen and self._mine(node):
            self._seen.add(node)
            self._fact(FleetFact(ts_ms, SEEN, node, PRESENT, cluster=cluster))

    def _name(self, cluster: str, node: str, ts_ms: int) -> None:
        """An XID names ``node``: part of the fleet, since when the record does not say."""
        if node not in self._seen and node not in self._named and self._mine(node):
            self._named.add(node)
            self._fact(FleetFact(ts_ms, SEEN, node, cluster=cluster))

    def _fleet_ecc_rate(self, ts_ms: int) -> float:
        period_start = self.ecc_reference_needed_ms(ts_ms)
        if self.fleet is not None:
            usual = self.fleet.ecc_reference(period_start)
        else:
            usual = self._ecc_references.get(period_start)
        if usual is None:
            raise FleetBaselineMissing(
                f"no fleet ECC reference for the period from {period_start} (a sample at {ts_ms})"
            )
        return usual

    def _storm_baseline(self, ts_ms: int) -> float:
        period_start = self.baseline_needed_ms(ts_ms)
        if self.fleet is not None:
            usual = self.fleet.baseline(period_start)
        else:
            usual = self._baselines.get(period_start)
        if usual is None:
            raise FleetBaselineMissing(
                f"no fleet storm baseline for the period from {period_start} (a record at {ts_ms})"
            )
        return usual

    # -- XID -----------------------------------------------------------------------------------

    def _process_xid(self, event: XidEvent) -> None:
        if self._reports.take(event):
            return  # the other report of an XID already taken
        self._name(event.cluster, event.node, event.ts_ms)
        if event.device == "nvswitch":
            self._process_sxid(event)
            return
        gpu = event.gpu_key
        info = self._classify(event.xid, event.message, self._recent(event, gpu))
        runs = self._jobs.runs_at(event.node, event.cluster)
        context = tuple(run.context for run in runs)
        day = event.ts_ms - event.ts_ms % DAY_MS
        owner = runs[0] if len(runs) == 1 and runs[0].user else None
        if info.category is XidCategory.APPLICATION and not info.hardware and owner is not None:
            # An application-class XID of one known user's job: whether it counts against the node
            # (xid_days) depends on whether it follows the user, which the fleet stage sees.
            self._app_xid(event, owner)
        elif self._xid_day.get(event.node, -(2**62)) < day:  # one fact a node and day: xid_days
            self._xid_day[event.node] = day
            self._signal(event.node, "xid_days", event.ts_ms)
        # NVLink errors come in bursts on several GPUs: the spread detector owns them, the storm
        # detector looks at everything else one GPU logs.
        # Job-aware: an application-class XID of the one job running on the node is that job's
        # (its storm is the job's crash loop, told to its owner), anything else the GPU's.
        if info.category is XidCategory.NVLINK:
            # Flapping is recurring *non-fatal* NVLink errors: a fatal one is a critical incident
            # at its first line, and the burst the links log going down at the repair's reboot
            # would make it look recurring.
            if info.severity is not Severity.CRITICAL:
                self._score_spread(event, gpu, IncidentKind.NVLINK_FLAPPING)
        elif (storm_run := self._storm_run(event)) is not None:
            self._score_job_storm(event, gpu, storm_run)
        else:
            self._score_storm(event, gpu)
        if info.category is XidCategory.UNKNOWN:
            self._observe_unknown(event, info.name, info.action)
            return
        if info.severity is Severity.INFO:
            return  # application-class or no action: stored with the raw events, never an incident
        kind = info.category.incident_kind
        versions = self._incidents.observe(
            Finding(
                cluster=event.cluster,
                kind=kind,
                node=event.node,
                gpu=gpu,
                severity=info.severity,
                detector="xid_classifier",
                score=1.0 if info.severity is Severity.CRITICAL else 0.5,
                action=info.action,
                title=info.name,
                evidence=EvidenceItem(
                    event.ts_ms,
                    xid=event.xid,
                    message=event.message,
                    jobs=self._jobs.jobs_at(event.node),
                    job_context=context,
                ),
            )
        )
        self._emitted.incidents.extend(versions)
        if (
            info.hardware
            and info.severity is Severity.CRITICAL
            and versions[-1].status is IncidentStatus.OPEN
        ):
            self._signal(event.node, "hw_incidents", event.ts_ms)
        if info.job_evidence:
            self._jobs.add_evidence(HardwareEvent(event.ts_ms, event.node, gpu, kind, event.xid))

    def _classify(self, code: int, message: str = "", recent: Collection[int] = ()) -> XidInfo:
        """The catalog's classification of an XID line, with this core's override of the code."""
        info = classify_xid(code, message, recent)
        override = self._xid_overrides.get(code)
        return info if override is None else override.apply(info)

    def _app_xid(self, event: XidEvent, run: JobRun) -> None:
        """An application-class XID of ``run``'s job: the run remembers it (a failed run with it and
        no hardware evidence failed for its own reasons), and the fleet stage hears of it with the
        job's owner: it counts for the node's ``xid_days`` unless the errors follow that user."""
        if self._mine(event.node):
            run.app_xids += 1
            self._fact(FleetFact(event.ts_ms, APP_XID, event.node, run.user, run.job_id, event.xid))

    def _recent(self, event: XidEvent, gpu: str) -> tuple[int, ...]:
        """The XIDs this GPU logged in the context window before ``event``; remembers ``event``."""
        key = (event.cluster, event.node, gpu)
        recent = self._recent_xids.get(key)
        if recent is None:
            recent = self._recent_xids[key] = _RecentXids()
        return recent.take(event.ts_ms, event.xid)

    def _observe_unknown(self, event: XidEvent, title: str, action: str) -> None:
        """A code outside the catalog: one info incident per node and UTC day, whatever the GPU."""
        day = event.ts_ms // DAY_MS
        key = (event.cluster, event.node)
        last = self._unknown_day.get(key)
        if last is not None and last >= day:
            return
        self._unknown_day[key] = day
        self._emitted.incidents.extend(
            self._incidents.observe(
                Finding(
                    cluster=event.cluster,
                    kind=IncidentKind.XID_UNKNOWN,
                    node=event.node,
                    severity=Severity.INFO,
                    detector="xid_classifier",
                    score=0.1,
                    action=action,
                    title=title,
                    evidence=EvidenceItem(event.ts_ms, xid=event.xid, message=event.message),
                )
            )
        )

    def _process_sxid(self, event: XidEvent) -> None:
        """An NVSwitch SXid: its own incident per node and switch, its own catalog."""
        info = classify_sxid(event.xid, event.message)
        if info.severity is Severity.INFO:
            return
        switch = event.pci_bus_id or "?"
        kind = info.incident_kind
        versions = self._incidents.observe(
            Finding(
                cluster=event.cluster,
                kind=kind,
                node=event.node,
                gpu=switch,
                severity=info.severity,
                detector="sxid_classifier",
                score=1.0 if info.severity is Severity.CRITICAL else 0.5,
                action=info.action,
                title=f"NVSwitch SXid {event.xid}: {info.name}",
                evidence=EvidenceItem(
                    event.ts_ms,
                    xid=event.xid,
                    message=event.message,
                    jobs=self._jobs.jobs_at(event.node),
                    job_context=self._jobs.context_at(event.node, event.cluster),
                ),
            )
        )
        self._emitted.incidents.extend(versions)
        if info.severity is Severity.CRITICAL:
            # A fatal switch error stops the NVLink traffic of the GPUs behind it: evidence for the
            # node's failed jobs, as a critical GPU XID is.
            if versions[-1].status is IncidentStatus.OPEN:
                self._signal(event.node, "hw_incidents", event.ts_ms)
            # No xid: evidence_xids lists GPU XIDs only; the kind says it was the switch.
            self._jobs.add_evidence(HardwareEvent(event.ts_ms, event.node, switch, kind))

    def _score_storm(self, event: XidEvent, gpu: str) -> None:
        key = (event.cluster, event.node, gpu)
        model = self._storms.get(key)
        if model is None:
            model = self._storms[key] = self._storm_template.clone()
        # Below the storm floor no baseline makes a storm: a core without its period's baseline
        # yet (the fleet stage is elsewhere) scores such an XID without it.
        usual = self._storm_baseline(event.ts_ms) if self._may_storm(event) else 0.0
        x: dict[Any, Any] = {"t": event.ts_ms / HOUR_MS, "fleet_usual": usual}
        score = model.score_one(x)
        storming = model.is_anomaly(score)
        if storming:
            info = self._classify(event.xid)
            self._emitted.incidents.extend(
                self._incidents.observe(
                    Finding(
                        cluster=event.cluster,
                        kind=IncidentKind.XID_STORM,
                        node=event.node,
                        gpu=gpu,
                        severity=Severity.WARN,
                        detector="xid_burst",
                        score=score,
                        action="check the job on this GPU (a crash loop?) and the GPU; drain it if the storm "
                        "persists",
                        title=f"XID storm from one GPU, far above its own and the fleet's rate ({info.name})",
                        evidence=EvidenceItem(
                            event.ts_ms,
                            xid=event.xid,
                            message=event.message,
                            jobs=self._jobs.jobs_at(event.node),
                            job_context=self._jobs.context_at(event.node, event.cluster),
                        ),
                    )
                )
            )
        model.learn_one(x)
        finished_peak = cast(XidStormScorer, model.anomaly_detector).take_finished_peak()
        if finished_peak is not None:
            if key in self._storming:
                self._storming.discard(key)  # a storm's peak is not what the fleet usually sees
            elif self._mine(event.node):
                self._fact(FleetFact(event.ts_ms, PEAK, event.node, key=gpu, value=finished_peak))
        if storming:
            self._storming.add(key)

    def _storm_run(self, event: XidEvent) -> JobRun | None:
        """The job an XID's storm would be: the only run on its node, for an application-class XID
        (by its code: the same answer before the record is processed, :meth:`ready_for`, as
        while); None for a hardware-class XID, or with no run or several on the node (the
        scheduler's records name no GPU: with several jobs the XID has no single owner)."""
        info = self._classify(event.xid)
        if info.category is not XidCategory.APPLICATION or info.hardware:
            return None
        runs = self._jobs.runs_at(event.node, event.cluster)
        return runs[0] if len(runs) == 1 else None

    def _score_job_storm(self, event: XidEvent, gpu: str, run: JobRun) -> None:
        """An application-class XID of ``run``, the one job on its node: scored against that job's
        own burst on this GPU (floor and own rate, the GPU's storm template; no fleet baseline, and
        its bursts never raise the fleet's). A storm is the job's crash loop: a ``job_xid_storm``
        addressed to the owner, no node verdict; unless the same GPU stormed under another user's
        job within the owner window, which makes the storms the GPU's (``xid_storm``)."""
        key = (event.cluster, event.node, gpu)
        run_key = (run.job_id, run.start_ms)
        state = self._job_storms.get(key)
        if state is None or state.run != run_key:
            state = self._job_storms[key] = _JobStorm(run_key, self._storm_template.clone())
        x: dict[Any, Any] = {"t": event.ts_ms / HOUR_MS}
        score = state.model.score_one(x)
        state.model.learn_one(x)  # protected: the storm's own XIDs do not raise the job's rate
        if not state.model.is_anomaly(score):
            return
        owners = self._storm_owners.setdefault(key, deque())
        since = event.ts_ms - round(self.config.storm_owner_window_hours * HOUR_MS)
        while owners and owners[0][0] < since:
            owners.popleft()
        if not state.flagged:
            state.flagged = True
            if run.user:
                owners.append((event.ts_ms, run.user))
        others = sorted({user for _, user in owners if user != run.user}) if run.user else []
        info = self._classify(event.xid)
        evidence = EvidenceItem(
            event.ts_ms,
            xid=event.xid,
            message=event.message,
            jobs=(run.job_id,),
            job_context=(run.context,),
        )
        if others:
            finding = Finding(
                cluster=event.cluster,
                kind=IncidentKind.XID_STORM,
                node=event.node,
                gpu=gpu,
                severity=Severity.WARN,
                detector="xid_burst",
                score=score,
                action="the storms follow this GPU across users' jobs: drain it and run diagnostics",
                title=f"XID storms from one GPU under the jobs of {len(others) + 1} users: the GPU's, "
                f"not a job's ({info.name})",
                evidence=evidence,
            )
        else:
            whom = f"user {run.user}" if run.user else f"the owner of job {run.job_id}"
            finding = Finding(
                cluster=event.cluster,
                kind=IncidentKind.JOB_XID_STORM,
                node=event.node,
                gpu=gpu,
                severity=Severity.WARN,
                detector="xid_burst",
                score=score,
                action=f"tell {whom}: job {run.job_id} logs application XIDs far above any usual rate (a "
                "crash loop?); no node action (draining would fix nothing)",
                title=f"XID storm from one job: application XIDs of the job itself ({info.name})",
                evidence=evidence,
                owner=run.user,
            )
        self._emitted.incidents.extend(self._incidents.observe(finding))

    def _score_spread(self, event: XidEvent, gpu: str, kind: IncidentKind) -> None:
        key = (event.cluster, event.node, kind)
        model = self._spreads.get(key)
        if model is None:
            model = self._spreads[key] = self._spread_template.clone()
        x: dict[Any, Any] = {"t": event.ts_ms / HOUR_MS, "gpu": gpu}
        score = model.score_one(x)
        model.learn_one(x)
        if model.is_anomaly(score):
            gpus = cast(XidSpreadScorer, model.anomaly_detector).gpus
            self._emitted.incidents.extend(
                self._incidents.observe(
                    Finding(
                        cluster=event.cluster,
                        kind=kind,
                        node=event.node,
                        severity=Severity.WARN,
                        detector="xid_burst",
                        score=score,
                        action="drain the node and check its NVLink/NVSwitch fabric (nvidia-smi nvlink -e, "
                        "diagnostics)",
                        title=f"NVLink errors recurring across GPUs {', '.join(gpus)}",
                        evidence=EvidenceItem(
                            event.ts_ms,
                            xid=event.xid,
                            message=event.message,
                            jobs=self._jobs.jobs_at(event.node),
                            job_context=self._jobs.context_at(event.node, event.cluster),
                        ),
                    )
                )
            )

    # -- ECC -----------------------------------------------------------------------------------

    def _process_ecc(self, sample: EccSample) -> None:
        self._apply_observation(sample, self._ecc.observe(sample, self._jobs.jobs_at, self._fleet_ecc_rate))

    def _apply_observation(self, sample: EccSample, observed: EccObservation) -> None:
        """What an ECC sample's observation brought: rule and trend incidents, its stored row,
        the fleet stage's correctable-error fact."""
        for finding in observed.rules:
            versions = self._incidents.observe(finding)
            self._emitted.incidents.extend(versions)
            if versions[-1].status is IncidentStatus.OPEN:
                self._signal(sample.node, "hw_incidents", sample.ts_ms)
            self._jobs.add_evidence(HardwareEvent(sample.ts_ms, sample.node, sample.gpu_key, finding.kind))
        if observed.trend is not None:
            self._emitted.incidents.extend(self._incidents.observe(observed.trend))
        if observed.row is not None:
            self._emitted.ecc_rows.append(observed.row)
            corrected = corrected_errors(observed.row.deltas)
            if corrected > 0 and self._mine(sample.node):
                self._fact(
                    FleetFact(
                        sample.ts_ms,
                        ECC_SBE,
                        sample.node,
                        name=ECC_FLAGGED if observed.trend is not None else "",
                        key=sample.gpu_key,
                        value=corrected,
                        cluster=sample.cluster,
                    )
                )

    # -- jobs ----------------------------------------------------------------------------------

    def _process_job(self, event: JobEvent) -> None:
        if event.state is JobState.RUNNING:
            run = self._jobs.start(event)
            if run is not None:
                for index, node in enumerate(run.nodes):
                    self._see(event.cluster, node, event.ts_ms)
                    if self._mine(node):
                        # The node's load (lemon's job_runs) unless its owner's jobs crash wherever
                        # they run; the first node's fact also counts the run for its owner.
                        self._fact(FleetFact(run.start_ms, RUN, node, run.user, run.job_id, int(index == 0)))
            return
        if not event.state.is_terminal:
            return
        ended = self._jobs.end(event)
        if ended is None:
            return
        run, end = ended.run, ended.end_ms
        if ended.decide_at_ms is None:
            self._emitted.mttf.extend(self._exposure.run_ended(run, end, event.state))
            return
        # A possible hardware failure: the verdict waits for the attribution window (the tracker
        # holds the run until then); the fleet stage counts it for the lemon statistics once it
        # knows whether hardware or the job itself failed it.
        if event.state is JobState.NODE_FAIL and len(run.nodes) == 1:
            self._signal(run.nodes[0], "node_fails", end)
        self._next_deadline = min(self._next_deadline, ended.decide_at_ms)

    def _decided(self, decided: Decided) -> None:
        """A failed run's attribution window passed: its evidence on this core's nodes counts for
        the lemon statistics, and goes to the fleet stage, which attributes the run once."""
        run = decided.run
        evidence = tuple(e for e in decided.evidence if self._mine(e.node))
        for node in sorted({e.node for e in evidence}):
            self._signal(node, "hw_failures", decided.end_ms)
        part = JobPart(
            cluster=run.cluster,
            job_id=run.job_id,
            start_ms=run.start_ms,
            end_ms=decided.end_ms,
            state=decided.state,
            nodes=run.nodes,
            gpus=run.gpus,
            covered=tuple(node for node in run.nodes if self._mine(node)),
            evidence=evidence,
            user=run.user,
            app_xids=run.app_xids,
            name=run.name,
            partition=run.partition,
        )
        if self.fleet is not None:
            self.fleet.add_job(part)
        else:
            self._emitted.job_parts.append(part)
