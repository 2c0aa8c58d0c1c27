"""XID classification: NVIDIA's XID catalog as category, severity and suggested action (SPEC 4.1).

The entries follow NVIDIA's "Xid Errors" catalog for Ampere and newer GPUs and its resolution
buckets (``RESTART_APP``, ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT``). Two decisions are
ours, taken from Kokolis et al. (HPCA 2025) and Meta's GCM health checks:

* application-class XIDs (13, 31, 43, 45, 68, 69, 109 …) are raised by a faulty program far more
  often than by a faulty GPU; on their own they are ``info`` and never page;
* hardware-class XIDs that need a GPU reset, a node drain or an RMA are ``critical`` and open an
  incident at the first line; they are the "hardware-class events" of job-failure attribution.

An XID missing from the catalog is classified ``unknown``/``warn``: kept, flagged, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from schemas.outputs import IncidentKind, Severity

__all__ = ["XidCategory", "XidInfo", "classify_xid"]


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
class XidInfo:
    """What one XID code means for an operator.

    Attributes
    ----------
    code
        The XID code.
    name
        Short description from NVIDIA's catalog.
    category
        Family of the fault.
    severity
        ``info`` never pages, ``warn`` opens an incident without paging, ``critical`` pages.
    hardware
        True when the XID points at the GPU, the board or the fabric rather than the program;
        only these count as evidence when a failed job is attributed to hardware.
    action
        NVIDIA's resolution bucket and what it means on a cluster.
    """

    code: int
    name: str
    category: XidCategory
    severity: Severity
    hardware: bool
    action: str


_RESTART_APP = "RESTART_APP: restart the job; no hardware action"
_RESET_GPU = "RESET_GPU: drain the node, reset the GPU, run diagnostics before returning it"
_REBOOT = "RESTART_BM: drain and reboot the node; RMA the GPU if it recurs"
_RMA = "CONTACT_SUPPORT: drain the node, run field diagnostics, open an RMA"
_RESET_SOON = "RESET_GPU at the next drain: the pending row remap applies on reset"
_INVESTIGATE = "check the driver version and the node's health; escalate if it recurs"

_A = XidCategory
_S = Severity


def _entries() -> dict[int, XidInfo]:
    rows: list[tuple[int, str, XidCategory, Severity, bool, str]] = [
        # Application class: the program, not the GPU (info, never pages on its own).
        (13, "Graphics Engine Exception", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (31, "GPU memory page fault", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (32, "Invalid or corrupted push buffer stream", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (
            43,
            "GPU stopped processing (reset channel verification error)",
            _A.APPLICATION,
            _S.INFO,
            False,
            _RESTART_APP,
        ),
        (45, "Preemptive cleanup, due to previous errors", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (68, "NVDEC0 exception / video processor exception", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (69, "Graphics Engine class error", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        (109, "Context switch timeout", _A.APPLICATION, _S.INFO, False, _RESTART_APP),
        # Driver / engine faults that the catalog resolves with an application restart.
        (8, "GPU stopped processing", _A.DRIVER, _S.WARN, False, _RESTART_APP),
        (38, "Driver firmware error", _A.DRIVER, _S.WARN, False, _INVESTIGATE),
        (44, "Graphics Engine fault during context switch", _A.ENGINE, _S.WARN, True, _RESET_GPU),
        (56, "Display Engine error", _A.ENGINE, _S.WARN, True, _INVESTIGATE),
        (57, "Error programming video memory interface", _A.MEMORY, _S.CRITICAL, True, _RMA),
        (58, "Unstable video memory interface detected", _A.MEMORY, _S.CRITICAL, True, _RMA),
        # Memory: uncorrectable ECC and row remapping.
        (48, "Double Bit ECC Error (DBE)", _A.MEMORY, _S.CRITICAL, True, _RESET_GPU),
        (
            63,
            "ECC page retirement or row remapping recording event",
            _A.ROW_REMAP,
            _S.WARN,
            True,
            _RESET_SOON,
        ),
        (64, "ECC page retirement or row remapper recording failure", _A.ROW_REMAP, _S.CRITICAL, True, _RMA),
        (92, "High single-bit ECC error rate", _A.MEMORY, _S.WARN, True, _INVESTIGATE),
        (94, "Contained ECC error", _A.MEMORY, _S.CRITICAL, True, _RESET_GPU),
        (95, "Uncontained ECC error", _A.MEMORY, _S.CRITICAL, True, _RESET_GPU),
        (140, "Unrecovered ECC error", _A.MEMORY, _S.CRITICAL, True, _RESET_GPU),
        # Micro-controllers and firmware.
        (61, "Internal micro-controller breakpoint/warning", _A.FIRMWARE, _S.WARN, True, _RESET_GPU),
        (62, "Internal micro-controller halt", _A.FIRMWARE, _S.CRITICAL, True, _RESET_GPU),
        (119, "GSP RPC timeout", _A.FIRMWARE, _S.CRITICAL, True, _RESET_GPU),
        (120, "GSP error", _A.FIRMWARE, _S.CRITICAL, True, _RESET_GPU),
        (121, "C2C link corrected error", _A.NVLINK, _S.WARN, True, _INVESTIGATE),
        (122, "SPI PMU RPC read failure", _A.FIRMWARE, _S.WARN, True, _INVESTIGATE),
        (123, "SPI PMU RPC write failure", _A.FIRMWARE, _S.WARN, True, _INVESTIGATE),
        (124, "SPI PMU RPC erase failure", _A.FIRMWARE, _S.WARN, True, _INVESTIGATE),
        (143, "GPU initialization failure", _A.FIRMWARE, _S.CRITICAL, True, _RMA),
        (154, "GPU recovery action changed", _A.FIRMWARE, _S.CRITICAL, True, _RESET_GPU),
        # Interconnect and bus.
        (74, "NVLink error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (79, "GPU has fallen off the bus", _A.BUS, _S.CRITICAL, True, _REBOOT),
        (144, "NVLink: SAW MVB non-fatal error", _A.NVLINK, _S.WARN, True, _INVESTIGATE),
        (145, "NVLink: RLW error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (146, "NVLink: TLW error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (147, "NVLink: TREX error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (148, "NVLink: NVLPW_CTRL error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (149, "NVLink: NETIR error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        (150, "NVLink: MSE error", _A.NVLINK, _S.CRITICAL, True, _RESET_GPU),
        # Thermal and power.
        (54, "Auxiliary power is not connected to the GPU board", _A.THERMAL_POWER, _S.CRITICAL, True, _RMA),
        (88, "Power brake asserted / thermal slowdown", _A.THERMAL_POWER, _S.WARN, True, _INVESTIGATE),
    ]
    return {
        code: XidInfo(code, name, category, severity, hardware, action)
        for code, name, category, severity, hardware, action in rows
    }


CATALOG: Final[dict[int, XidInfo]] = _entries()


def classify_xid(code: int) -> XidInfo:
    """Return what an XID code means; unknown codes are flagged, never rejected.

    >>> classify_xid(79).severity, classify_xid(79).hardware
    (<Severity.CRITICAL: 'critical'>, True)
    >>> classify_xid(13).severity.value
    'info'
    >>> classify_xid(9999).category.value
    'unknown'
    """
    info = CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        f"XID {code} is not in faultstream's catalog",
        XidCategory.UNKNOWN,
        Severity.WARN,
        False,
        "look the code up in NVIDIA's current XID catalog and add it to detectors/xid_catalog.py",
    )
