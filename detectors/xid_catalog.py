"""XID classification: where an XID is classified (SPEC 4.1), from NVIDIA's catalog by one mapping.

The facts come from NVIDIA's XID catalog (``Xid-Catalog.xlsx``), generated into
:mod:`detectors.xid_nvidia`: every code 1-172 with its mnemonic, meaning, NVIDIA's *immediate*
action (what gets the system back into service) and *investigatory* action, and the GPU
generations it applies to. What faultstream makes of them is decided here, in three steps.

1. **One mapping** from NVIDIA's immediate action to our severity, hardware flag and suggested
   action (:data:`ACTION_POLICY`): ``RESTART_APP`` and ``IGNORE`` are ``info`` (stored, never an
   incident on their own); ``RESTART_VM``, ``UPDATE_SWFW`` (software to fix) and ``CHECK_UVM``
   (reset only if UVM/vGPU is in use, which a log line cannot tell) are ``warn``; ``RESET_GPU``,
   ``RESTART_BM``, ``CONTACT_SUPPORT`` and ``CHECK_MECHANICALS`` need hardware attention and are
   ``critical`` (page, count as hardware evidence of a failed job). The *category* (the incident
   family, ``gpu_<category>``) says where the fault is and comes from the mnemonic
   (:data:`FAMILY_RULES`); it never changes the severity.
2. **Message-aware rules** where NVIDIA's action depends on the text or on the XIDs around it:
   48 with 63/64, 45 solo or not, 74's registers, 144-150's Fatal/Non-fatal word and
   register decode, 154's stated recovery action (:func:`classify_xid`).
3. **Deviations** (:data:`DEVIATIONS`): every code where we knowingly differ from NVIDIA, with
   NVIDIA's view, ours, the reason and the source; :func:`classify_xid` reports the deviation with
   the classification, and ``faultstream explain`` prints it.

A code outside NVIDIA's catalog is ``unknown``/``info``: stored, flagged, and the detection core
opens at most one info-level incident per node per day for such codes.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache, lru_cache
from typing import Final

from detectors.xid_nvidia import NVLINK_DECODE, XIDS, NvidiaXid, NvlinkDecodeRow
from schemas.outputs import IncidentKind, Severity

__all__ = [
    "ACTION_POLICY",
    "CATALOG",
    "CONTEXT_WINDOW_MS",
    "DEVIATIONS",
    "FAMILY_RULES",
    "Deviation",
    "Policy",
    "XidCategory",
    "XidInfo",
    "XidOverride",
    "classify_xid",
    "deviation_for",
]

#: How far back (event time, same GPU) the XIDs that change a line's meaning are looked for:
#: 48 with 63/64, 45 with the XID it cleans up after. The driver prints them together, within a
#: second in practice; a minute leaves room for clock jitter between log lines.
CONTEXT_WINDOW_MS: Final = 60_000


class XidCategory(StrEnum):
    """Families of XIDs; an incident groups the evidence of one family on one GPU."""

    APPLICATION = "application"
    MEMORY = "memory"
    ROW_REMAP = "row_remap"
    NVLINK = "nvlink"
    BUS = "bus"
    FIRMWARE = "firmware"
    ENGINE = "engine"
    DRIVER = "driver"
    THERMAL_POWER = "thermal_power"
    RECOVERY = "recovery"
    UNKNOWN = "unknown"

    @property
    def incident_kind(self) -> IncidentKind:
        """The kind of the incidents of this family: ``gpu_<family>``, ``xid_unknown`` for unknown codes.

        >>> XidCategory.BUS.incident_kind.value, XidCategory.UNKNOWN.incident_kind.value
        ('gpu_bus', 'xid_unknown')
        """
        if self is XidCategory.UNKNOWN:
            return IncidentKind.XID_UNKNOWN
        # Raises for a family added here without its IncidentKind member (a unit test calls this
        # for every family, so that shows before a store does).
        return IncidentKind(f"gpu_{self.value}")


@dataclass(frozen=True, slots=True)
class Policy:
    """What one NVIDIA action means here: how urgent, whether hardware, what to do."""

    severity: Severity
    hardware: bool
    action: str


_S = Severity

#: THE mapping: NVIDIA's immediate action (resolution bucket) -> our severity, hardware, action.
ACTION_POLICY: Final[dict[str, Policy]] = {
    "RESTART_APP": Policy(_S.INFO, False, "restart the job; no hardware action"),
    "IGNORE": Policy(_S.INFO, False, "none: NVIDIA says no action is required"),
    "RESTART_VM": Policy(_S.WARN, False, "restart the VM that owns the GPU; no GPU reset needed"),
    "UPDATE_SWFW": Policy(_S.WARN, False, "update the driver and firmware to the latest versions"),
    "CHECK_UVM": Policy(
        _S.WARN,
        True,
        "reset the GPU if UVM or vGPU is in use on it, otherwise no action (NVIDIA's CHECK_UVM)",
    ),
    "RESET_GPU": Policy(
        _S.CRITICAL, True, "drain the node, reset the GPU, run diagnostics before returning it"
    ),
    # Not a bucket of NVIDIA's Xids sheet: what WORKFLOW_XID_48 (with 63/64) and XID 154 resolve to.
    "DRAIN_AND_RESET": Policy(
        _S.CRITICAL, True, "drain the GPU's jobs, then reset it (the row remap applies on reset)"
    ),
    "RESTART_BM": Policy(_S.CRITICAL, True, "drain and reboot the node; RMA the GPU if it recurs"),
    "CONTACT_SUPPORT": Policy(
        _S.CRITICAL, True, "drain the node, run field diagnostics, contact support/RMA"
    ),
    "CHECK_MECHANICALS": Policy(
        _S.CRITICAL, True, "drain the node; check the GPU's seating and its power and NVLink connections"
    ),
}

_A = XidCategory

#: The family of a code, from its NVIDIA mnemonic: the first pattern that matches wins.
FAMILY_RULES: Final[tuple[tuple[str, XidCategory], ...]] = (
    (r"NVLINK|ALI_TRAINING|C2C|CHI_NON_DATA", _A.NVLINK),
    (r"INFOROM_DRAM|RESOURCE_RETIREMENT", _A.ROW_REMAP),
    (r"ECC|DRAM|SRAM|CONTAINED|SBE|GPU_MEMORY|FB_MEMORY|FB_LINK|LTC_", _A.MEMORY),
    (r"FALLEN_OFF_THE_BUS|PCIE|BUS_MASTER", _A.BUS),
    (r"RECOVERY_ACTION", _A.RECOVERY),
    (
        r"GSP|PMU|SEC2_HALT|SEC_FAULT|GPU_INIT|INFOROM|SPI_|FATAL_TIMEOUT|SMBPBI|BUNDLE|TELEMETRY|KEY_ROT|VGPU",
        _A.FIRMWARE,
    ),
    (r"PSHC|PWR|SILENT_RUNNING|TEMP", _A.THERMAL_POWER),
    (r"FECS|GPU_TIMEOUT|IDLE_TIMEOUT", _A.DRIVER),
    (
        r"CE\d|NVDEC|NVJPG|NVENC|OFA|VIC_|MSVLD|MSPDEC|MSPPP|SEC2_ERROR|SEC_ERROR|DLA|MPEG|VP2?_|BSP|ME_ERROR"
        r"|DISP|HEAD_|CHANNEL_REGS|SCANLINE|VBLANK|DP_LT|VGA",
        _A.ENGINE,
    ),
    (
        r"GR_|MMU|PBDMA|PUSHBUFFER|RESETCHANNEL|PREEMPTIVE|CTXSW|FAKE_ERROR|FIFO_ERROR|PARAMETER|FAST_PATH",
        _A.APPLICATION,
    ),
    (r"CHANNEL_RETIREMENT|RC_LOGGING", _A.APPLICATION),
)


def family(mnemonic: str) -> XidCategory:
    """The category of an NVIDIA mnemonic (:data:`FAMILY_RULES`; ``driver`` when none matches).

    >>> family("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS").value, family("NVLINK_TREX_ERROR").value
    ('bus', 'nvlink')
    """
    for pattern, category in FAMILY_RULES:
        if re.search(pattern, mnemonic):
            return category
    return XidCategory.DRIVER


@dataclass(frozen=True, slots=True)
class Deviation:
    """One place where faultstream knowingly differs from NVIDIA's catalog.

    Attributes
    ----------
    codes
        The XIDs it covers.
    nvidia
        What NVIDIA's catalog says.
    ours
        What we do instead.
    reason, source
        Why, and on what authority.
    severity, hardware, action, category
        The classification we give (``category`` None keeps the mnemonic's family).
    job_evidence
        Whether a line is hardware evidence for a failed job's attribution when that differs from
        the rule (critical and hardware); None keeps the rule.
    """

    codes: tuple[int, ...]
    nvidia: str
    ours: str
    reason: str
    source: str
    severity: Severity
    hardware: bool
    action: str
    category: XidCategory | None = None
    job_evidence: bool | None = None


_UNUSED = tuple(code for code, x in sorted(XIDS.items()) if x.description == "Unused" and not x.applies_to)
_KOKOLIS = (
    "Kokolis et al., 'Revisiting Reliability in Large-Scale Machine Learning Research Clusters', HPCA 2025; "
    "Meta GCM health checks (gcm/health_checks/checks/check_syslogs.py)"
)
_MEM_GUIDE = (
    "NVIDIA GPU Memory Error Management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt), row remapping"
)

#: Every deliberate difference from NVIDIA's catalog, with its reason and source.
DEVIATIONS: Final[tuple[Deviation, ...]] = (
    Deviation(
        codes=(109,),
        nvidia="RESET_GPU (Context Switch Timeout); from driver R570 followed by an XID 154",
        ours="info, application class: no page on its own; the XID 154 the driver prints with it pages",
        reason="in large training clusters 109 follows a hung or misbehaving program far more often than a "
        "faulty GPU; when the driver itself decides a reset is needed it says so with XID 154 "
        "('GPU Reset Required'), which is critical here, so the reset NVIDIA asks for is not lost",
        source=f"{_KOKOLIS}; NVIDIA's catalog, 'Xid 154 linkage' column of 109 (CUDA 12.7, R570)",
        severity=_S.INFO,
        hardware=False,
        action="restart the job; if the driver follows with XID 154 (reset or reboot required), do that",
        category=_A.APPLICATION,
    ),
    Deviation(
        codes=(45,),
        nvidia="WORKFLOW_XID_45: solo -> RESTART_FM (restart Fabric Manager); with other XIDs -> IGNORE",
        ours="info either way; solo, the suggested action names NVIDIA's Fabric Manager restart",
        reason="NVIDIA's own trigger text: 45 is logged whenever the driver tears down an aborted program "
        "(Ctrl-C, SIGKILL, a GPU reset); on its own it is a killed job, and a Fabric Manager restart is a "
        "software step that needs no page",
        source=f"NVIDIA's catalog, XID 45 trigger conditions; {_KOKOLIS}",
        severity=_S.INFO,
        hardware=False,
        action="usually a killed or aborted job; if jobs on this GPU keep failing with only XID 45, restart "
        "Fabric Manager (NVIDIA's solo workflow, NVSwitch systems)",
    ),
    Deviation(
        codes=(94,),
        nvidia="RESTART_APP (contained memory error); 'reset the GPU when convenient'",
        ours="warn, hardware: an incident without a page, so the reset is scheduled; still evidence that a "
        "job that failed with it failed because of the hardware",
        reason="the program is restarted by its scheduler anyway; the GPU still carries a memory error and "
        "NVIDIA recommends a reset when convenient, which an info record would let slip. The program it "
        "killed died of a memory error, so the failure counts as a hardware failure (SPEC 4.4)",
        source="NVIDIA's catalog, XID 94 trigger conditions; " + _MEM_GUIDE,
        severity=_S.WARN,
        hardware=True,
        action="restart the job; reset the GPU at the next drain (NVIDIA: 'when convenient')",
        job_evidence=True,
    ),
    Deviation(
        codes=(63,),
        nvidia="IGNORE (row remapping event recorded)",
        ours="warn, hardware (critical and in the XID 48 incident when it follows an XID 48)",
        reason="a recorded remap is pending until the GPU is reset; SPEC 4.1/4.3 track pending remaps and "
        "the ECC rules report them into the same row_remap family",
        source=_MEM_GUIDE + "; SPEC 4.1, 4.3",
        severity=_S.WARN,
        hardware=True,
        action="reset the GPU at the next drain: the pending row remap applies on reset",
    ),
    Deviation(
        codes=(92,),
        nvidia="IGNORE (high single-bit ECC error rate); investigatory CONTACT_SUPPORT",
        ours="warn, hardware",
        reason="a rising correctable-error rate is a precursor of uncorrectable errors (SPEC 4.3, the "
        "paper); one incident without a page lets the trend detector's evidence be seen with it",
        source=f"SPEC 4.3; {_KOKOLIS}",
        severity=_S.WARN,
        hardware=True,
        action="watch the GPU's ECC trend; run field diagnostics if it keeps rising",
    ),
    Deviation(
        codes=(157,),
        nvidia="IGNORE (resource retirement failure); investigatory CONTACT_SUPPORT",
        ours="warn, hardware",
        reason="NVIDIA's trigger text: no repair is possible for lack of spare resources and the same XID "
        "may recur; the GPU is running out of repairs and should be scheduled for service",
        source="NVIDIA's catalog, XID 157 trigger conditions",
        severity=_S.WARN,
        hardware=True,
        action="keep running, schedule field diagnostics / RMA: the GPU has no spare resources left",
    ),
    Deviation(
        codes=_UNUSED,
        nvidia="CONTACT_SUPPORT, described 'Unused' and applying to none of A100, H100, B100, GB200",
        ours="warn, not hardware: an incident without a page",
        reason="NVIDIA's user guide: 'Unused' means the code is deprecated or V100 and earlier; on current "
        "GPUs it should not appear, so a line with one points at an old GPU or a driver anomaly, not at a "
        "known hardware fault worth a page (their pre-Ampere meanings, e.g. 57/58 memory interface, 56 "
        "display, 61 PMU breakpoint, 122-124 SPI, are not used)",
        source="NVIDIA's catalog, 'Customer User Guide' sheet (Description column) and 'Applies to' columns",
        severity=_S.WARN,
        hardware=False,
        action="NVIDIA lists this code as unused on A100 and newer: check the GPU model and driver version, "
        "contact support if it recurs",
    ),
    Deviation(
        codes=(162,),
        nvidia="no action given (power smoothing circuitry re-engaged)",
        ours="info",
        reason="a capability coming back; nothing to do",
        source="NVIDIA's catalog, XID 162 description",
        severity=_S.INFO,
        hardware=False,
        action="none",
    ),
    Deviation(
        codes=(163,),
        nvidia="no action given (power smoothing disengaged): 'no GPU reset required'",
        ours="warn, not hardware",
        reason="NVIDIA's trigger text: resolve the thermal events (or reload the driver after a timeout) "
        "if power smoothing is wanted; a facility matter, not a page",
        source="NVIDIA's catalog, XID 163 trigger conditions",
        severity=_S.WARN,
        hardware=False,
        action="check the thermal events; reload the driver or reset the GPU if it was disabled by a timeout",
    ),
    Deviation(
        codes=(164, 165),
        nvidia="no action given (power smoothing circuitry lifetime low / exhausted)",
        ours="warn, hardware",
        reason="NVIDIA's trigger text: expect to replace the GPU if power smoothing is wanted; a planned "
        "replacement, not a page",
        source="NVIDIA's catalog, XIDs 164/165 trigger conditions",
        severity=_S.WARN,
        hardware=True,
        action="plan the GPU's replacement if power smoothing is required; check the facility absorbs swings",
    ),
    Deviation(
        codes=(166, 170),
        nvidia="no action given (confidential-computing mode NVLink events)",
        ours="warn, not hardware",
        reason="only in confidential-computing mode, a configuration matter per NVIDIA's note",
        source="NVIDIA's catalog, XIDs 166/170 trigger conditions",
        severity=_S.WARN,
        hardware=False,
        action="check the confidential-computing NVLink configuration",
    ),
    Deviation(
        codes=(167,),
        nvidia="no action given (PCIE_FATAL_TIMEOUT)",
        ours="critical, bus: as XID 79 (RESTART_BM)",
        reason="a fatal PCIe timeout loses the GPU like falling off the bus, which NVIDIA resolves with a "
        "reboot",
        source="NVIDIA's catalog, XID 167 mnemonic and XID 79 (RESTART_BM)",
        severity=_S.CRITICAL,
        hardware=True,
        action="drain and reboot the node; check the PCIe link and RMA the GPU if it recurs",
    ),
    Deviation(
        codes=(168,),
        nvidia="no action given (errors in the write-protected region; ECC disabled)",
        ours="warn, hardware",
        reason="NVIDIA's trigger text: enable ECC (row remapping) or re-attempt the boot; memory capacity is "
        "reduced but the GPU runs",
        source="NVIDIA's catalog, XID 168 trigger conditions",
        severity=_S.WARN,
        hardware=True,
        action="enable ECC so row remapping can repair it, or reboot to shift the protected region",
    ),
    Deviation(
        codes=(169,),
        nvidia="no action given (SEC2 micro-controller halt)",
        ours="critical, firmware: as XID 62 (RESET_GPU)",
        reason="the same failure as XID 62's micro-controller halt, which NVIDIA resolves with a reset",
        source="NVIDIA's catalog, XIDs 62 and 169",
        severity=_S.CRITICAL,
        hardware=True,
        action="drain the node, reset the GPU, run diagnostics before returning it",
    ),
    Deviation(
        codes=(171, 172),
        nvidia="no action given (uncorrectable DRAM / SRAM error, 'additional to Xid 48')",
        ours="critical, memory: as XID 48 (RESET_GPU), joining its incident",
        reason="they detail an XID 48, whose action applies",
        source="NVIDIA's catalog, XIDs 48, 171, 172",
        severity=_S.CRITICAL,
        hardware=True,
        action="drain the node, reset the GPU; for SRAM, check the SRAM error threshold flag and run field "
        "diagnostics if it is set",
        category=_A.MEMORY,
    ),
)

_DEVIATION_OF: Final[dict[int, Deviation]] = {code: d for d in DEVIATIONS for code in d.codes}


def deviation_for(code: int) -> Deviation | None:
    """The deviation that covers ``code``, if any.

    >>> deviation_for(109).severity.value, deviation_for(79) is None
    ('info', True)
    """
    return _DEVIATION_OF.get(code)


@dataclass(frozen=True, slots=True)
class XidInfo:
    """What one XID (line) means for an operator.

    Attributes
    ----------
    code
        The XID code.
    name
        NVIDIA's description (the mnemonic where the description is "Unused").
    category
        Family of the fault: the incident kind is ``gpu_<category>``.
    severity
        ``info`` never opens an incident (unknown codes aside), ``warn`` opens one without paging,
        ``critical`` pages.
    hardware
        True when the XID needs attention to the GPU, the board or the fabric rather than the
        program; critical ones count as evidence when a failed job is attributed to hardware.
    action
        What to do, in our words.
    nvidia_action
        NVIDIA's immediate action as it applies to this line (a workflow resolved, e.g.
        ``WORKFLOW_XID_48 -> DRAIN_AND_RESET``); ``""`` where NVIDIA gives none.
    nvidia_investigatory
        NVIDIA's investigatory action.
    basis
        Why this line got this classification: the mapping, a message rule or a deviation.
    deviation
        The deviation from NVIDIA's catalog that applied, if any.
    mnemonic, applies_to
        NVIDIA's mnemonic and the GPU generations the code applies to.
    known
        False for a code outside NVIDIA's catalog.
    """

    code: int
    name: str
    category: XidCategory
    severity: Severity
    hardware: bool
    action: str
    nvidia_action: str = ""
    nvidia_investigatory: str = ""
    basis: str = ""
    deviation: Deviation | None = None
    mnemonic: str = ""
    applies_to: tuple[str, ...] = ()
    known: bool = True

    @property
    def job_evidence(self) -> bool:
        """Whether the line is hardware evidence when a failed job is attributed (SPEC 4.4).

        Critical hardware XIDs are; a deviation may say otherwise (94: a contained memory error
        does not page, but the program it killed died of the hardware).

        >>> classify_xid(79).job_evidence, classify_xid(94).job_evidence, classify_xid(92).job_evidence
        (True, True, False)
        """
        if self.deviation is not None and self.deviation.job_evidence is not None:
            return self.deviation.job_evidence
        return self.hardware and self.severity is Severity.CRITICAL


def _name(entry: NvidiaXid) -> str:
    return entry.mnemonic if entry.description == "Unused" else entry.description


def _from_policy(entry: NvidiaXid, bucket: str, basis: str, **changes: object) -> XidInfo:
    policy = ACTION_POLICY[bucket]
    info = XidInfo(
        code=entry.code,
        name=_name(entry),
        category=family(entry.mnemonic),
        severity=policy.severity,
        hardware=policy.hardware,
        action=policy.action,
        nvidia_action=entry.immediate_action,
        nvidia_investigatory=entry.investigatory_action,
        basis=basis,
        mnemonic=entry.mnemonic,
        applies_to=entry.applies_to,
    )
    return replace(info, **changes) if changes else info  # type: ignore[arg-type]


@cache  # one XidInfo a code (frozen): every XID line of a storm asks for its code's again
def _base(entry: NvidiaXid) -> XidInfo:
    """The classification of a code from the mapping and the deviations, before any message rule."""
    deviation = _DEVIATION_OF.get(entry.code)
    if deviation is not None:
        return XidInfo(
            code=entry.code,
            name=_name(entry),
            category=deviation.category or family(entry.mnemonic),
            severity=deviation.severity,
            hardware=deviation.hardware,
            action=deviation.action,
            nvidia_action=entry.immediate_action,
            nvidia_investigatory=entry.investigatory_action,
            basis=f"deviation from NVIDIA's catalog: {deviation.ours}",
            deviation=deviation,
            mnemonic=entry.mnemonic,
            applies_to=entry.applies_to,
        )
    bucket = entry.immediate_action
    if bucket in ACTION_POLICY:
        return _from_policy(entry, bucket, f"NVIDIA's immediate action {bucket}")
    # The workflows: the classification of the code with no message and no context. Each is
    # refined by the message rules in classify_xid.
    if bucket == "WORKFLOW_XID_48":
        return _from_policy(entry, "RESET_GPU", "WORKFLOW_XID_48 solo -> RESET_GPU")
    if bucket == "WORKFLOW_NVLINK_ERR":
        return _from_policy(
            entry,
            "RESET_GPU",
            "WORKFLOW_NVLINK_ERR, registers not decoded: a reset clears the error (NVIDIA)",
        )
    if bucket == "XID_154":
        return _from_policy(entry, "RESET_GPU", "XID_154 with no stated action: assume a reset is required")
    if bucket == "WORKFLOW_NVLINK5_ERR":
        return _nvlink5_base(entry)
    raise ValueError(f"XID {entry.code}: NVIDIA action {bucket!r} has no policy, rule or deviation")


# -- NVLink5 (144-150): Fatal/Non-fatal word and the decode sheet --------------------------------

_RANK = {"IGNORE": 0, "XID_154_EVAL": 1, "RESET_GPU": 2}
_HEX_GROUP = re.compile(r"\(\s*(0x[0-9A-Fa-f]+(?:[\s,]+0x[0-9A-Fa-f]+)*)\s*\)")
_FATALITY = re.compile(r"\b(non-?fatal|fatal)\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Z][A-Z0-9_]+")


def _registers(message: str) -> list[int]:
    """The hex registers of the last parenthesised group in the message (empty when none)."""
    groups = _HEX_GROUP.findall(message)
    return [int(value, 16) for value in re.split(r"[\s,]+", groups[-1].strip())] if groups else []


def _mask_matches(mask: str, value: int) -> bool:
    if not mask:
        return False
    for position, char in enumerate(reversed(mask)):
        if char in "01" and (value >> position) & 1 != int(char):
            return False
    return True


def _status_matches(spec: str, status: int | None) -> bool:
    if not spec or status is None:
        return True
    return any(int(option, 16) == status for option in spec.split("/"))


def _nvlink5_rows(code: int) -> list[NvlinkDecodeRow]:
    return [row for row in NVLINK_DECODE if row.xid == code]


def _nvlink5_base(entry: NvidiaXid) -> XidInfo:
    worst = max((row.action for row in _nvlink5_rows(entry.code)), key=_RANK.__getitem__)
    if worst == "RESET_GPU":
        return _from_policy(
            entry, "RESET_GPU", "WORKFLOW_NVLINK5_ERR, message not decoded: some decode rows need RESET_GPU"
        )
    return _from_policy(entry, "IGNORE", "WORKFLOW_NVLINK5_ERR: every decode row of this XID is IGNORE")


def _nvlink5(entry: NvidiaXid, message: str) -> XidInfo:
    rows = _nvlink5_rows(entry.code)
    registers = _registers(message)
    intr = registers[0] if registers else None
    status = registers[1] if len(registers) > 1 else None
    named = set(_WORD.findall(message))
    by_name = [row for row in rows if named & set(row.subcode.split("/"))]
    candidates = by_name or rows
    if intr is not None:
        candidates = [
            r
            for r in candidates
            if _mask_matches(r.intr_info_v1, intr) or _mask_matches(r.intr_info_v2, intr)
        ]
    decoded = [r for r in candidates if _status_matches(r.error_status, status)]
    if not decoded and status:
        # Several status bits at once: each bit is a row of its own; the worst row decides.
        bits = [1 << b for b in range(32) if status >> b & 1]
        decoded = [r for r in candidates if any(_status_matches(r.error_status, bit) for bit in bits)]
    word = _FATALITY.search(message)
    fatal = None if word is None else not word.group(1).lower().startswith("non")
    # Decode when the registers are there; a named sub-component alone decides only when the
    # line carries no Fatal/Non-fatal word (the word is the driver's own verdict).
    if decoded and (intr is not None or (by_name and fatal is None)):
        row = max(decoded, key=lambda r: _RANK[r.action])
        action = row.action
        promoted = intr is not None and (
            _mask_matches(row.action2_intr_info_v1, intr) or _mask_matches(row.action2_intr_info_v2, intr)
        )
        if promoted and row.action2:
            action = row.action2
        where = f"{row.subcode} status {row.error_status or 'any'} ({row.severity}, {row.hw_sw})"
        basis = f"WORKFLOW_NVLINK5_ERR decoded: {where} -> {action}"
        if action == "XID_154_EVAL":
            return _from_policy(
                entry,
                "RESTART_APP",
                basis,
                nvidia_action=f"WORKFLOW_NVLINK5_ERR -> XID_154_EVAL ({where})",
                nvidia_investigatory=row.investigatory_action or entry.investigatory_action,
                action="restart the job; if the driver prints an XID 154 with it, follow that (it pages)",
            )
        info = _from_policy(
            entry,
            action,
            basis,
            nvidia_action=f"WORKFLOW_NVLINK5_ERR -> {action} ({where})",
            nvidia_investigatory=row.investigatory_action or entry.investigatory_action,
        )
        if action == "IGNORE":
            return replace(info, action=f"none ({row.investigatory_action or 'IGNORE'} to investigate)")
        return info
    if fatal is True:
        return _from_policy(
            entry, "RESET_GPU", "the line says Fatal (registers not in NVIDIA's decode sheet)",
            nvidia_action="WORKFLOW_NVLINK5_ERR -> RESET_GPU (fatal)",
        )  # fmt: skip
    if fatal is False:
        return _from_policy(
            entry, "IGNORE", "the line says Non-fatal: every non-fatal decode row is IGNORE or XID_154_EVAL",
            nvidia_action="WORKFLOW_NVLINK5_ERR -> IGNORE (non-fatal)",
        )  # fmt: skip
    return _nvlink5_base(entry)


# -- XID 74: NVLink error registers (WORKFLOW_NVLINK_ERR) -----------------------------------------

# (register index, bits) per NVIDIA's WORKFLOW_NVLINK_ERR text; registers 1, 3, 4, 5 are decoded.
_NVLINK_HW = {
    0: {4, 5, 8, 9, 12, 16, 17, 21, 22, 24, 28},
    2: {0, 1, 2, 6, 16, 19},
    4: {18, 19, 21, 22, 24, 25, 27, 28},
}
_NVLINK_SECONDARY = {0: {1, 20, 27, 29}, 2: {13, 17, 18}, 3: {16, 17, 18}}
_NVLINK_BENIGN = {0: {0, 23, 30}, 4: {20, 23, 26, 29}}


def _set_bits(value: int) -> set[int]:
    return {bit for bit in range(32) if value >> bit & 1}


def _xid74(entry: NvidiaXid, message: str) -> XidInfo:
    registers = _registers(message)
    if not registers:
        return _base(entry)
    hardware: list[str] = []
    secondary: list[str] = []
    unexplained: list[str] = []
    for index, value in enumerate(registers[:5]):
        if index == 1:
            continue  # the second register is not decoded for these products (NVIDIA)
        for bit in sorted(_set_bits(value)):
            label = f"register {index + 1} bit {bit}"
            if bit in _NVLINK_HW.get(index, set()):
                hardware.append(label)
            elif bit in _NVLINK_SECONDARY.get(index, set()):
                secondary.append(label)
            elif bit not in _NVLINK_BENIGN.get(index, set()):
                unexplained.append(label)
    nvidia = "WORKFLOW_NVLINK_ERR"
    if hardware:
        return _from_policy(
            entry, "RESET_GPU", f"{nvidia}: {', '.join(hardware)} point at the link hardware (ECC/parity, "
            "mechanical or signal integrity)",
            nvidia_action=f"{nvidia} -> check link mechanics, run field diagnostics; reset to clear",
            action="drain the node, reset the GPU; re-seat/check the NVLink connection and run field "
            "diagnostics if it recurs on the same link",
        )  # fmt: skip
    if secondary or unexplained:
        bits = ", ".join(secondary + unexplained)
        return _from_policy(
            entry, "RESET_GPU", f"{nvidia}: {bits} are secondary (or unlisted) bits: follow the other XIDs",
            severity=Severity.WARN,
            nvidia_action=f"{nvidia} -> follow the accompanying XID/SXid; report a bug if seen solo",
            action="follow the accompanying XID/SXid; if this is the only error, report it to NVIDIA",
        )  # fmt: skip
    return _from_policy(
        entry, "IGNORE", f"{nvidia}: only bits NVIDIA says can be ignored (or ECC threshold bits) are set",
        nvidia_action=f"{nvidia} -> IGNORE",
    )  # fmt: skip


# -- XID 154: the recovery action the driver states -----------------------------------------------

_RECOVERY_RE = re.compile(
    r"recovery action changed from\s+(?:0x[0-9A-Fa-f]+\s*)?\(([^)]*)\)"
    r"\s+to\s+(?:0x[0-9A-Fa-f]+\s*)?\(([^)]*)\)",
    re.IGNORECASE,
)
_RECOVERY_ACTIONS: Final[dict[str, tuple[str, str]]] = {
    "none": ("IGNORE", "none: the driver cleared the recovery action"),
    "drain p2p": (
        "RESET_GPU",
        "drain the jobs that use peer-to-peer (NVLink) traffic on this GPU, then reset it",
    ),
    "drain and reset": ("DRAIN_AND_RESET", "drain the GPU's jobs, then reset it"),
    "gpu reset required": ("RESET_GPU", "drain the node, reset the GPU, run diagnostics before returning it"),
    "node reboot required": ("RESTART_BM", "drain and reboot the node; RMA the GPU if it recurs"),
}


def _xid154(entry: NvidiaXid, message: str) -> XidInfo:
    match = _RECOVERY_RE.search(message)
    if match is None:
        return _base(entry)
    stated = match.group(2).strip()
    bucket, action = _RECOVERY_ACTIONS.get(stated.lower(), ("RESET_GPU", ""))
    return _from_policy(
        entry,
        bucket,
        f"XID 154 states the recovery action {stated!r}",
        nvidia_action=f"XID_154 -> {stated}",
        **({"action": action} if action else {}),
    )


def _classify(entry: NvidiaXid, message: str, recent: Collection[int]) -> XidInfo:
    code = entry.code
    if code == 48:
        if 63 in recent or 64 in recent:
            info = _from_policy(
                entry, "DRAIN_AND_RESET", "WORKFLOW_XID_48 with XID 63/64 -> DRAIN_AND_RESET",
                nvidia_action="WORKFLOW_XID_48 -> DRAIN_AND_RESET (with 63/64)",
            )  # fmt: skip
        else:
            info = replace(_base(entry), nvidia_action="WORKFLOW_XID_48 -> RESET_GPU (solo)")
        if "SRAM" in message.upper():
            info = replace(
                info,
                action=info.action
                + "; SRAM: check the SRAM error threshold flag, run field diagnostics if set",
            )
        return info
    if code in (63, 64) and 48 in recent:
        # The remap of a DBE's row: part of the XID 48 fault, so it joins its memory incident.
        return _from_policy(
            entry, "DRAIN_AND_RESET", f"XID {code} with XID 48: WORKFLOW_XID_48 -> DRAIN_AND_RESET",
            category=XidCategory.MEMORY, nvidia_action="WORKFLOW_XID_48 -> DRAIN_AND_RESET (with 63/64)",
        )  # fmt: skip
    if code == 45:
        others = sorted({c for c in recent if c != 45})
        base = _base(entry)
        if others:
            return replace(
                base,
                nvidia_action="WORKFLOW_XID_45 -> IGNORE (not solo: follow the other XID)",
                action=f"none for this line: follow XID {', '.join(map(str, others))}'s guidance",
                basis="WORKFLOW_XID_45 with other XIDs on the GPU -> IGNORE",
                deviation=None,
            )
        return replace(base, nvidia_action="WORKFLOW_XID_45 -> RESTART_FM (solo)")
    if code == 74:
        return _xid74(entry, message)
    if code == 154:
        return _xid154(entry, message)
    if entry.immediate_action == "WORKFLOW_NVLINK5_ERR" and message:
        return _nvlink5(entry, message)
    return _base(entry)


@lru_cache(maxsize=256)
def _unknown(code: int) -> XidInfo:
    return XidInfo(
        code=code,
        name=f"XID {code} is not in NVIDIA's catalog (as generated into faultstream)",
        category=XidCategory.UNKNOWN,
        severity=Severity.INFO,
        hardware=False,
        action="look the code up in NVIDIA's current XID catalog; regenerate detectors/xid_nvidia.py from a "
        "newer Xid-Catalog.xlsx (scripts/generate_xid_catalog.py)",
        basis="unknown code: stored and flagged, at most one info incident per node per day",
        known=False,
    )


#: Every code of NVIDIA's catalog as classified without a message or context.
CATALOG: Final[dict[int, XidInfo]] = {code: _base(entry) for code, entry in sorted(XIDS.items())}


def classify_xid(code: int, message: str = "", recent: Collection[int] = ()) -> XidInfo:
    """Classify one XID line; unknown codes are flagged, never rejected.

    Parameters
    ----------
    code
        The XID.
    message
        The driver's text after the code (``XidEvent.message``); 74, 144-150 and 154 read it.
    recent
        XIDs the same GPU logged in the :data:`CONTEXT_WINDOW_MS` before this line (event time):
        48 with 63/64 and 45 with other XIDs follow NVIDIA's workflows.

    Returns
    -------
    XidInfo
        Category, severity, hardware flag, action, NVIDIA's action and the basis of the decision.

    Examples
    --------
    >>> classify_xid(79).severity.value, classify_xid(79).hardware
    ('critical', True)
    >>> classify_xid(13).severity.value, classify_xid(9999).category.value
    ('info', 'unknown')

    XID 154 pages or not as the driver says:

    >>> line = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    >>> classify_xid(154, line).severity.value, classify_xid(154, line).nvidia_action
    ('critical', 'XID_154 -> Node Reboot Required')
    >>> cleared = "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
    >>> classify_xid(154, cleared).severity.value
    'info'

    A row remap that follows a DBE is part of it:

    >>> info = classify_xid(63, "Row Remapper: New row marked for remapping", recent=(48,))
    >>> info.category.value, info.severity.value
    ('memory', 'critical')
    """
    if code not in XIDS:
        return _unknown(code)
    return _classify_line(code, message, _context(code, recent))


def _context(code: int, recent: Collection[int]) -> tuple[int, ...]:
    """What a code's classification reads of the GPU's recent XIDs (:func:`_classify`): whether
    63/64 came with a 48, whether a 48 came with a 63/64, which others came with a 45.

    >>> _context(48, [13, 64, 13]), _context(63, [48]), _context(45, [45, 31, 13, 31]), _context(79, [48])
    ((64,), (48,), (13, 31), ())
    """
    if code == 48:
        return tuple(c for c in (63, 64) if c in recent)
    if code in (63, 64):
        return (48,) if 48 in recent else ()
    if code == 45:
        return tuple(sorted({c for c in recent if c != 45}))
    return ()


# A storm repeats one line thousands of times, and the core asks for its classification several
# times a line (the incident, the storm's detector, whether it is a job's): one XidInfo (frozen)
# per code, message and context read, instead of the message rules and copies each time.
@lru_cache(maxsize=4096)
def _classify_line(code: int, message: str, context: tuple[int, ...]) -> XidInfo:
    return _classify(XIDS[code], message, context)


@dataclass(frozen=True, slots=True, kw_only=True)
class XidOverride:
    """A catalog entry changed or added for one code: a rule change to try before it is made.

    ``faultstream diff --catalog FILE`` replays history with overrides to show which incidents the
    change adds, removes or changes; a change that is kept is then written as a :class:`Deviation`.
    An override replaces the fields it names on every line of the code, after the message rules
    (a 154 overridden to ``warn`` is ``warn`` whatever recovery action its line states).

    Attributes
    ----------
    code
        The XID.
    name, category, severity, hardware, action
        The fields to replace (None keeps the catalog's). A code outside NVIDIA's catalog needs a
        ``category`` and a ``severity`` to be more than ``unknown``.
    source
        Where the override came from (a file), shown as the basis of the classification.

    Examples
    --------
    >>> app_as_hw = XidOverride(code=13, severity=Severity.CRITICAL, hardware=True)
    >>> info = app_as_hw.apply(classify_xid(13))
    >>> info.severity.value, info.category.value, info.job_evidence
    ('critical', 'application', True)
    >>> new = XidOverride(code=999, category=XidCategory.MEMORY, severity=Severity.WARN)
    >>> new.apply(classify_xid(999)).category.value, new.apply(classify_xid(999)).known
    ('memory', True)
    """

    code: int
    name: str | None = None
    category: XidCategory | None = None
    severity: Severity | None = None
    hardware: bool | None = None
    action: str | None = None
    source: str = "a catalog override"

    def apply(self, info: XidInfo) -> XidInfo:
        """``info`` with this override's fields in place of the catalog's."""
        category = self.category or info.category
        changed = replace(
            info,
            name=info.name if self.name is None else self.name,
            category=category,
            severity=self.severity or info.severity,
            hardware=info.hardware if self.hardware is None else self.hardware,
            action=info.action if self.action is None else self.action,
            basis=f"override ({self.source}) of: {info.basis}",
            known=info.known or category is not XidCategory.UNKNOWN,
        )
        if self.severity is not None or self.hardware is not None:
            # A deviation's job-evidence exception was made for its own severity and hardware flag.
            changed = replace(changed, deviation=None)
        return changed
