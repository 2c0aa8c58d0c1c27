"""The fleet stage: what needs the whole fleet, decided once, at event times that do not depend on
how the nodes are partitioned (SPEC 5, 7).

A detection core (:class:`detectors.core.DetectionCore`) judges the nodes it owns. Three things
need more than one node's records, and a core that owns a quarter of the fleet must not judge
them on its own quarter:

* **lemon verdicts** compare each node's signals with the fleet's (:mod:`detectors.lemon`);
* **the storm baseline**: the fleet's usual XID burst, which a storm must exceed
  (:mod:`detectors.xid_burst`);
* **one verdict per job**: a failed job whose nodes sit with several cores is attributed once,
  with the hardware evidence of all its nodes (:mod:`detectors.jobs`);
* **the fleet's usual correctable-error rate**: what a GPU without a trusted past of its own is
  compared with (:mod:`detectors.ecc_trend`).

Cores hand the stage :class:`FleetFact` records (a node seen, a lemon signal, a finished burst's
peak), :class:`JobPart` records (a failed run with the evidence of the core's nodes) and their
*horizon*: an event time before which they will hand over no more facts. The stage applies facts
in one canonical order (by event time, then content), never in arrival order, and decides an
instant only once every core's horizon has passed it:

* the lemon verdict at instant ``T`` (every ``evaluate_every_ms``) counts the signals with event
  time before ``T``;
* the storm baseline of period ``k`` (``baseline_period_ms`` long) is the 99th percentile of the
  peaks that finished before period ``k - 1`` began — the day before yesterday's, with the default
  period — exact, from the multiset of peaks, but no larger than what ``baseline_min_gpus`` (10)
  distinct GPUs reached;
* the ECC reference of period ``k`` (``ecc_reference_period_ms``, an hour) is the highest
  correctable-error rate per day a healthy GPU of the fleet is expected to reach, from the rates
  over the ``ecc_reference_window_ms`` (a week, or the history there is) before period ``k - 1``
  began of the GPUs that corrected errors and were not flagged as degrading in that window
  (:func:`healthy_ceiling`); :data:`NO_ECC_REFERENCE` while fewer than ``ecc_reference_min_gpus``
  (10) GPUs corrected errors, or the fleet's errors cover less than 12 hours;
* a job is attributed when the parts of all its nodes are in.

So one core owning every node (the embedded replay) and eight cores in four workers decide the
same, by construction. The stage is pure, like the cores: the embedded core drives one in
process; the Kafka worker runs one behind a single-partition fleet topic.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from detectors.attribution import HardwareEvent
from detectors.exposure import ExposureTracker
from detectors.incidents import EvidenceItem, Finding, IncidentTracker, incident_id
from detectors.jobs import JobContext, JobRun, load_older_layouts
from detectors.lemon import LemonConfig, LemonTracker
from detectors.mttf import SizeBuckets
from schemas.outputs import (
    Incident,
    IncidentKind,
    IncidentStatus,
    JobAttribution,
    MttfPartial,
    Severity,
)
from schemas.records import JobState
from schemas.timeutil import DAY_MS, HOUR_MS

__all__ = [
    "FAILED_APPLICATION",
    "FAILED_HARDWARE",
    "FAILED_UNKNOWN",
    "FROM_THE_START",
    "NO_ECC_REFERENCE",
    "FleetConfig",
    "FleetCore",
    "FleetFact",
    "FleetOutput",
    "JobPart",
    "exact_quantile",
    "healthy_ceiling",
]

#: Kinds of :class:`FleetFact`.
SEEN, SIGNAL, FAILED_JOB, PEAK, RUN, APP_XID = "seen", "signal", "failed_job", "peak", "run", "app_xid"
ECC_SBE = "ecc_sbe"
#: ``name`` of a ``seen`` fact made from routine telemetry (an ECC sample, a job run): the node was
#: in the fleet then. A ``seen`` fact without it (from an XID) names the node, not since when.
PRESENT = "present"
#: ``name`` of an ``ecc_sbe`` fact whose sample the GPU's trend model flagged as anomalous.
ECC_FLAGGED = "flagged"

#: The ECC reference of a period in which the fleet has no usual correctable rate to compare with:
#: its first two periods, its first 12 hours of errors, or fewer than ``ecc_reference_min_gpus``
#: GPUs corrected an error.
NO_ECC_REFERENCE = -1.0
#: A core's checkpointed horizon when it has no checkpoint yet: a restart hands everything over again.
FROM_THE_START = -(2**62)

#: Why a failed job failed (``value`` of a ``failed_job`` fact): no evidence either way (or a fact
#: of a worker from before job-aware verdicts), hardware evidence on its nodes, or application-class
#: XIDs from the job itself and no hardware evidence.
FAILED_UNKNOWN, FAILED_HARDWARE, FAILED_APPLICATION = 0, 1, 2


@dataclass(frozen=True, slots=True, order=True)
class FleetFact:
    """One fact a core hands the fleet stage; ordered canonically (time first, then content).

    Attributes
    ----------
    ts_ms
        Event time of the fact.
    kind
        ``seen`` (``node`` of ``cluster`` is part of the fleet; ``name`` :data:`PRESENT` when
        telemetry showed it then), ``signal`` (one lemon signal
        ``name`` on ``node``; ``key``: the job of a ``job_runs`` signal from a worker before
        job-aware verdicts), ``failed_job`` (job ``key`` of user ``name`` failed on ``node``, for
        the reason ``value``: one of
        :data:`FAILED_UNKNOWN`, :data:`FAILED_HARDWARE`, :data:`FAILED_APPLICATION`; the stage
        makes these itself once it attributed the job), ``peak`` (a burst of GPU ``key`` on
        ``node`` finished, having peaked at ``value`` window counts), ``run`` (job ``key`` of
        user ``name`` started on ``node``, its first node when ``value`` is 1: the node's load, and
        what a user's failures are a share of) or ``app_xid`` (job ``key`` of user ``name``
        logged application-class XID ``value`` on ``node``: an XID day of the node unless the
        errors follow the user) or ``ecc_sbe`` (GPU ``key`` on ``node`` corrected ``value`` errors
        since its previous sample, the one at ``ts_ms``; ``name`` is :data:`ECC_FLAGGED` when its
        trend model flagged the sample).

    Two equal facts are one fact handed over twice (a core restarted from a checkpoint repeats
    what it handed over since): the stage keeps one.
    """

    ts_ms: int
    kind: str
    node: str = ""
    name: str = ""
    key: str = ""
    value: int = 0
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class JobPart:
    """A failed run as one core saw it: the run, and the hardware evidence on the core's nodes.

    ``covered`` lists the run's nodes the core owns; the stage decides once the parts it has
    cover every node of the run.
    """

    cluster: str
    job_id: str
    start_ms: int
    end_ms: int
    state: JobState
    nodes: tuple[str, ...]
    gpus: int
    covered: tuple[str, ...]
    evidence: tuple[HardwareEvent, ...]
    user: str = ""
    #: Application-class XIDs the run logged on the covered nodes.
    app_xids: int = 0
    name: str = ""
    partition: str = ""

    @property
    def run_key(self) -> tuple[str, str, int, int]:
        return (self.cluster, self.job_id, self.start_ms, self.end_ms)


load_older_layouts(JobPart)  # a fleet checkpoint from before ``partition`` holds parts without it


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Tunables of the fleet stage (the detection core's config carries them).

    Attributes
    ----------
    lemon
        Lemon-node detection.
    baseline_period_ms
        Period of the storm baseline; a period uses the peaks finished before the previous one.
    baseline_quantile, baseline_min_gpus
        The fleet's usual burst: the ``baseline_quantile`` of finished burst peaks, but never
        above what at least ``baseline_min_gpus`` distinct GPUs reached (a burst size is usual
        when many GPUs show it; in a small or quiet fleet the quantile is the second or third
        largest burst, and a few large ones, missed storms among them, would raise the bar that
        storms must clear).
    attribution_before_ms, attribution_after_ms
        The attribution window around a failed job's end (as the cores use it).
    windows_s, size_buckets
        MTTF windows and job-size buckets, for the final rows of attributed runs.
    quiet_period_ms
        Quiet period that resolves a lemon incident.
    owner_window_ms, owner_min_failures, owner_min_share
        Job-aware verdicts: a user whose runs failed with application-class XIDs (and no
        hardware evidence) at least ``owner_min_failures`` times within ``owner_window_ms``, that
        being at least ``owner_min_share`` of the runs they started in it, gets a
        ``job_app_errors`` incident (a crash loop of their jobs, wherever they run).
    ecc_reference_period_ms, ecc_reference_window_ms, ecc_reference_min_gpus
        The fleet's healthy ceiling of correctable rates: decided every period (a period uses the
        errors corrected before the previous one began, over the window before that), from the
        rates of at least ``ecc_reference_min_gpus`` GPUs. A GPU with no trusted past of its own
        is compared with it.
    """

    lemon: LemonConfig = field(default_factory=LemonConfig)
    baseline_period_ms: int = DAY_MS
    baseline_quantile: float = 0.99
    attribution_before_ms: int = 10 * 60_000
    attribution_after_ms: int = 5 * 60_000
    windows_s: tuple[int, ...] = (3600, 86400)
    size_buckets: SizeBuckets = field(default_factory=SizeBuckets)
    quiet_period_ms: int = 3 * DAY_MS
    owner_window_ms: int = DAY_MS
    owner_min_failures: int = 5
    owner_min_share: float = 0.5
    # New fields go last: a worker checkpoint pickles the configuration as its values in order.
    baseline_min_gpus: int = 10
    ecc_reference_period_ms: int = HOUR_MS
    ecc_reference_window_ms: int = 7 * DAY_MS
    ecc_reference_min_gpus: int = 10


