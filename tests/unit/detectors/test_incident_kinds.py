"""Every incident kind a detector can produce is an IncidentKind member, so none slips through."""

import pytest

from detectors.core import CoreConfig, DetectionCore
from detectors.ecc_rules import ecc_step
from detectors.sxid_catalog import SXID_CATALOG, classify_sxid
from detectors.xid_catalog import CATALOG, XidCategory, classify_xid
from schemas.outputs import IncidentKind, Severity
from schemas.records import XidEvent

T0 = 1_704_067_200_000


@pytest.mark.parametrize("category", list(XidCategory))
def test_every_xid_family_has_its_incident_kind(category):
    kind = category.incident_kind  # raises ValueError for a family without its member
    assert type(kind) is IncidentKind
    expected = "xid_unknown" if category is XidCategory.UNKNOWN else f"gpu_{category.value}"
    assert kind == expected


@pytest.mark.parametrize("code", [*sorted(CATALOG), 9999])
def test_the_core_emits_an_incident_kind_member_for_every_xid_that_opens_an_incident(code):
    core = DetectionCore(CoreConfig())
    core.process(XidEvent(ts_ms=T0, cluster="c", node="n1", xid=code, pci_bus_id="0000:07:00"))
    kinds = {incident.kind for incident in core.drain().incidents}
    info = classify_xid(code)
    if info.category is XidCategory.UNKNOWN:
        assert kinds == {IncidentKind.XID_UNKNOWN}  # flagged, at info level
    elif info.severity is Severity.INFO:
        assert kinds == set()
    else:
        assert kinds == {info.category.incident_kind}
    assert all(type(kind) is IncidentKind for kind in kinds)


@pytest.mark.parametrize("code", [*sorted(SXID_CATALOG), 99999])
@pytest.mark.parametrize("message", ["", "Fatal, Link 28", "Non-fatal, Link 28"])
def test_the_core_emits_an_incident_kind_member_for_every_sxid(code, message):
    core = DetectionCore(CoreConfig())
    event = XidEvent(ts_ms=T0, cluster="c", node="n1", xid=code, pci_bus_id="0000:c2:00", message=message,
                     device="nvswitch")  # fmt: skip
    core.process(event)
    kinds = {incident.kind for incident in core.drain().incidents}
    info = classify_sxid(code, message)
    assert kinds == (set() if info.severity is Severity.INFO else {info.incident_kind})
    assert all(type(kind) is IncidentKind for kind in kinds)


def test_ecc_rules_report_into_xid_families():
    # A fault seen in the kernel log and in the counters must be one incident: the ECC rules use
    # the kinds of the XID families, never kinds of their own.
    previous = {"dbe_volatile": 0, "remap_failure": 0, "retired_pages_pending": 0}
    current = {"dbe_volatile": 1, "remap_failure": 1, "retired_pages_pending": 1}
    kinds = {finding.kind for finding in ecc_step(previous, current).findings}
    assert kinds == {IncidentKind.GPU_MEMORY, IncidentKind.GPU_ROW_REMAP}
    assert kinds <= {category.incident_kind for category in XidCategory}


def test_quiet_periods_name_incident_kinds():
    assert all(type(kind) is IncidentKind for kind, _ in CoreConfig().quiet_period_by_kind_ms)
