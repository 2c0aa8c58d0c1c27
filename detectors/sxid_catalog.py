"""SXid classification: NVSwitch errors (``nvidia-nvswitchN: SXid (PCI:…): CODE, …``) as severity and action.

Source: NVIDIA Fabric Manager User Guide (DU-09883-001, docs.nvidia.com/datacenter/tesla/
fabric-manager-user-guide), appendix "NVSwitch SXid Errors": the tables of *non-fatal* SXids,
*fatal* SXids (fatal to the partitions whose traffic crosses the port; the fatal SXid is propagated
to the GPUs as XID 74 where it applies; recovery: reset the affected GPUs and NVSwitches / restart
the guest VMs) and *always fatal* SXids (fatal to the whole fabric: reset all GPUs and NVSwitches,
i.e. restart the host), and the "other notable" SXids (thermal events, link heartbeat, host
interface errors). Codes and names below are NVIDIA's; the severity and action are ours, by the
mapping:

* ``always fatal`` -> ``critical``: restart the host (reset every GPU and NVSwitch);
* ``fatal`` -> ``critical``: reset the affected GPUs and NVSwitches; the line's own word decides
  when it says ``Non-fatal`` (a potentially fatal error reported as non-fatal) -> ``warn``;
* ``non-fatal`` -> ``info`` when NVIDIA says the hardware corrects it (single-bit ECC, replay) and
  gives no recovery; ``warn`` when NVIDIA names a recovery step (a configuration or link check);
  ``critical`` where NVIDIA's recovery is a reset of all GPUs and NVSwitches (19084, 10003).

The driver prints ``Fatal`` or ``Non-fatal`` after the code; that word wins over the table for the
codes NVIDIA lists as potentially fatal, and classifies codes missing from the table. A fatal
NVSwitch error takes down the NVLink traffic of every GPU behind the switch, so it is hardware
evidence for every failed job on the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from schemas.outputs import IncidentKind, Severity

__all__ = ["SXID_CATALOG", "SxidClass", "SxidInfo", "classify_sxid"]

SOURCE: Final = "NVIDIA Fabric Manager User Guide (DU-09883-001), appendix 'NVSwitch SXid Errors'"


class SxidClass(StrEnum):
    """The Fabric Manager guide's tables."""

    NON_FATAL = "non-fatal"
    FATAL = "fatal"
    ALWAYS_FATAL = "always fatal"
    NOTABLE = "other notable"


@dataclass(frozen=True, slots=True)
class SxidInfo:
    """What one SXid (line) means.

    Attributes
    ----------
    code, name
        The SXid and NVIDIA's name for it.
    fm_class
        The Fabric Manager guide's table (``None`` for a code missing from it).
    severity, hardware, action
        As for XIDs: only ``critical`` pages; hardware ones are evidence of job failures.
    basis
        Why this line got this classification.
    known
        False for a code outside the guide's tables.
    """

    code: int
    name: str
    fm_class: SxidClass | None
    severity: Severity
    hardware: bool
    action: str
    basis: str
    known: bool = True

    @property
    def incident_kind(self) -> IncidentKind:
        """``nvswitch_fatal`` for critical SXids, ``nvswitch_nonfatal`` otherwise."""
        return (
            IncidentKind.NVSWITCH_FATAL
            if self.severity is Severity.CRITICAL
            else IncidentKind.NVSWITCH_NONFATAL
        )


_RESET_FABRIC = (
    "drain the node; reset all its GPUs and NVSwitches (restart the host); RMA the switch tray if it recurs"
)
_RESET_PORT = (
    "drain the node; reset the GPUs and NVSwitches whose traffic crosses this port (restart the affected "
    "VMs); check the link if it recurs"
)
_S = Severity
_N, _F, _AF, _O = SxidClass.NON_FATAL, SxidClass.FATAL, SxidClass.ALWAYS_FATAL, SxidClass.NOTABLE