@dataclass(slots=True)
class FleetOutput:
    """What the stage decided since the last :meth:`FleetCore.drain`."""

    incidents: list[Incident] = field(default_factory=list)
    attributions: list[JobAttribution] = field(default_factory=list)
    mttf: list[MttfPartial] = field(default_factory=list)
    #: Storm baselines: period start (ms) -> the fleet's usual burst from then on.
    baselines: dict[int, float] = field(default_factory=dict)
    #: ECC references: period start (ms) -> the correctable errors per day a healthy GPU of the
    #: fleet reaches at most (:data:`NO_ECC_REFERENCE`: none).
    ecc_references: dict[int, float] = field(default_factory=dict)


def exact_quantile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank quantile of already sorted values; 0.0 when there are none.

    >>> exact_quantile([1, 2, 3, 4], 0.5), exact_quantile([5, 9, 30], 0.99), exact_quantile([], 0.9)
    (2.0, 30.0, 0.0)
    """
    if not sorted_values:
        return 0.0
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return float(sorted_values[rank - 1])


#: Hours of the fleet's correctable errors a reference needs: in the first hours most GPUs show one
#: or two errors, and a spread measured on counts that small says nothing.
_MIN_ECC_HISTORY_MS = 12 * HOUR_MS
#: The least spread of log rates: what Poisson noise alone gives GPUs of one rate over half a day.
_MIN_LOG_SPREAD = 0.5


def healthy_ceiling(counts: list[int]) -> float:
    """What the highest of these GPUs' error counts is expected to reach when all of them are
    healthy: correctable rates spread log-normally over a fleet's GPUs, so the largest of ``n`` is
    about ``exp(mu + sigma * sqrt(2 ln n))`` (the bound on the largest of ``n`` normals), with
    ``mu`` and ``sigma`` of the logs taken robustly (median, and 1.4826 times the median absolute
    deviation): the GPUs degrading at the top of the fleet do not move them.

    >>> round(healthy_ceiling([4, 4, 4, 4]), 1), round(healthy_ceiling([1, 2, 4, 8, 16, 900]), 1)
    (9.2, 104.7)
    """
    logs = sorted(math.log(count) for count in counts)
    middle = statistics.median(logs)
    spread = max(1.4826 * statistics.median(abs(value - middle) for value in logs), _MIN_LOG_SPREAD)
    return math.exp(middle + spread * math.sqrt(2.0 * math.log(len(logs))))


class FleetCore:
    """The fleet stage over ``partitions`` cores (numbered 0 to ``partitions - 1``).

    Examples
    --------
    Two cores, one per half of the fleet; nothing is decided before both horizons pass:

    >>> fleet = FleetCore(FleetConfig(baseline_period_ms=10, baseline_min_gpus=1), partitions=2)
    >>> fleet.add(0, [FleetFact(3, PEAK, value=40)])
    >>> fleet.advance(0, 25)
    >>> fleet.drain().baselines
    {}
    >>> fleet.advance(1, 25)
    >>> fleet.drain().baselines    # from 20 on: the peaks finished before 10, and so on
    {0: 0.0, 10: 0.0, 20: 40.0, 30: 40.0}
    >>> fleet.baseline(0), fleet.baseline(20), fleet.baseline(40)
    (0.0, 40.0, None)
    """

    def __init__(self, config: FleetConfig, partitions: int = 1) -> None:
        self.config = config
        self.partitions = partitions
        self._horizons: dict[int, int] = {}
        self._idle: set[int] = set()
        #: Idle cores with decisions pending: they hold the stage while another core is active.
        self._idle_pending: set[int] = set()
        #: Per core that says it, the horizon of its newest checkpoint: what a restarted core hands
        #: over again follows it, so a run it could repeat is remembered as decided.
        self._checkpointed: dict[int, int] = {}
        self._pending: list[FleetFact] = []  # a heap: facts not applied yet
        self._queued: set[FleetFact] = set()  # the same, to drop repeats
        self._applied_to: int | None = None  # every fact before this time is applied
        self._lemons = LemonTracker(config.lemon)
        self._cluster_of: dict[str, str] = {}
        self._incidents = IncidentTracker(
            config.quiet_period_ms, {IncidentKind.LEMON_NODE: config.quiet_period_ms}
        )
        self._next_lemon_ms: int | None = None
        self._peaks: list[int] = []  # finished peaks applied so far, sorted
        # Per GPU (node, PCI id), its largest finished peak, and those maxima sorted; None in a
        # stage restored from a checkpoint that did not keep them (the quantile alone decides).
        self._gpu_peak: dict[tuple[str, str], int] = {}
        self._gpu_maxima: list[int] | None = []
        self._next_boundary_ms: int | None = None
        self._first_boundary_ms: int | None = None
        self._baselines: dict[int, float] = {}
        self._parts: dict[tuple[str, str, int, int], list[JobPart]] = {}
        self._decided: dict[tuple[str, str, int, int], int] = {}  # run -> end, to drop repeats
        self._exposure = ExposureTracker(config.windows_s, config.size_buckets)
        self._out = FleetOutput()
        # Job-aware verdicts: per user, their recent runs and application failures.
        self._user_runs: dict[str, deque[int]] = {}
        self._user_app_failures: dict[str, deque[tuple[int, str, str]]] = {}
        # The jobs among each user's failures (one entry a run), asked of each failure fact: a
        # user's sweep can fail thousands of runs within the window.
        self._user_app_jobs: dict[str, set[str]] = {}
        self._owner_reported: dict[str, int] = {}  # user -> their last failure reported
        #: Job id -> the context of its run, for the application failures in the deques above.
        self._app_context: dict[str, JobContext] = {}
        #: Per user, the lemon signals their application evidence added before their errors were
        #: seen to follow them: (signal, node, event time, job id), taken back once they are.
        self._user_counted: dict[str, deque[tuple[str, str, int, str]]] = {}
        self._init_ecc()

    def _init_ecc(self) -> None:
        #: Correctable errors of the reference window, (time, node, GPU, errors), oldest first,
        #: and their sum per GPU.
        self._sbe: deque[tuple[int, str, str, int]] = deque()
        self._gpu_sbe: dict[tuple[str, str], int] = {}
        #: GPUs whose correctable errors were flagged as anomalous, and when last: no peers while
        #: flagged within the window (River's protected filter, at fleet scale: a degrading GPU
        #: must not raise the rate that the others are compared with).
        self._gpu_flagged: dict[tuple[str, str], int] = {}
        self._next_ecc_ms: int | None = None
        self._first_ecc_ms: int | None = None
        # The first correctable error the stage heard of: the rates count time from there (the
        # errors of a GPU's first interval are in it, so an early rate errs on the high side).
        self._ecc_origin_ms: int | None = None
        self._ecc_references: dict[int, float] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a checkpoint from before job-aware verdicts and per-GPU peaks: their state
        starts empty (the per-GPU bound on the storm baseline stays off: it would count only the
        bursts after the restart), and configuration fields added since take their defaults."""
        state.setdefault("_checkpointed", {})
        state.setdefault("_idle_pending", set())
        if "_gpu_maxima" not in state:
            state["_gpu_peak"], state["_gpu_maxima"] = {}, None
        config = state["config"]
        names = [item.name for item in fields(FleetConfig)]
        present = {name: getattr(config, name) for name in names if hasattr(config, name)}
        if len(present) < len(names):
            state["config"] = FleetConfig(**present)
        state.setdefault("_user_runs", {})
        state.setdefault("_user_app_failures", {})
        state.setdefault("_owner_reported", {})
        state.setdefault("_app_context", {})
        if "_user_app_jobs" not in state:
            failed = state["_user_app_failures"]
            state["_user_app_jobs"] = {user: {job for _, _, job in runs} for user, runs in failed.items()}
        # Kept in lists before they were deques.
        state["_user_counted"] = {user: deque(c) for user, c in state.get("_user_counted", {}).items()}
        self.__dict__.update(state)
        if "_sbe" not in state:
            # A checkpoint from before the ECC reference: the fleet's errors are counted from the
            # restart on, as if its history began then.
            self._init_ecc()

    # -- input ---------------------------------------------------------------------------------

    def add(self, partition: int, facts: Iterable[FleetFact]) -> None:
        """Facts from core ``partition``; those before the applied horizon are repeats (a core
        that restarted from a checkpoint hands over again what it had handed over)."""
        self._idle.discard(partition)
        self._idle_pending.discard(partition)
        self._queue(facts)

    def _queue(self, facts: Iterable[FleetFact]) -> None:
        for fact in facts:
            if (self._applied_to is None or fact.ts_ms >= self._applied_to) and fact not in self._queued:
                self._queued.add(fact)
                heapq.heappush(self._pending, fact)

    def add_job(self, part: JobPart) -> None:
        """A failed run's part; attributed once the parts cover all its nodes."""
        key = part.run_key
        if key in self._decided:
            return
        parts = self._parts.setdefault(key, [])
        if any(p.covered == part.covered for p in parts):
            return  # the same part again
        parts.append(part)
        covered = {node for p in parts for node in p.covered}
        if covered.issuperset(part.nodes):
            del self._parts[key]
            self._decided[key] = part.end_ms
            self._attribute(parts)

    def advance(self, partition: int, horizon_ms: int, checkpointed_ms: int | None = None) -> None:
        """Core ``partition`` hands over no more facts before ``horizon_ms``; ``checkpointed_ms``:
        the horizon of its newest checkpoint (:data:`FROM_THE_START` before its first), after
        which a restart of it hands over again what it handed over (None: not said)."""
        if checkpointed_ms is not None:
            self._checkpointed[partition] = checkpointed_ms
        self._idle.discard(partition)
        self._idle_pending.discard(partition)
        if horizon_ms > self._horizons.get(partition, -(2**62)):
            self._horizons[partition] = horizon_ms
        self._run_to(self.horizon_ms)

    def idle(self, partition: int, pending: bool = False) -> None:
        """Core ``partition`` has nothing to read: the stage does not wait for it until it hands
        over facts again (facts it then sends before the horizon are late and dropped) — unless it
        has decisions ``pending`` (failed runs whose attribution window its watermark has not
        passed): their facts will come at or after its horizon once it reads again, so while any
        other core is active the stage goes no further than that horizon. (Passing it, a core
        drained for a while mid-stream had two application failures of a crash-looping user
        dropped as late: the owner's incident two versions short.) Also when every core is idle:
        no record waits in a merge then (a partition holding one is not idle), so holding the
        stage delays only its own later decisions, until that core reads again."""
        self._idle.add(partition)
        if pending:
            self._idle_pending.add(partition)
        else:
            self._idle_pending.discard(partition)
        self._run_to(self.horizon_ms)

    @property
    def horizon_ms(self) -> int | None:
        """Event time before which every core's facts are in; None while a core is unheard of."""
        waiting = [p for p in range(self.partitions) if p not in self._idle]
        if any(p not in self._horizons for p in waiting):
            return None
        holding = [*waiting, *(p for p in self._idle_pending if p in self._horizons)]
        if not holding:  # every core idle, none with decisions pending: all its facts are in
            return max(self._horizons.values(), default=None)
        return min(self._horizons[p] for p in holding)

    def holding_back(self) -> list[int]:
        """The cores the stage waits for: those not heard of yet, else those at the lowest horizon
        (none while every core is idle). What an operator looks at when a decision does not come."""
        waiting = [p for p in range(self.partitions) if p not in self._idle]
        unheard = [p for p in waiting if p not in self._horizons]
        holding = sorted({*waiting, *(p for p in self._idle_pending if p in self._horizons)})
        if unheard or not holding:
            return unheard
        lowest = min(self._horizons[p] for p in holding)
        return [p for p in holding if self._horizons[p] == lowest]

    def baseline(self, period_start_ms: int) -> float | None:
        """The storm baseline from ``period_start_ms`` on; None until it is decided (0.0 for the
        first two periods of the fleet's history: no burst had finished before them)."""
        if self._first_boundary_ms is not None and period_start_ms <= self._first_boundary_ms + (
            self.config.baseline_period_ms
        ):
            return self._baselines.get(period_start_ms, 0.0)
        return self._baselines.get(period_start_ms)

    def ecc_reference(self, period_start_ms: int) -> float | None:
        """The correctable errors per day a healthy GPU of the fleet reaches at most, from
        ``period_start_ms`` on (see :class:`FleetConfig`); None until it is decided,
        :data:`NO_ECC_REFERENCE` for none."""
        first = self._first_ecc_ms
        if first is not None and period_start_ms <= first + self.config.ecc_reference_period_ms:
            return self._ecc_references.get(period_start_ms, NO_ECC_REFERENCE)
        return self._ecc_references.get(period_start_ms)

    @property
    def next_instant_ms(self) -> int | None:
        """The next event time at which the stage decides something (None before any horizon)."""
        if self._next_lemon_ms is None or self._next_boundary_ms is None or self._next_ecc_ms is None:
            return None
        return min(self._next_lemon_ms, self._next_boundary_ms, self._next_ecc_ms)

    def drain(self) -> FleetOutput:
        """Return and forget what was decided since the previous call."""
        out, self._out = self._out, FleetOutput()
        return out

    # -- time ----------------------------------------------------------------------------------

    def _run_to(self, horizon: int | None) -> None:
        if horizon is None or (self._applied_to is not None and horizon < self._applied_to):
            return  # (at the horizon applied to: an instant there, undecided by an older stage)
        period = self.config.baseline_period_ms
        every = self.config.lemon.evaluate_every_ms
        ecc_period = self.config.ecc_reference_period_ms
        if self._applied_to is None:
            # The first instants lie at or before the horizon, never after it: a core whose next
            # record waits for the first decision pins its horizon there (a sample 10 minutes past
            # midnight whose lateness and attribution window add up to 10: a month of 10-minute
            # scrapes waited for good for a boundary at midnight, its facts' day).
            first = min(self._pending[0].ts_ms, horizon) if self._pending else horizon
            self._next_lemon_ms = first - first % every + every
            self._next_boundary_ms = first - first % period
        if self._next_ecc_ms is None:
            # The first boundary (or, restored from a checkpoint without the ECC reference, the
            # time the stage had reached): the ECC history starts there.
            since = self._applied_to if self._applied_to is not None else self._next_boundary_ms
            assert since is not None
            self._next_ecc_ms = since - since % ecc_period
        assert self._next_lemon_ms is not None and self._next_boundary_ms is not None
        # Instants in event-time order: a baseline boundary, an ECC reference, then a lemon
        # evaluation, each after the facts before it.
        while True:
            instant = min(self._next_lemon_ms, self._next_boundary_ms, self._next_ecc_ms)
            if instant > horizon:
                break  # at the horizon every fact before the instant is in: it is decided
            self._apply_before(instant)
            if instant == self._next_ecc_ms:
                self._decide_ecc_reference(instant)
                self._next_ecc_ms = instant + ecc_period
            elif instant == self._next_boundary_ms:
                # The peaks finished before boundary b make the baseline of the period after the
                # next (from b + period): a core needs it only once the fleet's horizon passed b.
                if self._first_boundary_ms is None:
                    # The fleet's first period (and the next, below) have no finished burst before
                    # them; a core whose first records fall in it needs that said too.
                    self._first_boundary_ms = instant
                    self._baselines[instant] = self._out.baselines[instant] = 0.0
                value = self._usual_burst()
                self._baselines[instant + period] = self._out.baselines[instant + period] = value
                self._next_boundary_ms = instant + period
                # A core restarted from its newest checkpoint hands over again the runs it decided
                # since: those are remembered as decided for as long as a core may repeat them.
                forget = min([instant - 2 * period, *self._checkpointed.values()])
                self._decided = {k: end for k, end in self._decided.items() if end >= forget}
            else:
                self._out.incidents.extend(self._incidents.resolve_idle(instant))
                self._evaluate_lemons(instant)
                self._evaluate_owners(instant)
                self._next_lemon_ms = instant + every
        self._apply_before(horizon)
        self._applied_to = horizon

    def _apply_before(self, instant: int) -> None:
        pending = self._pending
        while pending and pending[0].ts_ms < instant:
            fact = heapq.heappop(pending)
            self._queued.discard(fact)
            self._apply(fact)

    def know_nodes(self, nodes: Iterable[str], cluster: str) -> None:
        """The fleet's inventory: nodes of ``cluster`` in the fleet since its history began, whether
        any record names them or not (the lemon statistics compare each node with all of them)."""
        for node in nodes:
            self._cluster_of.setdefault(node, cluster)
            self._lemons.know_node(node)

    def _apply(self, fact: FleetFact) -> None:
        if fact.kind == SEEN:
            self._cluster_of.setdefault(fact.node, fact.cluster)
            self._lemons.see_node(fact.node, fact.ts_ms, present=fact.name == PRESENT)
        elif fact.kind == SIGNAL:
            if fact.name == "xid_days":
                self._lemons.record_xid(fact.node, fact.ts_ms)
            else:
                self._lemons.record(fact.node, fact.name, fact.ts_ms)
        elif fact.kind == FAILED_JOB:
            if fact.value == FAILED_APPLICATION and fact.name:
                self._app_failure(fact)
            follows = self._follows_user(fact.name, fact.ts_ms)
            if fact.value == FAILED_HARDWARE:
                self._lemons.record_failed_job(fact.node, fact.key, fact.ts_ms)
            elif not follows and self._lemons.record_failed_job(fact.node, fact.key, fact.ts_ms):
                self._counted(fact.name, "failed_jobs", fact.node, fact.ts_ms, fact.key)
            if follows and fact.value == FAILED_APPLICATION:
                self._take_back(fact.name)
        elif fact.kind == APP_XID:
            follows = self._follows_user(fact.name, fact.ts_ms)
            if not follows and self._lemons.record_xid(fact.node, fact.ts_ms):
                self._counted(fact.name, "xid_days", fact.node, fact.ts_ms, "")
        elif fact.kind == RUN:
            if fact.value and fact.name:
                self._user_runs.setdefault(fact.name, deque()).append(fact.ts_ms)
                self._expire_user(fact.name, fact.ts_ms)
            if not self._follows_user(fact.name, fact.ts_ms):
                self._lemons.record(fact.node, "job_runs", fact.ts_ms)
                self._counted(fact.name, "job_runs", fact.node, fact.ts_ms, "")
        elif fact.kind == ECC_SBE:
            gpu = (fact.node, fact.key)
            self._sbe.append((fact.ts_ms, fact.node, fact.key, fact.value))
            if self._ecc_origin_ms is None:
                self._ecc_origin_ms = fact.ts_ms
            if fact.name == ECC_FLAGGED:
                self._gpu_flagged[gpu] = fact.ts_ms
            self._gpu_sbe[gpu] = self._gpu_sbe.get(gpu, 0) + fact.value
        elif fact.kind == PEAK:
            bisect.insort(self._peaks, fact.value)
            gpu = (fact.node, fact.key)
            known = self._gpu_peak.get(gpu)
            if self._gpu_maxima is not None and (known is None or fact.value > known):
                if known is not None:
                    del self._gpu_maxima[bisect.bisect_left(self._gpu_maxima, known)]
                bisect.insort(self._gpu_maxima, fact.value)
                self._gpu_peak[gpu] = fact.value

    def _decide_ecc_reference(self, instant: int) -> None:
        """At ECC boundary ``instant``: the reference of the period after the next, from the errors
        corrected in the window before ``instant`` (the facts before it are applied)."""
        period = self.config.ecc_reference_period_ms
        if self._first_ecc_ms is None:
            self._first_ecc_ms = instant
            self._ecc_references[instant] = self._out.ecc_references[instant] = NO_ECC_REFERENCE
        since = instant - self.config.ecc_reference_window_ms
        sbe, totals = self._sbe, self._gpu_sbe
        while sbe and sbe[0][0] < since:
            _, node, gpu, errors = sbe.popleft()
            left = totals[(node, gpu)] - errors
            if left:
                totals[(node, gpu)] = left
            else:
                del totals[(node, gpu)]
        flagged = self._gpu_flagged
        if flagged:
            for stale in [gpu for gpu, last in flagged.items() if last < since]:
                del flagged[stale]
        peers = [errors for gpu, errors in totals.items() if gpu not in flagged] if totals else []
        enough = self.config.ecc_reference_min_gpus
        origin = self._ecc_origin_ms
        covered = 0 if origin is None else instant - max(since, origin)
        reference = NO_ECC_REFERENCE
        if len(peers) >= max(enough, 1) and covered >= _MIN_ECC_HISTORY_MS:
            reference = healthy_ceiling(peers) * DAY_MS / covered
        self._ecc_references[instant + period] = self._out.ecc_references[instant + period] = reference
        # Older references are needed only by a core restarted from its last checkpoint. They are
        # made in time order, so the oldest are first: an hourly boundary over years of history
        # must not go over all of them.
        references, keep_from = self._ecc_references, instant - 2 * DAY_MS
        while references and (oldest := next(iter(references))) < keep_from:
            del references[oldest]

    def _usual_burst(self) -> float:
        """The fleet's usual burst from the peaks applied so far: their quantile, but no larger
        than the largest peak at least ``baseline_min_gpus`` GPUs reached (0 with fewer GPUs)."""
        value = exact_quantile(self._peaks, self.config.baseline_quantile)
        maxima, enough = self._gpu_maxima, self.config.baseline_min_gpus
        if maxima is None or enough <= 1:
            return value
        return min(value, float(maxima[-enough]) if len(maxima) >= enough else 0.0)

    # -- job-aware verdicts ---------------------------------------------------------------------

    def _follows_user(self, user: str, now_ms: int) -> bool:
        """Whether ``user``'s jobs crash wherever they run: application failures (application-class
        XIDs, no hardware evidence) make up most of their runs of the last ``owner_window_ms``, at
        least ``owner_min_failures`` of them. Their evidence is theirs, not their nodes'."""
        if not user or user not in self._user_app_failures:
            return False
        self._expire_user(user, now_ms)
        failures = len(self._user_app_failures[user])
        runs = max(len(self._user_runs.get(user, ())), failures)
        return failures >= self.config.owner_min_failures and failures >= self.config.owner_min_share * runs

    def _counted(self, user: str, signal: str, node: str, ts_ms: int, job_id: str) -> None:
        """Remember a lemon signal a user's application evidence added (for :meth:`_take_back`)."""
        if not user:
            return
        counted = self._user_counted.setdefault(user, deque())
        since = ts_ms - self.config.owner_window_ms
        while counted and counted[0][2] <= since:  # older than the window that could flag the user
            counted.popleft()
        counted.append((signal, node, ts_ms, job_id))

    def _take_back(self, user: str) -> None:
        """The user's errors follow them: what their application evidence of the window that showed
        it added to their nodes' lemon signals is theirs, not the nodes' (the first failures were
        counted before the pattern could be seen; a lemon verdict in between would blame a node)."""
        for signal, node, ts_ms, job_id in self._user_counted.pop(user, ()):
            self._lemons.forget(node, signal, ts_ms, job_id)

    def _expire_user(self, user: str, now_ms: int) -> None:
        since = now_ms - self.config.owner_window_ms
        runs = self._user_runs.get(user)
        while runs and runs[0] <= since:
            runs.popleft()
        failures = self._user_app_failures.get(user)
        while failures and failures[0][0] <= since:
            job = failures.popleft()[2]
            self._app_context.pop(job, None)
            self._user_app_jobs[user].discard(job)

    def _app_failure(self, fact: FleetFact) -> None:
        """A run of user ``fact.name`` failed with application-class XIDs and no hardware evidence
        (one entry per run, whichever of its nodes the fact is about)."""
        failures = self._user_app_failures.setdefault(fact.name, deque())
        jobs = self._user_app_jobs.setdefault(fact.name, set())
        if fact.key not in jobs:
            jobs.add(fact.key)
            failures.append((fact.ts_ms, fact.node, fact.key))

    def _evaluate_owners(self, now: int) -> None:
        """At each verdict instant: a user whose application failures make up most of their recent
        runs has jobs that crash wherever they run; the owner hears of it (one incident per user,
        never a node verdict), with each failure not reported yet as evidence."""
        for user in sorted(self._user_app_failures):
            if not self._follows_user(user, now):
                if not self._user_app_failures[user]:
                    del self._user_app_failures[user]
                    self._user_app_jobs.pop(user, None)
                continue
            failures = self._user_app_failures[user]
            runs = max(len(self._user_runs.get(user, ())), len(failures))
            reported = self._owner_reported.get(user, -(2**62))
            partitions = sorted(
                {c.partition for _, _, j in failures if (c := self._app_context.get(j)) and c.partition}
            )
            where = (
                f" (partition {', '.join(partitions[:3])}{', ...' if len(partitions) > 3 else ''})"
                if partitions
                else ""
            )
            for ts_ms, node, job_id in failures:
                if ts_ms <= reported:
                    continue
                known = self._app_context.get(job_id)
                context = (known,) if known is not None else ()
                self._out.incidents.extend(
                    self._incidents.observe(
                        Finding(
                            cluster=self._cluster_of.get(node, ""),
                            kind=IncidentKind.JOB_APP_ERRORS,
                            node=node,
                            severity=Severity.WARN,
                            detector="job_aware",
                            score=len(failures) / runs,
                            action=f"tell user {user}: their jobs fail with application errors wherever "
                            "they run; no node action (draining would fix nothing)",
                            title=f"Application errors follow user {user}'s jobs{where}: most of their "
                            "runs fail with application XIDs",
                            evidence=EvidenceItem(ts_ms, jobs=(job_id,), job_context=context),
                            owner=user,
                        )
                    )
                )
            self._owner_reported[user] = failures[-1][0]

    def _evaluate_lemons(self, now: int) -> None:
        for verdict in self._lemons.evaluate(now):
            crossed = ", ".join(
                f"{name} {verdict.counts[name]} where {verdict.expected[name]:.2g} is usual"
                for name in verdict.crossed
            )
            self._out.incidents.extend(
                self._incidents.observe(
                    Finding(
                        cluster=self._cluster_of.get(verdict.node, ""),
                        kind=IncidentKind.LEMON_NODE,
                        node=verdict.node,
                        severity=Severity.WARN,
                        detector="lemon_fleet",
                        score=verdict.score,
                        action="drain the node and run full diagnostics; replace parts or retire it if they "
                        "fail",
                        title=f"Lemon node: signals far above the fleet over "
                        f"{min(verdict.exposure_days, self.config.lemon.window_ms / DAY_MS):.0f} d"
                        f" ({crossed or 'combined'}); confidence {verdict.confidence:.1%}",
                        evidence=EvidenceItem(
                            now, counter_deltas=tuple(sorted(verdict.counts.items())), jobs=verdict.jobs_hurt
                        ),
                    )
                )
            )

    # -- jobs ----------------------------------------------------------------------------------

    def _attribute(self, parts: list[JobPart]) -> None:
        part = parts[0]
        evidence = sorted(
            {e for p in parts for e in p.evidence}, key=lambda e: (e.ts_ms, e.node, e.gpu, e.kind, e.xid or 0)
        )
        hardware = bool(evidence)
        run = JobRun(
            part.cluster,
            part.job_id,
            part.start_ms,
            part.nodes,
            part.gpus,
            user=next((p.user for p in parts if p.user), ""),
            name=next((p.name for p in parts if p.name), ""),
            partition=next((p.partition for p in parts if p.partition), ""),
        )
        buckets = self.config.size_buckets
        attribution = JobAttribution(
            cluster=run.cluster,
            job_id=run.job_id,
            state=part.state.value,
            start_ms=run.start_ms,
            end_ms=part.end_ms,
            num_nodes=len(run.nodes),
            gpus=run.gpus,
            size_bucket=buckets.label(run.gpus),
            hardware=hardware,
            evidence_nodes=tuple(sorted({e.node for e in evidence})),
            evidence_xids=tuple(sorted({e.xid for e in evidence if e.xid is not None})),
            evidence_kinds=tuple(sorted({e.kind for e in evidence})),
            incident_id=(
                incident_id(run.cluster, IncidentKind.JOB_HW_FAILURE, f"job/{run.job_id}", part.end_ms)
                if hardware
                else ""
            ),
        )
        self._out.attributions.append(attribution)
        # The lemon statistics count the failure on each of its nodes, now that its cause is known
        # (at its end time, which no horizon has passed yet: the last part came as it did).
        user = next((p.user for p in parts if p.user), "")
        if hardware:
            reason = FAILED_HARDWARE
        elif sum(p.app_xids for p in parts) > 0:
            reason = FAILED_APPLICATION
        else:
            reason = FAILED_UNKNOWN
        if reason == FAILED_APPLICATION and user:
            self._app_context[run.job_id] = run.context  # the owner's incident names the job
        self._queue(FleetFact(part.end_ms, FAILED_JOB, node, user, run.job_id, reason) for node in run.nodes)
        if hardware:
            self._out.incidents.append(self._job_incident(run, part, attribution, evidence))
        self._out.mttf.extend(
            self._exposure.run_ended(run, part.end_ms, part.state, hardware_failure=hardware)
        )

    def _job_incident(
        self, run: JobRun, part: JobPart, attribution: JobAttribution, evidence: list[HardwareEvent]
    ) -> Incident:
        first = evidence[0]
        codes = ", ".join(f"XID {x}" for x in attribution.evidence_xids) or ", ".join(
            attribution.evidence_kinds
        )
        summary = (
            f"[warn] Job {run.job_id} ({run.gpus} GPUs on {len(run.nodes)} nodes"
            f"{f', partition {run.partition}' if run.partition else ''}) ended {part.state.value} "
            f"after {attribution.gpu_hours:.1f} GPU-hours; hardware evidence on "
            f"{', '.join(attribution.evidence_nodes)}"
            f" ({codes}). Action: requeue the job away from the evidence nodes"
        )
        return Incident(
            incident_id=attribution.incident_id,
            kind=IncidentKind.JOB_HW_FAILURE,
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
                "job_context": [run.context.to_dict()],
                "state": part.state.value,
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
