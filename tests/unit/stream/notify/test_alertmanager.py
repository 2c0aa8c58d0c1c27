"""The incident -> alert mapping and the notifier's state (no Kafka, no Alertmanager here; the e2e
test runs the real ones)."""

from __future__ import annotations

import json
from typing import Any

from stream.notify.alertmanager import ALERTNAME, AlertState, to_alert

NOW = 1_704_276_060_000  # 2024-01-03T10:01:00Z


def incident(
    version: int, *, severity: str = "critical", status: str = "open", gpu: str = "0000:07:00"
) -> dict:
    return {"incident_id": "i1", "kind": "gpu_bus", "severity": severity, "status": status, "cluster": "c",
            "node": "n7", "gpu": gpu, "first_evidence": "2024-01-03T10:00:00.000Z", "summary": "XID 79",
            "action": "drain", "evidence_count": version // 2, "version": version}  # fmt: skip


def message(item: dict[str, Any]) -> bytes:
    return json.dumps(item).encode()


def test_labels_identify_and_route_annotations_carry_the_state() -> None:
    alert = to_alert(incident(4), NOW, 60_000)
    assert alert["labels"] == {"alertname": ALERTNAME, "incident_id": "i1", "severity": "critical",
                               "kind": "gpu_bus", "cluster": "c", "node": "n7", "gpu": "0000:07:00"}  # fmt: skip
    assert alert["annotations"]["evidence_count"] == "2" and alert["annotations"]["action"] == "drain"
    assert (alert["startsAt"], alert["endsAt"]) == ("2024-01-03T10:00:00.000Z", "2024-01-03T10:02:00.000Z")


def test_a_resolved_incident_ends_now_and_a_node_wide_one_has_no_gpu_label() -> None:
    alert = to_alert(incident(5, status="resolved", gpu=""), NOW, 60_000)
    assert alert["endsAt"] == "2024-01-03T10:01:00.000Z"
    assert "gpu" not in alert["labels"]  # Alertmanager drops empty labels; keep the set stable


def test_repeats_and_older_versions_are_not_news() -> None:
    state = AlertState()
    assert state.apply(message(incident(2))) is not None
    assert state.apply(message(incident(2))) is None
    assert state.apply(message(incident(4))) is not None
    assert state.apply(message(incident(2))) is None
    assert state.apply(b"not json") is None and state.apply(None) is None
    assert list(state.open) == ["i1"]
    assert state.apply(message(incident(5, status="resolved"))) is not None
    assert state.open == {}


def test_a_raised_severity_resolves_the_alert_under_the_old_labels() -> None:
    state = AlertState()
    [first] = state.alerts([incident(2, severity="warn")], NOW, 60_000)
    old, new = state.alerts([incident(4, severity="critical")], NOW, 60_000)
    assert old["labels"] == first["labels"] and old["endsAt"] == "2024-01-03T10:01:00.000Z"
    assert new["labels"]["severity"] == "critical" and new["endsAt"] > old["endsAt"]
    [again] = state.alerts([incident(6, severity="critical")], NOW, 60_000)  # same labels: one alert
    assert again["labels"] == new["labels"]


def test_an_incident_addressed_to_a_user_carries_an_owner_label_to_route_on() -> None:
    crash_loop = {
        **incident(4, severity="warn", gpu=""),
        "kind": "job_app_errors",
        "evidence": {"owner": "dbg"},
    }
    assert to_alert(crash_loop, NOW, 60_000)["labels"]["owner"] == "dbg"
    assert "owner" not in to_alert(incident(4), NOW, 60_000)["labels"]
