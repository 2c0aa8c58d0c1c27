from detectors.ecc_rules import ecc_step
from schemas.outputs import Severity


def test_first_sample_is_a_baseline_for_counters():
    step = ecc_step(None, {"dbe_volatile": 3, "dbe_aggregate": 9, "sbe_volatile": 100})
    assert step.findings == ()
    assert dict(step.deltas) == {}
    assert not step.reset


def test_dbe_increase_is_critical_with_the_delta_as_evidence():
    step = ecc_step({"dbe_volatile": 0, "dbe_aggregate": 4}, {"dbe_volatile": 2, "dbe_aggregate": 6})
    [finding] = step.findings
    assert finding.kind == "gpu_memory"
    assert finding.severity is Severity.CRITICAL
    assert dict(finding.counter_deltas) == {"dbe_volatile": 2, "dbe_aggregate": 2}


def test_counter_reset_counts_errors_since_the_reset_and_invents_none():
    # Reboot: volatile counters restart from zero; no new error.
    quiet = ecc_step({"sbe_volatile": 50, "dbe_volatile": 1}, {"sbe_volatile": 0, "dbe_volatile": 0})
    assert quiet.reset
    assert quiet.findings == ()
    assert dict(quiet.deltas) == {}
    # Reboot followed by a new DBE before the next sample: still caught.
    fresh = ecc_step({"dbe_volatile": 5}, {"dbe_volatile": 1})
    assert fresh.reset
    assert [f.kind for f in fresh.findings] == ["gpu_memory"]


def test_correctable_errors_alone_raise_nothing():
    step = ecc_step({"sbe_volatile": 1, "dbe_volatile": 0}, {"sbe_volatile": 40, "dbe_volatile": 0})
    assert step.findings == ()
    assert step.deltas["sbe_volatile"] == 39


def test_remap_failure_and_pending_retirement_fire_when_they_become_set():
    step = ecc_step(
        {"remap_failure": 0, "retired_pages_pending": 0}, {"remap_failure": 1, "retired_pages_pending": 2}
    )
    kinds = sorted((f.kind, f.title) for f in step.findings)
    assert kinds == [
        ("gpu_row_remap", "Pending page retirement / row remap"),
        ("gpu_row_remap", "Row remapping failed"),
    ]
    # Still set on the next sample: not a new finding.
    again = ecc_step(
        {"remap_failure": 1, "retired_pages_pending": 2}, {"remap_failure": 1, "retired_pages_pending": 2}
    )
    assert again.findings == ()


def test_flag_already_set_on_first_sample_raises():
    step = ecc_step(None, {"remap_failure": 1})
    assert [f.kind for f in step.findings] == ["gpu_row_remap"]