# (codes, name, class, severity, action) per the guide's tables.
_ROWS: Final[tuple[tuple[tuple[int, ...], str, SxidClass, Severity, str], ...]] = (
    # Non-fatal.
    ((11004,), "Ingress invalid ACL", _N, _S.WARN, "validate the fabric partition routing (nvswitch-audit); "
     "restart the affected VM: an incorrect Fabric Manager partition configuration"),
    ((11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059, 19062, 19065, 19068,
      19071, 24001, 24002, 24003), "Single bit ECC error", _N, _S.INFO,
     "none: the NVSwitch corrects single-bit errors"),
    ((12028,), "Egress non-posted PRIV error", _N, _S.WARN, "restart the affected VM"),
    ((20001,), "TX replay error", _N, _S.INFO, "none: the link replayed the packet"),
    ((20009,), "RX short error rate", _N, _S.INFO, "none; check the link if it keeps recurring"),
    ((22013,), "Minion link DLREQ interrupt", _N, _S.INFO, "none"),
    ((19084,), "AN1 heartbeat timeout error", _N, _S.CRITICAL, _RESET_FABRIC),
    ((20012,), "Broken/inconsistent connection", _N, _S.WARN,
     "if no host was shut down uncoordinated, check the link's mechanical connections"),
    # Fatal (potentially: to the partitions crossing the port).
    ((11001,), "Ingress invalid command", _F, _S.CRITICAL, _RESET_PORT),
    ((11009,), "Ingress invalid VCSet", _F, _S.CRITICAL, _RESET_PORT),
    ((11013,), "Ingress header DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((11018,), "Ingress RID DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((11019,), "Ingress RLAN DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((11020,), "Ingress control parity", _F, _S.CRITICAL, _RESET_PORT),
    ((12001,), "Egress crossbar overflow", _F, _S.CRITICAL, _RESET_PORT),
    ((12002,), "Egress packet route", _F, _S.CRITICAL, _RESET_PORT),
    ((12022,), "Egress input ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((12024,), "Egress output ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((12025,), "Egress credit overflow", _F, _S.CRITICAL, _RESET_PORT),
    ((12026,), "Egress destination request ID error", _F, _S.CRITICAL, _RESET_PORT),
    ((12027,), "Egress destination response ID error", _F, _S.CRITICAL, _RESET_PORT),
    ((12030,), "Egress control parity error", _F, _S.CRITICAL, _RESET_PORT),
    ((12031,), "Egress credit parity error", _F, _S.CRITICAL, _RESET_PORT),
    ((12032,), "Egress flit type mismatch", _F, _S.CRITICAL, _RESET_PORT),
    ((14017,), "TS ATO timeout", _F, _S.CRITICAL, _RESET_PORT),
    ((15001,), "Route buffer over/underflow", _F, _S.CRITICAL, _RESET_PORT),
    ((15006,), "Route transdone over/underflow", _F, _S.CRITICAL, _RESET_PORT),
    ((15009,), "Route GLT DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((15010,), "Route parity", _F, _S.CRITICAL, _RESET_PORT),
    ((15012,), "Route incoming DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((15013,), "Route credit parity", _F, _S.CRITICAL, _RESET_PORT),
    ((19047,), "NCISOC HDR ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19048,), "NCISOC DAT ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19054,), "HDR RAM ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19056,), "DAT0 RAM ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19058,), "DAT1 RAM ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19060,), "CREQ RAM HDR ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19061,), "CREQ RAM DAT ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19063,), "Response RAM HDR ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19064,), "Response RAM DAT ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19066,), "COM RAM HDR ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19067,), "COM RAM DAT ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19069,), "RSP1 RAM HDR ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((19070,), "RSP1 RAM DAT ECC DBE error", _F, _S.CRITICAL, _RESET_PORT),
    ((20034,), "LTSSM fault up", _F, _S.CRITICAL, _RESET_PORT),
    ((22012,), "Minion link NA interrupt", _F, _S.CRITICAL,
     "drain the node; if no host was shut down uncoordinated, check the link's mechanical connections; reset "
     "the GPUs and NVSwitches on the link"),
    ((24004,), "Sourcetrack TCEN0 crumbstore DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((24005,), "Sourcetrack TCEN0 TD crumbstore DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((24006,), "Sourcetrack TCEN1 crumbstore DBE", _F, _S.CRITICAL, _RESET_PORT),
    ((24007,), "Sourcetrack timeout error", _F, _S.CRITICAL, _RESET_PORT),
    # Always fatal (to the whole fabric).
    ((12020,), "Egress sequence ID error", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((22003,), "Minion halt", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((22011,), "Minion exterror", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23001, 23010), "Ingress SRC-VC buffer overflow", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23002, 23011), "Ingress SRC-VC buffer underflow", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23003, 23012), "Egress DST-VC credit overflow", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23004, 23013), "Egress DST-VC credit underflow", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23005, 23014), "Ingress packet burst error", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23006, 23015), "Ingress packet sticky error", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23007, 23016), "Possible bubbles at ingress", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23008,), "Ingress packet invalid dst error", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23009,), "Ingress packet parity error", _AF, _S.CRITICAL, _RESET_FABRIC),
    ((23017,), "Ingress credit parity error", _AF, _S.CRITICAL, _RESET_FABRIC),
    # Other notable.
    ((10001,), "Host priv error", _O, _S.WARN, "none by itself; watch for the fatal SXids that may follow"),
    ((10002,), "Host priv timeout", _O, _S.WARN, "none by itself; watch for the fatal SXids that may follow"),
    ((10003,), "Host unhandled interrupt", _O, _S.CRITICAL, _RESET_FABRIC),
    ((10004,), "Host thermal event start", _O, _S.WARN,
     "check the system's cooling: links may drop to single-lane mode and lose NVLink throughput"),
    ((10005,), "Host thermal event end", _O, _S.INFO, "none; check the cooling if thermal events recur"),
)  # fmt: skip


