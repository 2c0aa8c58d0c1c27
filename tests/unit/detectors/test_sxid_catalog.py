"""SXid classification: the Fabric Manager guide's tables and the line's own Fatal/Non-fatal word."""

import pytest

from detectors.sxid_catalog import SXID_CATALOG, SxidClass, classify_sxid
from schemas.outputs import IncidentKind, Severity


def test_always_fatal_and_fatal_sxids_page():
    for code, info in SXID_CATALOG.items():
        if info.fm_class in (SxidClass.FATAL, SxidClass.ALWAYS_FATAL):
            assert info.severity is Severity.CRITICAL and info.hardware, code
            assert info.incident_kind is IncidentKind.NVSWITCH_FATAL


def test_corrected_errors_are_info_and_open_nothing():
    for code in (11012, 11021, 12021, 15008, 19049, 24001, 20001):
        assert classify_sxid(code, "Non-fatal, Link 3").severity is Severity.INFO, code


@pytest.mark.parametrize(("code", "severity"), [(19084, Severity.CRITICAL), (10003, Severity.CRITICAL),
                                                 (10004, Severity.WARN), (11004, Severity.WARN)])  # fmt: skip
def test_notable_and_non_fatal_codes_with_a_recovery_step(code, severity):
    assert classify_sxid(code).severity is severity


def test_the_lines_word_decides_for_potentially_fatal_codes():
    assert classify_sxid(20034, "Fatal, Link 28 LTSSM Fault Up").severity is Severity.CRITICAL
    reported = classify_sxid(20034, "Non-fatal, Link 28 LTSSM Fault Up")
    assert reported.severity is Severity.WARN and reported.incident_kind is IncidentKind.NVSWITCH_NONFATAL
    # Always-fatal codes stay fatal whatever the line says.
    assert classify_sxid(23001, "Non-fatal").severity is Severity.CRITICAL


@pytest.mark.parametrize(("message", "severity"), [("Fatal, x", Severity.CRITICAL), ("Non-fatal, x", Severity.WARN),
                                                   ("", Severity.WARN)])  # fmt: skip
def test_unknown_sxids_are_kept_and_classified_by_their_word(message, severity):
    info = classify_sxid(31337, message)
    assert not info.known and info.fm_class is None and info.severity is severity
