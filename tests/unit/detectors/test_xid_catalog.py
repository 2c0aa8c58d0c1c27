from detectors.xid_catalog import XidCategory, classify_xid
from schemas.outputs import Severity

APPLICATION_XIDS = (13, 31, 43, 45, 68, 69, 109)
# SPEC 4.1: hardware-class XIDs that need a reset, drain or RMA.
HARDWARE_XIDS = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 154)


def test_application_xids_never_page_and_are_not_hardware():
    for code in APPLICATION_XIDS:
        info = classify_xid(code)
        assert info.severity is Severity.INFO, code
        assert not info.hardware, code
        assert info.category is XidCategory.APPLICATION


def test_hardware_xids_are_hardware_and_at_least_warn():
    for code in HARDWARE_XIDS:
        info = classify_xid(code)
        assert info.hardware, code
        assert info.severity in (Severity.WARN, Severity.CRITICAL), code
        assert info.action


def test_job_killing_faults_are_critical():
    for code in (48, 62, 64, 74, 79, 94, 95, 119, 120, 140, 143, 154):
        assert classify_xid(code).severity is Severity.CRITICAL, code


def test_unknown_xid_is_flagged_not_rejected():
    info = classify_xid(4242)
    assert info.category is XidCategory.UNKNOWN
    assert info.severity is Severity.WARN
    assert "4242" in info.name
