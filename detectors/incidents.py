"""Incident lifecycle and deterministic incident ids.

Where an incident id is made: :func:`incident_id`. The same evidence gives the same id in a
live run and in a replay, because the id hashes only event-time facts: the kind, where, and the
event time of the first evidence.

Lifecycle: the first evidence of a kind on a GPU (or node) *opens* an incident; further evidence
within the quiet period *updates* it (a storm of XIDs is one incident with a growing count); when
the event-time watermark passes ``last evidence + quiet period`` it is *resolved*, and evidence
after that opens a new incident.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from detectors.jobs import JobContext
from schemas.outputs import Incident, IncidentKind, IncidentStatus, Severity
from schemas.timeutil import format_ts

__all__ = [
    "ACTION_MARK",
    "EvidenceItem",
    "Finding",
    "IncidentTracker",
    "incident_id",
    "summary_without_action",
]

#: What separates an incident summary from its suggested action (the action is also its own field).
ACTION_MARK = " Action: "


def summary_without_action(summary: str) -> str:
    """An incident summary without its trailing ``Action: ...``, for views that show the action apart.

    >>> summary_without_action("[warn] Lemon node on node7; open. Action: drain the node")
    '[warn] Lemon node on node7; open.'
    """
    return summary.split(ACTION_MARK, 1)[0]


#: Evidence lists are capped so that a storm cannot grow one incident without bound.
MAX_SAMPLES = 10
MAX_JOBS = 50

#: An open incident's identity: cluster, kind, node and GPU ("" for a whole node).
_Key = tuple[str, IncidentKind, str, str]


def incident_id(cluster: str, kind: IncidentKind, subject: str, first_evidence_ms: int) -> str:
    """Deterministic incident id: a hash of what and where, and when the evidence began.

    >>> incident_id("rsc1", IncidentKind.GPU_BUS, "node7/0000:07:00", 1705312800000)
    'inc-aecf6ad97a0b11db3be4'
    """
    digest = hashlib.sha1(f"{cluster}|{kind}|{subject}|{first_evidence_ms}".encode()).hexdigest()
    return f"inc-{digest[:20]}"


@dataclass(frozen=True, slots=True)
class EvidenceItem:
    """One piece of evidence: an XID line, a counter delta, the jobs running where it happened
    (their ids, and their context: owner, name, size, when the scheduler said)."""

    ts_ms: int
    xid: int | None = None
    message: str = ""
    counter_deltas: tuple[tuple[str, int], ...] = ()
    jobs: tuple[str, ...] = ()
    job_context: tuple[JobContext, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """What a detector found, with one piece of evidence: the input of :meth:`IncidentTracker.observe`.

    Attributes
    ----------
    cluster, node, gpu
        Where; ``gpu`` is empty for a finding about a whole node. Together with ``kind`` they
        name the incident the evidence joins.
    kind
        What went wrong.
    severity
        How urgent; an incident takes the highest severity of its findings.
    detector
        Which detector found it (stored with the incident).
    score
        How sure or how surprising; an incident keeps the highest score of its findings.
    action, title
        What an operator should do, and a one-line description for the summary.
    evidence
        The evidence itself.
    """

    cluster: str
    kind: IncidentKind
    node: str
    gpu: str = ""
    severity: Severity
    detector: str
    score: float
    action: str
    title: str
    evidence: EvidenceItem
    owner: str = ""


@dataclass(slots=True)
class _Open:
    incident_id: str
    kind: IncidentKind
    severity: Severity
    cluster: str
    node: str
    gpu: str
    first_ms: int
    last_ms: int
    detected_ms: int
    detector: str
    score: float
    action: str
    title: str
    evidence_count: int = 0
    xid_counts: dict[int, int] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    counter_deltas: dict[str, int] = field(default_factory=dict)
    jobs: set[str] = field(default_factory=set)
    job_context: dict[str, JobContext] = field(default_factory=dict)
    owner: str = ""
    nodes: set[str] = field(default_factory=set)
    # The job context as the evidence shows it, made again only when a job is added: an owner's
    # incident holds up to MAX_JOBS and gets a version at each failure of a sweep. Not pickled.
    context_dicts: list[dict[str, Any]] | None = None

    def add(self, item: EvidenceItem) -> None:
        self.evidence_count += 1
        self.first_ms = min(self.first_ms, item.ts_ms)
        self.last_ms = max(self.last_ms, item.ts_ms)
        if item.xid is not None:
            self.xid_counts[item.xid] = self.xid_counts.get(item.xid, 0) + 1
        if len(self.samples) < MAX_SAMPLES:
            sample: dict[str, Any] = {"ts": format_ts(item.ts_ms)}
            if item.xid is not None:
                sample["xid"] = item.xid
            if item.message:
                sample["message"] = item.message
            if item.counter_deltas:
                sample["counter_deltas"] = dict(item.counter_deltas)
            self.samples.append(sample)
        for name, delta in item.counter_deltas:
            self.counter_deltas[name] = self.counter_deltas.get(name, 0) + delta
        for job in item.jobs:
            if len(self.jobs) < MAX_JOBS:
                self.jobs.add(job)
        for context in item.job_context:
            if len(self.job_context) < MAX_JOBS and context.job_id not in self.job_context:
                self.job_context[context.job_id] = context
                self.context_dicts = None

    def __getstate__(self) -> dict[str, object]:
        """Pickle the incident without what is made again from it (:attr:`context_dicts`)."""
        return {name: getattr(self, name) for name in self.__slots__ if name != "context_dicts"}

    def __setstate__(self, state: object) -> None:
        """Unpickle, also a checkpoint from before the job context: the new fields start empty."""
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = state[1]
        values = state if isinstance(state, dict) else {}
        defaults: dict[str, object] = {"job_context": {}, "owner": "", "nodes": set()}
        for name in self.__slots__:
            object.__setattr__(self, name, values.get(name, defaults.get(name)))

    def snapshot(self, status: IncidentStatus) -> Incident:
        evidence: dict[str, Any] = {"samples": list(self.samples)}
        if self.xid_counts:
            evidence["xid_counts"] = {str(code): n for code, n in sorted(self.xid_counts.items())}
        if self.counter_deltas:
            evidence["counter_deltas"] = dict(sorted(self.counter_deltas.items()))
        if self.jobs:
            evidence["jobs"] = sorted(self.jobs)
        if self.job_context:
            if self.context_dicts is None:
                self.context_dicts = [c.to_dict() for _, c in sorted(self.job_context.items())]
            evidence["job_context"] = list(self.context_dicts)
        if self.owner:
            evidence["owner"] = self.owner
            evidence["nodes"] = sorted(self.nodes)
            where = f"{len(self.nodes)} node(s)"
        else:
            where = f"{self.node} GPU {self.gpu}" if self.gpu else self.node
        codes = ", ".join(f"XID {code} x{n}" for code, n in sorted(self.xid_counts.items()))
        detail = f" ({codes})" if codes else ""
        summary = (
            f"[{self.severity.value}] {self.title} on {where}{detail}, {self.evidence_count} evidence since "
            f"{format_ts(self.first_ms)}; {status.value}.{ACTION_MARK}{self.action}"
        )
        resolved = status is IncidentStatus.RESOLVED
        return Incident(
            incident_id=self.incident_id,
            kind=self.kind,
            severity=self.severity,
            status=status,
            cluster=self.cluster,
            node=self.node,
            gpu=self.gpu,
            first_evidence_ms=self.first_ms,
            last_evidence_ms=self.last_ms,
            detected_ms=self.detected_ms,
            detector=self.detector,
            score=self.score,
            action=self.action,
            summary=summary,
            evidence=evidence,
            evidence_count=self.evidence_count,
            version=self.evidence_count * 2 + int(resolved),
        )


class IncidentTracker:
    """Open incidents keyed by ``(cluster, kind, node, gpu)``, with event-time resolution.

    Parameters
    ----------
    quiet_period_ms
        An incident with no new evidence for this long (event time) is resolved.
    quiet_period_by_kind
        Longer (or shorter) quiet periods for kinds whose evidence comes slowly, such as a
        degradation seen once per ECC scrape or a lemon verdict re-evaluated daily.

    Examples
    --------
    >>> from dataclasses import replace
    >>> tracker = IncidentTracker(quiet_period_ms=3_600_000)
    >>> off_the_bus = Finding(
    ...     cluster="c", kind=IncidentKind.GPU_BUS, node="n1", gpu="0000:07:00", severity=Severity.CRITICAL,
    ...     detector="xid_classifier", score=1.0, action="reboot", title="GPU fell off the bus",
    ...     evidence=EvidenceItem(0, xid=79),
    ... )
    >>> [first] = tracker.observe(off_the_bus)
    >>> [again] = tracker.observe(replace(off_the_bus, evidence=EvidenceItem(60_000, xid=79)))
    >>> first.incident_id == again.incident_id, again.status.value, again.evidence_count
    (True, 'updated', 2)
    >>> [i.status.value for i in tracker.resolve_idle(watermark_ms=4_000_000)]
    ['resolved']
    """

    def __init__(
        self, quiet_period_ms: int, quiet_period_by_kind: Mapping[IncidentKind, int] | None = None
    ) -> None:
        self.quiet_period_ms = quiet_period_ms
        self.quiet_period_by_kind = dict(quiet_period_by_kind or {})
        self._open: dict[_Key, _Open] = {}
        # (resolve-at, key) entries; stale ones (incident updated since) are skipped when popped.
        self._deadlines: list[tuple[int, _Key]] = []

    @property
    def next_deadline_ms(self) -> int | None:
        """Event time at which the earliest open incident may resolve."""
        return self._deadlines[0][0] if self._deadlines else None

    def observe(self, finding: Finding) -> list[Incident]:
        """Add a finding's evidence; return the incident's new version (opened or updated).

        When the evidence comes after the quiet period of an incident still open, the list starts
        with that incident's resolution, followed by the new incident.
        """
        key = (
            (finding.cluster, finding.kind, f"user/{finding.owner}", "")
            if finding.owner
            else (finding.cluster, finding.kind, finding.node, finding.gpu)
        )
        ts_ms = finding.evidence.ts_ms
        quiet_ms = self._quiet(finding.kind)
        current = self._open.get(key)
        stale: list[Incident] = []
        if current is not None and ts_ms > current.last_ms + quiet_ms:
            # Quiet for longer than the quiet period: the old incident is over whether or not the
            # watermark has said so yet, so the outcome never depends on how far it had advanced.
            del self._open[key]
            stale.append(current.snapshot(IncidentStatus.RESOLVED))
            current = None
        if current is None:
            subject = key[2] + (f"/{finding.gpu}" if finding.gpu else "")
            current = _Open(
                incident_id=incident_id(finding.cluster, finding.kind, subject, ts_ms),
                kind=finding.kind,
                severity=finding.severity,
                cluster=finding.cluster,
                node=finding.node,
                gpu=finding.gpu,
                first_ms=ts_ms,
                last_ms=ts_ms,
                detected_ms=ts_ms,
                detector=finding.detector,
                score=finding.score,
                action=finding.action,
                title=finding.title,
                owner=finding.owner,
            )
            self._open[key] = current
            status = IncidentStatus.OPEN
        else:
            status = IncidentStatus.UPDATED
            if finding.severity.rank > current.severity.rank:
                current.severity, current.action, current.title = (
                    finding.severity,
                    finding.action,
                    finding.title,
                )
            current.score = max(current.score, finding.score)
        previous_last = current.last_ms
        if finding.owner and finding.node:
            current.nodes.add(finding.node)
        current.add(finding.evidence)
        if status is IncidentStatus.OPEN or current.last_ms > previous_last:
            heapq.heappush(self._deadlines, (current.last_ms + quiet_ms, key))
        return [*stale, current.snapshot(status)]

    def _quiet(self, kind: IncidentKind) -> int:
        return self.quiet_period_by_kind.get(kind, self.quiet_period_ms)

    def resolve_idle(self, watermark_ms: int) -> list[Incident]:
        """Resolve every incident whose quiet period ended before ``watermark_ms``."""
        resolved: list[Incident] = []
        while self._deadlines and self._deadlines[0][0] < watermark_ms:
            deadline, key = heapq.heappop(self._deadlines)
            current = self._open.get(key)
            if current is None or current.last_ms + self._quiet(key[1]) != deadline:
                continue
            del self._open[key]
            resolved.append(current.snapshot(IncidentStatus.RESOLVED))
        return resolved
