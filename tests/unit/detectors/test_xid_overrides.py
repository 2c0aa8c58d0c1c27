"""XID catalog overrides: the core classifies a code as the override says, and only that code."""

from __future__ import annotations

from detectors.core import CoreConfig, DetectionCore
from detectors.xid_catalog import XidCategory, XidOverride, classify_xid
from schemas.outputs import IncidentKind, Severity
from schemas.records import XidEvent


def incidents(core: DetectionCore, *xids: int) -> list[tuple[str, str]]:
    for n, code in enumerate(xids):
        core.process(XidEvent(ts_ms=n * 1000, cluster="c", node="n1", xid=code, pci_bus_id="0000:07:00"))
    return sorted({(i.kind.value, i.severity.value) for i in core.finish().incidents})


def test_without_overrides_an_application_xid_opens_nothing() -> None:
    assert incidents(DetectionCore(CoreConfig()), 13) == []


def test_an_override_makes_an_application_xid_page() -> None:
    core = DetectionCore(CoreConfig(), xid_overrides=[XidOverride(code=13, severity=Severity.CRITICAL)])
    assert incidents(core, 13, 31) == [("gpu_application", "critical")]


def test_a_new_entry_turns_an_unknown_code_into_an_incident_of_its_family() -> None:
    assert incidents(DetectionCore(CoreConfig()), 999) == [("xid_unknown", "info")]
    new = XidOverride(code=999, category=XidCategory.MEMORY, severity=Severity.WARN, name="new fault")
    assert incidents(DetectionCore(CoreConfig(), xid_overrides=[new]), 999) == [("gpu_memory", "warn")]


def test_an_override_can_quiet_a_critical_code() -> None:
    core = DetectionCore(CoreConfig(), xid_overrides=[XidOverride(code=79, severity=Severity.INFO)])
    assert incidents(core, 79) == []
    assert incidents(DetectionCore(CoreConfig()), 79) == [(IncidentKind.GPU_BUS.value, "critical")]


def test_an_override_names_its_source_and_keeps_what_it_does_not_set() -> None:
    info = XidOverride(code=79, action="call Bob", source="rules.toml").apply(classify_xid(79))
    base = classify_xid(79)
    assert (info.action, info.severity, info.category, info.hardware) == (
        "call Bob",
        base.severity,
        base.category,
        base.hardware,
    )
    assert info.basis.startswith("override (rules.toml) of: ")
    assert info.deviation is None and base.deviation is None


def test_a_checkpointed_core_from_before_overrides_unpickles_without_them() -> None:
    core = DetectionCore(CoreConfig())
    state = dict(core.__dict__) if hasattr(core, "__dict__") else {}
    state.pop("_xid_overrides", None)
    restored = DetectionCore.__new__(DetectionCore)
    restored.__setstate__(state)
    assert incidents(restored, 13, 79) == [("gpu_bus", "critical")]
