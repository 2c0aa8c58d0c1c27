"""Job runs and their failure attribution: which jobs run where, and did hardware kill a failed one.

:class:`JobTracker` follows each run of a job from its start to its terminal state and knows
which jobs run on each node (incidents name them as evidence). It keeps the recent hardware
events of the nodes (:class:`~detectors.attribution.NodeEvidenceLog`), and a run that ends
FAILED or NODE_FAIL waits until the event-time watermark has passed ``end + after``; then it is
attributed (SPEC 4.4), so the verdict never depends on how fast the evidence arrived.

The tracker only finds the evidence. The detection core hands each decided run to the fleet stage
(:mod:`detectors.fleet`), which joins the evidence of all the run's nodes and attributes it once.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from detectors.attribution import HardwareEvent, NodeEvidenceLog
from detectors.mttf import SizeBuckets
from schemas.records import JobEvent, JobState

__all__ = ["Decided", "JobContext", "JobRun", "JobTracker", "RunEnd", "load_older_layouts"]

#: Ended runs remembered (a redelivered start or end of one changes nothing) before those that
#: ended before the longest MTTF window are forgotten.
_ENDED_RUNS_FLOOR = 4096


@dataclass(frozen=True, slots=True, order=True)
class JobContext:
    """Who ran what on a node at one moment: the scheduler's view that evidence carries.

    Attributes
    ----------
    job_id, user, name
        The job, its owner (empty when the scheduler did not say) and its name.
    num_nodes, gpus
        Its size.
    partition
        Its Slurm partition (empty when the scheduler did not say). Last, because it was added
        later: older checkpoints pickled the five fields before it.
    """

    job_id: str
    user: str = ""
    name: str = ""
    num_nodes: int = 1
    gpus: int = 0
    partition: str = ""

    def to_dict(self) -> dict[str, object]:
        """The JSON form stored in an incident's evidence (``job_context``)."""
        return {
            "job_id": self.job_id,
            "user": self.user,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "gpus": self.gpus,
            "partition": self.partition,
        }


def load_older_layouts(cls: type[Any]) -> None:
    """Let a frozen slotted dataclass unpickle the shorter layouts of earlier versions.

    Such a dataclass pickles its field values in order, and the generated ``__setstate__`` would
    leave a field added since unset; this one gives the missing trailing fields their defaults
    (each added field must come last and have one), so worker checkpoints written by the
    previous version load. Set after the class is made, as ``schemas.records`` does for
    ``XidEvent``: some 3.11 releases let ``@dataclass(slots=True, frozen=True)`` replace a
    ``__setstate__`` defined in the class body.
    """
    names = tuple(f.name for f in fields(cls))
    defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    def setstate(self: object, state: Sequence[object]) -> None:
        for position, name in enumerate(names):
            object.__setattr__(self, name, state[position] if position < len(state) else defaults[name])

    cls.__setstate__ = setstate


load_older_layouts(JobContext)


