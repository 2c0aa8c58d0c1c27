"""What ``faultstream remediate`` may do with an incident: the allow-list, the breaker, idempotence.

Pure decisions, no I/O: :class:`RemediationPolicy` is the configuration, :class:`RemediationState`
what earlier decisions left (rebuilt from the ``remediations`` audit table at a start), and
:func:`decide` turns one incident message plus what Slurm says of its node into a
:class:`Decision`. The service (:mod:`stream.slurm.remediate`) carries decisions out and audits each.

The rules, in order:

* An incident of a kind off the allow-list is never acted on; application-class and job-owner
  kinds cannot be put on it (:data:`NEVER_DRAINED`). Besides a lemon verdict, only a ``critical``
  incident drains (an incident raised to critical by a later version drains then).
* One drain per incident: a later version, a redelivery or a restart repeats nothing.
* A node already drained or down (by a person or by faultstream) is left as it is.
* The breaker: a drain that would make more than ``max_nodes`` nodes (or ``max_fraction`` of the
  fleet) drained by faultstream at once, or more than ``max_per_hour`` drains in the last hour,
  trips it instead; while it is open nothing is drained, until a person resets it.
* Resume (only when enabled): a node faultstream drained for an incident that is now resolved,
  whose Slurm reason is still faultstream's for that incident (a person who drained it again or
  changed the reason owns it).
* Dry run (the default) decides exactly the same and counts its would-be drains in the breaker,
  but changes nothing in Slurm.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.outputs import IncidentKind

__all__ = [
    "DEFAULT_KINDS",
    "NEVER_DRAINED",
    "Decision",
    "NodeView",
    "RemediationPolicy",
    "RemediationState",
    "decide",
    "drain_reason",
    "needs_node",
]

#: Kinds drained by default: hardware a node cannot run well with, and lemon verdicts.
DEFAULT_KINDS: Final = frozenset(
    {
        IncidentKind.GPU_MEMORY,
        IncidentKind.GPU_ROW_REMAP,
        IncidentKind.GPU_NVLINK,
        IncidentKind.GPU_BUS,
        IncidentKind.GPU_RECOVERY,
        IncidentKind.GPU_THERMAL_POWER,
        IncidentKind.NVSWITCH_FATAL,
        IncidentKind.LEMON_NODE,
    }
)
#: Kinds never drained, whatever the allow-list says: an application's own errors, and incidents
#: addressed to a job's owner, say nothing against the node.
NEVER_DRAINED: Final = frozenset(
    {IncidentKind.GPU_APPLICATION, IncidentKind.JOB_APP_ERRORS, IncidentKind.JOB_XID_STORM}
)
#: The prefix of every Slurm reason faultstream writes; a reason without it is a person's.
REASON_PREFIX: Final = "faultstream "
_HOUR_MS: Final = 3_600_000


def drain_reason(incident_id: str, kind: str) -> str:
    """The Slurm reason of a drain: it names the incident, so ``sinfo -R`` leads to it.

    >>> drain_reason("inc-1a2b", "gpu_bus")
    'faultstream inc-1a2b: gpu_bus'
    """
    return f"{REASON_PREFIX}{incident_id}: {kind}"


@dataclass(frozen=True)
class RemediationPolicy:
    """What remediation may do (settings ``FAULTSTREAM_REMEDIATE_*``)."""

    kinds: frozenset[str] = DEFAULT_KINDS
    execute: bool = False
    max_nodes: int = 2
    max_fraction: float = 0.02
    max_per_hour: int = 4
    resume: bool = False

    def __post_init__(self) -> None:
        forbidden = sorted(set(self.kinds) & NEVER_DRAINED)
        if forbidden:
            raise ValueError(
                f"{', '.join(forbidden)} cannot be remediated: an application's errors and a job owner's "
                "incidents say nothing against the node"
            )
        unknown = sorted(set(self.kinds) - {kind.value for kind in IncidentKind})
        if unknown:
            raise ValueError(f"unknown incident kind(s) {', '.join(unknown)}")
        if self.max_nodes < 1 or self.max_per_hour < 1 or not 0 < self.max_fraction <= 1:
            raise ValueError("max_nodes and max_per_hour must be >= 1, max_fraction in (0, 1]")


@dataclass(frozen=True)
class NodeView:
    """What Slurm says of a node now: known at all, drained or down, and why."""

    known: bool
    drained: bool = False
    reason: str = ""

    @property
    def drained_by_faultstream(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)


@dataclass
class RemediationState:
    """What earlier decisions left: the incidents acted on, faultstream's drains, the breaker."""

    #: Incident ids whose drain was decided (drained, would drain, found drained): never again.
    acted: set[str] = field(default_factory=set)
    #: (incident id, reason) of skips already audited: a later version skipped alike is not.
    skips_said: set[tuple[str, str]] = field(default_factory=set)
    #: Node -> incident id it was drained (or would be, in a dry run) for, until resumed.
    drained: dict[str, str] = field(default_factory=dict)
    #: Wall-clock times (ms) of the drains of the last hour, oldest first.
    recent_drains: deque[int] = field(default_factory=deque)
    breaker_open: bool = False
    breaker_reason: str = ""


