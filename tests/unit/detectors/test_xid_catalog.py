"""XID classification: NVIDIA's catalog by one mapping, sourced deviations, message-aware rules."""

import random

import pytest

from detectors.xid_catalog import (
    ACTION_POLICY,
    CATALOG,
    DEVIATIONS,
    XidCategory,
    _classify,
    classify_xid,
    deviation_for,
)
from detectors.xid_nvidia import XIDS
from schemas.outputs import Severity

# SPEC 4.1: application-class XIDs, never a page on their own.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 69, 109)
# NVIDIA's immediate actions that need attention to the hardware.
HARDWARE_ACTIONS = {"RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT", "CHECK_MECHANICALS"}


def test_every_code_of_nvidias_catalog_is_known_with_nvidias_facts():
    assert set(CATALOG) == set(XIDS) >= set(range(1, 173))
    for code, info in CATALOG.items():
        assert info.known and info.category is not XidCategory.UNKNOWN, code
        assert info.nvidia_action == XIDS[code].immediate_action, code
        assert info.action and info.basis, code


def test_no_code_that_needs_hardware_attention_is_below_critical_without_a_sourced_deviation():
    for code, entry in XIDS.items():
        if entry.immediate_action in HARDWARE_ACTIONS and CATALOG[code].severity is not Severity.CRITICAL:
            deviation = deviation_for(code)
            assert deviation is not None, code
            assert deviation.reason and deviation.source, code


def test_no_restart_app_or_ignore_code_pages_unless_a_deviation_says_why():
    for code, entry in XIDS.items():
        if (
            entry.immediate_action in {"RESTART_APP", "IGNORE"}
            and CATALOG[code].severity is Severity.CRITICAL
        ):
            assert deviation_for(code) is not None, code


def test_codes_without_an_nvidia_action_are_each_decided_by_a_deviation():
    for code, entry in XIDS.items():
        if not entry.immediate_action:
            assert deviation_for(code) is not None, code


def test_the_mapping_is_the_rule_wherever_no_deviation_applies():
    for code, entry in XIDS.items():
        policy = ACTION_POLICY.get(entry.immediate_action)
        if policy is not None and deviation_for(code) is None:
            info = CATALOG[code]
            assert (info.severity, info.hardware, info.action) == (
                policy.severity,
                policy.hardware,
                policy.action,
            )


def test_deviations_are_sourced_and_cover_known_codes_once():
    seen = set()
    for deviation in DEVIATIONS:
        assert deviation.nvidia and deviation.ours and deviation.reason and deviation.source
        assert set(deviation.codes) <= set(XIDS)
        assert not seen & set(deviation.codes)
        seen |= set(deviation.codes)


def test_application_xids_never_page_and_are_not_hardware():
    for code in APPLICATION_XIDS:
        info = classify_xid(code)
        assert info.severity is Severity.INFO, code
        assert not info.hardware, code


