"""Remediation's decisions: the allow-list, one drain an incident, the breaker, resume, bad messages."""

from __future__ import annotations

from typing import Any

import pytest

from stream.slurm.nodes import parse_node_line
from stream.slurm.policy import (
    Decision,
    NodeView,
    RemediationPolicy,
    RemediationState,
    decide,
    drain_reason,
    needs_node,
)

NOW = 1_741_082_400_000
IDLE = NodeView(known=True)


def incident(**fields: Any) -> dict[str, Any]:
    base = {
        "incident_id": "inc-1",
        "version": 1,
        "kind": "gpu_bus",
        "severity": "critical",
        "status": "open",
        "cluster": "c",
        "node": "gpu-node-1",
        "detector": "xid_rules",
    }
    return {**base, **fields}


def run(
    message: dict[str, Any],
    node: NodeView | None = IDLE,
    *,
    policy: RemediationPolicy | None = None,
    state: RemediationState | None = None,
    fleet: int = 100,
) -> Decision:
    policy = policy or RemediationPolicy()
    state = state or RemediationState()
    return decide(message, node if needs_node(message, policy, state) else None, fleet, NOW, policy, state)


def test_a_critical_hardware_incident_drains_its_node() -> None:
    decision = run(incident())
    assert (decision.action, decision.node, decision.incident_id) == ("drain", "gpu-node-1", "inc-1")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"kind": "gpu_application"}, "kind gpu_application is not on the allow-list"),
        ({"kind": "job_app_errors", "severity": "critical"}, "kind job_app_errors is not on the allow-list"),
        ({"kind": "xid_storm"}, "kind xid_storm is not on the allow-list"),
        ({"severity": "warn"}, "severity warn: only critical incidents drain"),
        ({"node": ""}, "the incident names no node"),
        ({"incident_id": None}, "not an incident message"),
        ({"kind": 7}, "not an incident message"),
    ],
)
def test_what_is_not_drained_says_why_without_asking_slurm(fields: dict[str, Any], reason: str) -> None:
    message = incident(**fields)
    assert not needs_node(message, RemediationPolicy(), RemediationState())
    decision = run(message)
    assert decision.action == "skip" and reason in decision.reason and decision.audit


def test_a_lemon_verdict_drains_at_warn_severity() -> None:
    assert run(incident(kind="lemon_node", severity="warn")).action == "drain"


def test_application_and_owner_kinds_cannot_be_put_on_the_allow_list() -> None:
    with pytest.raises(ValueError, match="job_xid_storm cannot be remediated"):
        RemediationPolicy(kinds=frozenset({"gpu_bus", "job_xid_storm"}))
    with pytest.raises(ValueError, match="unknown incident kind"):
        RemediationPolicy(kinds=frozenset({"gpu_bsu"}))


def test_one_drain_an_incident_and_a_skip_is_audited_once() -> None:
    state = RemediationState(acted={"inc-1"})
    later = run(incident(version=7), state=state)
    assert later.action == "skip" and not later.audit  # a later version: nothing, not even a row
    state = RemediationState(skips_said={("inc-2", "severity warn: only critical incidents drain")})
    again = run(incident(incident_id="inc-2", severity="warn"), state=state)
    assert again.action == "skip" and not again.audit
    # ... but raised to critical by a later version, it drains.
    assert run(incident(incident_id="inc-2", version=3), state=state).action == "drain"


def test_a_node_already_drained_or_unknown_is_left_as_it_is() -> None:
    person = parse_node_line("NodeName=gpu-node-1 State=IDLE+DRAIN Reason=bad fan [root@2025-03-04T10:00:00]")
    decision = run(incident(), person)
    assert decision.action == "skip" and "a person or Slurm: bad fan" in decision.reason
    down = parse_node_line(
        "NodeName=gpu-node-1 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2025-03-04T10:00:00]"
    )
    assert run(incident(), down).action == "skip"
    assert "is not a node of this Slurm" in run(incident(), NodeView(known=False)).reason


def test_the_breaker_trips_at_each_limit_and_then_holds() -> None:
    policy = RemediationPolicy(max_nodes=2, max_fraction=0.5, max_per_hour=3)
    two_drained = RemediationState(drained={"a": "i1", "b": "i2"})
    tripped = run(incident(), policy=policy, state=two_drained)
    assert (
        tripped.action == "trip"
        and "3 nodes drained by faultstream at once; the limit is 2" in tripped.reason
    )
    small_fleet = RemediationState(drained={"a": "i1"})
    tripped = run(incident(), policy=policy, state=small_fleet, fleet=3)
    assert tripped.action == "trip" and "2 of 3 nodes (66.7%)" in tripped.reason
    from collections import deque

    busy_hour = RemediationState(recent_drains=deque([NOW - 3_000_000, NOW - 2_000_000, NOW - 1_000]))
    tripped = run(incident(), policy=policy, state=busy_hour)
    assert tripped.action == "trip" and "4 drains in the last hour; the limit is 3" in tripped.reason
    an_hour_ago = RemediationState(recent_drains=deque([NOW - 3_700_000] * 5))
    assert run(incident(), policy=policy, state=an_hour_ago).action == "drain"
    open_breaker = RemediationState(breaker_open=True, breaker_reason="3 nodes drained")
    held = run(incident(), policy=policy, state=open_breaker)
    assert held.action == "skip" and "breaker open (3 nodes drained); a person must reset it" in held.reason


def test_resume_only_when_enabled_and_only_faultstreams_own_drain_of_that_incident() -> None:
    ours = parse_node_line(
        f"NodeName=gpu-node-1 State=IDLE+DRAIN Reason={drain_reason('inc-1', 'gpu_bus')} [root@x@y]"
    )
    resolved = incident(status="resolved", version=4)
    drained_for_it = RemediationState(acted={"inc-1"}, drained={"gpu-node-1": "inc-1"})
    off = run(resolved, ours, state=drained_for_it)
    assert off.action == "skip" and not off.audit  # resume disabled: silently nothing
    policy = RemediationPolicy(resume=True)
    assert run(resolved, ours, policy=policy, state=drained_for_it).action == "resume"
    relabelled = parse_node_line(
        "NodeName=gpu-node-1 State=IDLE+DRAIN Reason=RMA ticket 42 [ana@2025-03-04T11:00:00]"
    )
    kept = run(resolved, relabelled, policy=policy, state=drained_for_it)
    assert kept.action == "skip" and "not faultstream's for this incident" in kept.reason
    other_incident = RemediationState(acted={"inc-1"}, drained={"gpu-node-1": "inc-9"})
    assert run(resolved, ours, policy=policy, state=other_incident).action == "skip"


def test_remediations_own_notices_are_passed_over() -> None:
    notice = incident(kind="remediation_breaker", detector="remediate", node="")
    decision = run(notice)
    assert decision.action == "skip" and not decision.audit


def test_scontrol_lines_as_slurm_writes_them() -> None:
    view = parse_node_line(
        "NodeName=gpu-node-2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=1 State=MIXED+DRAIN "
        "Partitions=gpu Reason=faultstream inc-7: gpu_memory [root@2025-03-04T10:00:01]"
    )
    assert view == NodeView(known=True, drained=True, reason="faultstream inc-7: gpu_memory")
    assert parse_node_line("NodeName=n State=IDLE Reason=(null)").reason == ""
    assert parse_node_line("NodeName=n State=ALLOCATED*").drained is False