@dataclass(frozen=True)
class Decision:
    """One decision: what to do with a node and why; ``action`` is ``drain``, ``resume``, ``trip``
    (the breaker opens) or ``skip``; ``audit`` False for a skip already audited once."""

    action: str
    reason: str
    incident_id: str = ""
    version: int = 0
    kind: str = ""
    severity: str = ""
    cluster: str = ""
    node: str = ""
    audit: bool = True


def _text(incident: dict[str, Any], name: str) -> str:
    value = incident.get(name)
    return value if isinstance(value, str) else ""


def decide(
    incident: dict[str, Any],
    node: NodeView | None,
    fleet_size: int,
    now_ms: int,
    policy: RemediationPolicy,
    state: RemediationState,
) -> Decision:
    """The decision for one incident message; ``node`` is Slurm's view of its node (None when the
    incident is skipped before Slurm need be asked: :func:`needs_node`).

    ``state`` is not changed: the service applies a decision once it is carried out
    (:mod:`stream.slurm.remediate`), so a failed drain leaves no trace but its audit row.
    """
    incident_id = _text(incident, "incident_id")

    def skip(reason: str) -> Decision:
        return _decision("skip", reason, incident, audit=(incident_id, reason) not in state.skips_said)

    early = _early_skip(incident, policy, state)
    if early is not None:
        return skip(early) if early else _decision("skip", "", incident, audit=False)
    assert node is not None, "decide() needs the node's view past the early checks"
    name = _text(incident, "node")
    if _text(incident, "status") == "resolved":
        if not node.drained_by_faultstream or not node.reason.startswith(drain_reason(incident_id, "")):
            return skip("resolved; the node's drain is not faultstream's for this incident (left as it is)")
        return _decision("resume", "its incident resolved", incident)
    if not node.known:
        return skip(f"node {name!r} is not a node of this Slurm")
    if node.drained:
        owner = "faultstream" if node.drained_by_faultstream else "a person or Slurm"
        return _decision("skip", f"already drained or down ({owner}: {node.reason or 'no reason'})", incident)
    if state.breaker_open:
        return skip(f"breaker open ({state.breaker_reason}); a person must reset it")
    drained_now = len(state.drained) + 1
    recent = sum(1 for at in state.recent_drains if at > now_ms - _HOUR_MS) + 1
    if drained_now > policy.max_nodes:
        return _decision(
            "trip",
            f"{drained_now} nodes drained by faultstream at once; the limit is {policy.max_nodes}",
            incident,
        )
    if fleet_size > 0 and drained_now / fleet_size > policy.max_fraction:
        return _decision(
            "trip",
            f"{drained_now} of {fleet_size} nodes ({drained_now / fleet_size:.1%}) drained by faultstream; "
            f"the limit is {policy.max_fraction:.1%}",
            incident,
        )
    if recent > policy.max_per_hour:
        return _decision(
            "trip", f"{recent} drains in the last hour; the limit is {policy.max_per_hour}", incident
        )
    return _decision(
        "drain", f"{_text(incident, 'severity') or 'an'} {_text(incident, 'kind')} incident", incident
    )


def _decision(action: str, reason: str, incident: dict[str, Any], *, audit: bool = True) -> Decision:
    version = incident.get("version")
    return Decision(
        action,
        reason,
        incident_id=_text(incident, "incident_id"),
        version=version if isinstance(version, int) and not isinstance(version, bool) else 0,
        kind=_text(incident, "kind"),
        severity=_text(incident, "severity"),
        cluster=_text(incident, "cluster"),
        node=_text(incident, "node"),
        audit=audit,
    )


def needs_node(incident: dict[str, Any], policy: RemediationPolicy, state: RemediationState) -> bool:
    """Whether :func:`decide` must know the node's state (else it decides without asking Slurm)."""
    return _early_skip(incident, policy, state) is None


def _early_skip(incident: dict[str, Any], policy: RemediationPolicy, state: RemediationState) -> str | None:
    """The reason to skip an incident without asking Slurm, "" to pass it over silently, None to go on."""
    incident_id = _text(incident, "incident_id")
    kind = _text(incident, "kind")
    if not incident_id or not kind:
        return "not an incident message (no incident_id or kind)"
    if _text(incident, "detector") == "remediate":
        return ""  # remediation's own notices on the topic
    resolved = _text(incident, "status") == "resolved"
    if resolved:
        if not policy.resume or state.drained.get(_text(incident, "node")) != incident_id:
            return ""
        return None
    if incident_id in state.acted:
        return ""  # a later version, or a repeat: one drain an incident
    if kind in NEVER_DRAINED or kind not in policy.kinds:
        return f"kind {kind} is not on the allow-list"
    if kind != IncidentKind.LEMON_NODE and _text(incident, "severity") != "critical":
        return f"severity {_text(incident, 'severity') or 'none'}: only critical incidents drain"
    if not _text(incident, "node"):
        return "the incident names no node"
    return None