def test_109_follows_the_paper_against_nvidia_and_154_carries_the_reset():
    info = classify_xid(109)
    assert info.category is XidCategory.APPLICATION and info.severity is Severity.INFO
    assert info.nvidia_action == "RESET_GPU"
    assert "Kokolis" in info.deviation.source and "154" in info.deviation.reason
    paired = classify_xid(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    assert paired.severity is Severity.CRITICAL and paired.hardware


def test_job_killing_faults_are_critical():
    for code in (46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, 154, 158, 167, 169, 171, 172):
        assert classify_xid(code).severity is Severity.CRITICAL, code
        assert classify_xid(code).hardware, code


@pytest.mark.parametrize(
    ("code", "severity"),
    [
        (94, Severity.WARN),
        (147, Severity.INFO),
        (148, Severity.INFO),
        (44, Severity.INFO),
        (88, Severity.INFO),
    ],
)
def test_what_nvidia_would_not_page_does_not_page(code, severity):
    assert classify_xid(code).severity is severity


def test_wrong_meanings_are_gone():
    assert classify_xid(88).name == "NVDEC3 Error" and classify_xid(88).category is XidCategory.ENGINE
    assert "drain" not in classify_xid(44).action
    for code in (56, 57, 58, 61, 122, 123, 124):
        info = classify_xid(code)
        assert info.name == XIDS[code].mnemonic and info.severity is Severity.WARN and not info.hardware, code
        assert "unused" in info.action


def test_unknown_xid_is_flagged_info_not_rejected():
    info = classify_xid(4242)
    assert info.category is XidCategory.UNKNOWN and not info.known
    assert info.severity is Severity.INFO
    assert "4242" in info.name


# -- message-aware rules ---------------------------------------------------------------------


def test_48_solo_resets_and_with_63_or_64_drains_and_resets():
    assert classify_xid(48).nvidia_action == "WORKFLOW_XID_48 -> RESET_GPU (solo)"
    with_remap = classify_xid(48, "An uncorrectable double bit error", recent=(63,))
    assert with_remap.severity is Severity.CRITICAL and "DRAIN_AND_RESET" in with_remap.nvidia_action
    assert "SRAM" in classify_xid(48, "DBE (SRAM) detected").action


@pytest.mark.parametrize("code", [63, 64])
def test_63_and_64_after_a_48_join_its_memory_incident(code):
    info = classify_xid(code, "Row Remapper: New row marked for remapping", recent=(48,))
    assert info.category is XidCategory.MEMORY and info.severity is Severity.CRITICAL
    assert classify_xid(code).category is XidCategory.ROW_REMAP


def test_45_solo_names_nvidias_workflow_and_with_others_follows_them():
    solo = classify_xid(45)
    assert solo.severity is Severity.INFO and "RESTART_FM" in solo.nvidia_action
    assert "Fabric Manager" in solo.action and solo.deviation is not None
    after = classify_xid(45, recent=(48, 45))
    assert after.severity is Severity.INFO and "IGNORE" in after.nvidia_action and "48" in after.action


@pytest.mark.parametrize(
    ("registers", "severity"),
    [
        ("0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", Severity.CRITICAL),  # reg 1 bit 16: link hardware
        ("0x0, 0x0, 0x1, 0x0, 0x0, 0x0, 0x0", Severity.CRITICAL),  # reg 3 bit 0: ECC/parity
        ("0x800000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", Severity.INFO),  # reg 1 bit 23: can be ignored
        ("0x0, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0", Severity.INFO),  # reg 5 bit 20: ECC threshold only
        ("0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", Severity.WARN),  # reg 1 bit 1: secondary
        ("0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0", Severity.WARN),  # reg 4 bit 18: secondary
    ],
)
def test_74_reads_its_registers(registers, severity):
    info = classify_xid(74, f"NVLink: fatal error detected on link 3({registers})")
    assert info.severity is severity, info.basis
    assert classify_xid(74).severity is Severity.CRITICAL  # undecoded: NVIDIA says a reset clears it


NETIR = "NETIR_LINK_EVT Fatal XC0 i0 Link 04 ({intr} 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"


@pytest.mark.parametrize(
    ("code", "message", "severity"),
    [
        (149, NETIR.format(intr="0x00100011"), Severity.CRITICAL),  # link down, RESET_GPU
        (149, NETIR.format(intr="0x02600011"), Severity.INFO),  # link down reason NVIDIA says IGNORE
        (144, "SAW_MVB Fatal XC0 i0 Link -1 (0x00000001 0x00000002 0x0 0x0 0x0 0x0)", Severity.CRITICAL),
        (144, "SAW_MVB Nonfatal XC0 i0 Link -1 (0x00000001 0x00000004 0x0 0x0 0x0 0x0)", Severity.INFO),
        (145, "RLW_REMAP Nonfatal XC1 i0 Link 02 (0x00000004 0x00000001 0x0 0x0 0x0 0x0)", Severity.INFO),
        (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 02 (0x00000006 0x00000001 0x0 0x0 0x0 0x0)", Severity.INFO),
        (145, "RLW_RXPIPE Fatal XC0 i0 Link 02 (0x00000086 0x00000001 0x0 0x0 0x0 0x0)", Severity.CRITICAL),
        (147, "TREX Nonfatal XC0 i0 Link 00 (0x0000000e 0x80000000 0x0 0x0 0x0 0x0)", Severity.INFO),
        (146, "Fatal error, registers cut off", Severity.CRITICAL),
        (146, "Non-fatal error, registers cut off", Severity.INFO),
        (144, "SAW_MVB Nonfatal XC0 i0 Link -1", Severity.INFO),  # named, no registers: the word decides
        (144, "SAW_MVB Fatal XC0 i0 Link -1", Severity.CRITICAL),
    ],
)
def test_144_to_150_follow_the_fatal_word_and_nvidias_decode_sheet(code, message, severity):
    info = classify_xid(code, message)
    assert info.severity is severity, info.basis
    assert info.nvidia_action.startswith("WORKFLOW_NVLINK5_ERR")


def test_a_145_that_defers_to_154_says_so():
    info = classify_xid(145, "RLW_REMAP Nonfatal XC1 i0 Link 02 (0x00000004 0x00000001 0x0 0x0 0x0 0x0)")
    assert "XID_154_EVAL" in info.nvidia_action and "154" in info.action


@pytest.mark.parametrize(
    ("stated", "severity"),
    [
        ("0x0 (None)", Severity.INFO),
        ("0x1 (GPU Reset Required)", Severity.CRITICAL),
        ("0x2 (Node Reboot Required)", Severity.CRITICAL),
        ("0x3 (Drain P2P)", Severity.CRITICAL),
        ("0x4 (Drain and Reset)", Severity.CRITICAL),
        ("0x9 (Something New)", Severity.CRITICAL),
    ],
)
def test_154_follows_the_recovery_action_it_states(stated, severity):
    info = classify_xid(154, f"GPU recovery action changed from 0x0 (None) to {stated}")
    assert info.severity is severity
    assert info.category is XidCategory.RECOVERY


@pytest.mark.parametrize("code", [45, 48, 63, 64, 13, 79, 144])
def test_a_line_classified_with_its_context_as_the_rules_read_it(code):
    """Classifications are remembered by code, message and the part of the GPU's recent XIDs
    the rules read: the same as the rules on the whole recent list, whatever else it holds."""
    rng = random.Random(code)
    messages = ("", "Row Remapper: New row marked for remapping", "SRAM uncorrectable error",
                "Link 12 (0x0000000c) Non-fatal error")  # fmt: skip
    for _ in range(300):
        recent = tuple(rng.choice((13, 31, 43, 45, 48, 63, 64, 79, 94)) for _ in range(rng.randrange(6)))
        message = rng.choice(messages)
        assert classify_xid(code, message, recent) == _classify(XIDS[code], message, recent), (
            message,
            recent,
        )