def _catalog() -> dict[int, SxidInfo]:
    catalog: dict[int, SxidInfo] = {}
    for codes, name, fm_class, severity, action in _ROWS:
        for code in codes:
            catalog[code] = SxidInfo(
                code=code,
                name=name,
                fm_class=fm_class,
                severity=severity,
                hardware=severity is not Severity.INFO,
                action=action,
                basis=f"Fabric Manager guide: {fm_class.value} SXid",
            )
    return catalog


#: Every SXid of the Fabric Manager guide's tables, classified without a message.
SXID_CATALOG: Final[dict[int, SxidInfo]] = _catalog()

_FATALITY = re.compile(r"(?:^|[\s,])(non-?fatal|fatal)\b", re.IGNORECASE)


def classify_sxid(code: int, message: str = "") -> SxidInfo:
    """Classify one SXid line.

    Parameters
    ----------
    code
        The SXid.
    message
        The text after the code (``Fatal, Link 28 LTSSM Fault Up``): its Fatal/Non-fatal word
        decides for potentially fatal codes and for codes missing from the guide.

    Examples
    --------
    >>> classify_sxid(20034, "Fatal, Link 28 LTSSM Fault Up").severity.value
    'critical'
    >>> classify_sxid(20034, "Non-fatal, Link 28 LTSSM Fault Up").severity.value
    'warn'
    >>> classify_sxid(11012).severity.value, classify_sxid(23001).fm_class.value
    ('info', 'always fatal')
    >>> info = classify_sxid(99999, "Fatal, something new")
    >>> info.known, info.severity.value, info.incident_kind.value
    (False, 'critical', 'nvswitch_fatal')
    """
    word = _FATALITY.search(message)
    fatal = None if word is None else not word.group(1).lower().startswith("non")
    info = SXID_CATALOG.get(code)
    if info is None:
        severity = {True: Severity.CRITICAL, False: Severity.WARN, None: Severity.WARN}[fatal]
        said = {
            True: "the line says Fatal",
            False: "the line says Non-fatal",
            None: "no Fatal/Non-fatal word",
        }
        return SxidInfo(
            code=code,
            name=f"SXid {code} is not in the Fabric Manager guide's tables",
            fm_class=None,
            severity=severity,
            hardware=True,
            action=_RESET_PORT if fatal else "look the code up in the current Fabric Manager user guide",
            basis=f"unknown SXid: {said[fatal]}",
            known=False,
        )
    if info.fm_class is SxidClass.FATAL and fatal is False:
        return SxidInfo(
            code=code,
            name=info.name,
            fm_class=info.fm_class,
            severity=Severity.WARN,
            hardware=True,
            action="none now (reported non-fatal); a reset of the switch's GPUs is due if it turns fatal",
            basis="Fabric Manager guide: potentially fatal SXid, and the line says Non-fatal",
        )
    return info
