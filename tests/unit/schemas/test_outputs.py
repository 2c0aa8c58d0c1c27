"""Output records: the incident kinds are a stored contract, and a kind serializes as its value."""

import json

import orjson

from schemas.outputs import Incident, IncidentKind, IncidentStatus, Severity

# Stored in the ``kind`` column and queried by the dashboards and reports: renaming one is a
# migration, not a refactoring.
STORED_KINDS = {
    "gpu_application", "gpu_memory", "gpu_row_remap", "gpu_nvlink", "gpu_bus", "gpu_firmware",
    "gpu_engine", "gpu_driver", "gpu_thermal_power", "gpu_recovery", "xid_unknown", "nvswitch_fatal",
    "nvswitch_nonfatal", "xid_storm", "nvlink_flapping", "ecc_trend", "lemon_node", "job_hw_failure",
    "job_app_errors", "job_xid_storm",
}  # fmt: skip


def test_incident_kind_values_are_the_stored_contract():
    assert {kind.value for kind in IncidentKind} == STORED_KINDS


def incident(kind):
    return Incident(
        incident_id="inc-1", kind=kind, severity=Severity.WARN, status=IncidentStatus.OPEN, cluster="c",
        node="n1", gpu="", first_evidence_ms=0, last_evidence_ms=0, detected_ms=0, detector="test",
        score=1.0, action="none", summary="s", evidence={}, evidence_count=1, version=2,
    )  # fmt: skip


def test_an_incident_kind_is_its_value_to_comparisons_and_serializers():
    document = incident(IncidentKind.XID_STORM).to_dict()
    assert type(document["kind"]) is str
    assert document["kind"] == "xid_storm" == IncidentKind.XID_STORM
    assert f"{IncidentKind.XID_STORM}" == "xid_storm"
    assert json.loads(json.dumps({"kind": IncidentKind.XID_STORM})) == {"kind": "xid_storm"}
    assert orjson.loads(orjson.dumps({"kind": IncidentKind.XID_STORM})) == {"kind": "xid_storm"}
    assert {"xid_storm": 1}[IncidentKind.XID_STORM] == 1  # same hash as the plain string