@dataclass(slots=True)
class JobRun:
    """One run of a job (a requeued job has several), from its start to its terminal state."""

    cluster: str
    job_id: str
    start_ms: int
    nodes: tuple[str, ...]
    gpus: int
    #: Per MTTF window length (by index): exposure already emitted up to here; absent, the start.
    covered_ms: dict[int, int] = field(default_factory=dict)
    user: str = ""
    name: str = ""
    #: Application-class XIDs this run logged on the nodes of this core (job-aware verdicts: a
    #: failed run that logged them and no hardware evidence failed for its own reasons).
    app_xids: int = 0
    partition: str = ""

    def __setstate__(self, state: object) -> None:
        """Unpickle, also a checkpoint from before the job context or its partition: the new
        fields default."""
        names = (
            "cluster", "job_id", "start_ms", "nodes", "gpus", "covered_ms", "user", "name", "app_xids",
            "partition",
        )  # fmt: skip
        defaults: dict[str, object] = {"user": "", "name": "", "app_xids": 0, "partition": ""}
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = state[1]  # (None, slots) from object.__getstate__
        if isinstance(state, dict):
            values = state
        else:
            values = dict(zip(names, state, strict=False)) if isinstance(state, list | tuple) else {}
        for name in names:
            object.__setattr__(self, name, values.get(name, defaults.get(name)))

    @property
    def context(self) -> JobContext:
        """This run as evidence names it."""
        return JobContext(self.job_id, self.user, self.name, len(self.nodes), self.gpus, self.partition)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A run that reached a terminal state (a redelivered end is no ``RunEnd``).

    Attributes
    ----------
    run
        The run, no longer running.
    end_ms
        When it ended.
    decide_at_ms
        Event time after which its failure is attributed; None when the state is not one that
        attribution examines (the run's exposure is final at once).
    """

    run: JobRun
    end_ms: int
    decide_at_ms: int | None


@dataclass(frozen=True, slots=True)
class Decided:
    """A failed run whose attribution window has passed, with the hardware evidence of the nodes
    this tracker saw (the fleet stage, :mod:`detectors.fleet`, joins the evidence of all of the
    run's nodes and attributes it once)."""

    run: JobRun
    state: JobState
    end_ms: int
    evidence: tuple[HardwareEvent, ...]


class JobTracker:
    """Running jobs per node, failed runs awaiting attribution, and the hardware evidence they need.

    Parameters
    ----------
    attribution_before_ms, attribution_after_ms
        Attribution window around a failed job's end (the paper: 10 min before, 5 min after).
    allowed_lateness_ms
        How late evidence may arrive; the evidence log keeps events this much longer.
    gpus_per_node
        GPUs of a node, for jobs that do not state their GPU count.
    size_buckets
        Job-size buckets named in the attribution rows.

    Examples
    --------
    >>> from schemas.outputs import IncidentKind
    >>> jobs = JobTracker(attribution_before_ms=600_000, attribution_after_ms=300_000,
    ...                   allowed_lateness_ms=300_000, gpus_per_node=8, size_buckets=SizeBuckets())
    >>> run = jobs.start(JobEvent(ts_ms=0, cluster="c", job_id="7", state=JobState.RUNNING, nodes=("n1",)))
    >>> jobs.jobs_at("n1"), run.gpus
    (('7',), 8)
    >>> jobs.add_evidence(HardwareEvent(3_500_000, "n1", "0000:07:00", IncidentKind.GPU_BUS, 79))
    >>> jobs.end(JobEvent(ts_ms=3_600_000, cluster="c", job_id="7", state=JobState.FAILED)).decide_at_ms
    3900000
    >>> [decided] = jobs.decide_due(before_ms=4_000_000)
    >>> decided.state.value, [(e.node, e.xid) for e in decided.evidence]
    ('FAILED', [('n1', 79)])
    """

    def __init__(
        self,
        *,
        attribution_before_ms: int,
        attribution_after_ms: int,
        allowed_lateness_ms: int,
        gpus_per_node: int,
        size_buckets: SizeBuckets,
    ) -> None:
        self.attribution_before_ms = attribution_before_ms
        self.attribution_after_ms = attribution_after_ms
        self.gpus_per_node = gpus_per_node
        self.size_buckets = size_buckets
        self._evidence = NodeEvidenceLog(attribution_before_ms + attribution_after_ms + allowed_lateness_ms)
        self._runs: dict[tuple[str, str], JobRun] = {}
        self._jobs_on_node: dict[str, set[str]] = {}
        self._ended_runs: dict[tuple[str, str, int], int] = {}
        self._ended_limit = _ENDED_RUNS_FLOOR  # ended runs remembered before old ones are forgotten
        # (decide-at, sequence, run, final event) for failed runs awaiting attribution.
        self._pending: list[tuple[int, int, JobRun, JobEvent]] = []
        self._sequence = 0
        # Running runs by job id alone (what a node's records can be matched to).
        self._runs_of_job: dict[str, list[JobRun]] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a checkpoint from before the job context (the running runs indexed) or
        before the limit of ended runs kept (the floor)."""
        state.setdefault("_ended_limit", _ENDED_RUNS_FLOOR)
        self.__dict__.update(state)
        if "_runs_of_job" not in state:
            self._runs_of_job = {}
            for run in self._runs.values():
                self._runs_of_job.setdefault(run.job_id, []).append(run)

    @property
    def running(self) -> Collection[JobRun]:
        """The runs started and not ended, in the order they started."""
        return self._runs.values()

    @property
    def next_decision_ms(self) -> int | None:
        """Event time of the earliest pending attribution; None when none is pending."""
        return self._pending[0][0] if self._pending else None

    def jobs_at(self, node: str) -> tuple[str, ...]:
        """Ids of the jobs running on ``node``, sorted."""
        jobs = self._jobs_on_node.get(node)
        return tuple(sorted(jobs)) if jobs else ()

    def runs_at(self, node: str, cluster: str) -> tuple[JobRun, ...]:
        """The runs on ``node``, by job id: of ``cluster``, or of any cluster when the node's
        records do not name the scheduler's cluster (a kernel log names none)."""
        runs = []
        for job in self.jobs_at(node):
            run = self._runs.get((cluster, job))
            if run is None:
                run = next((r for r in self._runs_of_job.get(job, ()) if node in r.nodes), None)
            if run is not None:
                runs.append(run)
        return tuple(runs)

    def context_at(self, node: str, cluster: str) -> tuple[JobContext, ...]:
        """The job context of ``node`` now: who runs what there, by job id."""
        return tuple(run.context for run in self.runs_at(node, cluster))

    def add_evidence(self, event: HardwareEvent) -> None:
        """A hardware-class event that may explain a job's failure."""
        self._evidence.add(event)

    def forget_evidence(self, watermark_ms: int) -> None:
        """Drop the evidence that no decision still to come can look at."""
        self._evidence.prune(watermark_ms - self.attribution_before_ms - self.attribution_after_ms)

    def forget_ended(self, horizon_ms: int) -> None:
        """Forget runs that ended before ``horizon_ms``, once there are many.

        Ended runs are remembered so that a redelivered start or end changes nothing.
        """
        if len(self._ended_runs) > self._ended_limit:
            self._ended_runs = {key: end for key, end in self._ended_runs.items() if end >= horizon_ms}
            # Next time once they have doubled: a cluster ending more runs within the horizon
            # than the floor (thousands a day) would otherwise copy them all at every deadline.
            self._ended_limit = max(_ENDED_RUNS_FLOOR, 2 * len(self._ended_runs))

    def start(self, event: JobEvent) -> JobRun | None:
        """A RUNNING event: return the new run, or None for a redelivered start."""
        key = (event.cluster, event.job_id)
        start = event.start_ms if event.start_ms is not None else event.ts_ms
        if key in self._runs or (event.cluster, event.job_id, start) in self._ended_runs:
            return None  # a redelivered start
        run = self._runs[key] = self._new_run(event, start)
        self._runs_of_job.setdefault(run.job_id, []).append(run)
        for node in event.nodes:
            self._jobs_on_node.setdefault(node, set()).add(event.job_id)
        return run

    def end(self, event: JobEvent) -> RunEnd | None:
        """A terminal event: return the run it ends, or None for a redelivered end.

        A run that may have failed for hardware is held until :meth:`decide_due` attributes it.
        A run that ends without a start seen is taken to have started as the event says.
        """
        run = self._runs.pop((event.cluster, event.job_id), None)
        if run is not None:
            same_id = [r for r in self._runs_of_job.get(run.job_id, ()) if r is not run]
            if same_id:
                self._runs_of_job[run.job_id] = same_id
            else:
                self._runs_of_job.pop(run.job_id, None)
        else:
            run = self._new_run(event, event.start_ms if event.start_ms is not None else event.ts_ms)
        end = event.end_ms if event.end_ms is not None else event.ts_ms
        run_key = (run.cluster, run.job_id, run.start_ms)
        if run_key in self._ended_runs:
            return None  # a redelivered end
        self._ended_runs[run_key] = end
        for node in run.nodes:
            jobs = self._jobs_on_node.get(node)
            if jobs is not None:
                jobs.discard(run.job_id)
                if not jobs:
                    del self._jobs_on_node[node]
        if not event.state.may_be_hardware_failure:
            return RunEnd(run, end, None)
        self._sequence += 1
        decide_at = end + self.attribution_after_ms
        heapq.heappush(self._pending, (decide_at, self._sequence, run, event))
        return RunEnd(run, end, decide_at)

    def decide_due(self, before_ms: int) -> list[Decided]:
        """Attribute the failed runs whose decision time is before ``before_ms``, in that order."""
        decided = []
        while self._pending and self._pending[0][0] < before_ms:
            _, _, run, event = heapq.heappop(self._pending)
            decided.append(self._decide(run, event))
        return decided

    def decide_all(self) -> list[Decided]:
        """End of input: attribute every pending failed run, in decision-time order."""
        decided = []
        while self._pending:
            _, _, run, event = heapq.heappop(self._pending)
            decided.append(self._decide(run, event))
        return decided

    def _new_run(self, event: JobEvent, start_ms: int) -> JobRun:
        gpus = event.gpus or max(len(event.nodes), 1) * self.gpus_per_node
        return JobRun(
            event.cluster,
            event.job_id,
            start_ms,
            event.nodes,
            gpus,
            user=event.user,
            name=event.name,
            partition=event.partition,
        )

    def _decide(self, run: JobRun, event: JobEvent) -> Decided:
        end = event.end_ms if event.end_ms is not None else event.ts_ms
        evidence = self._evidence.between(
            run.nodes, end - self.attribution_before_ms, end + self.attribution_after_ms
        )
        return Decided(run, event.state, end, tuple(evidence))
