"""One XID from the kernel log and from DCGM's gauge of the last XID: one XID (detectors/xid_reports)."""

import pickle
from dataclasses import replace

import pytest

from detectors.core import CoreConfig, DetectionCore
from schemas.records import JobEvent, JobState, XidEvent

MIN = 60_000
HOUR = 3_600_000
T0 = 1_704_067_200_000
BUS = "0000:3b:00"


def logged(ts, code=79, bus=BUS, node="n1"):
    """The driver's line, as the kernel-log parser reads it."""
    return XidEvent(ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id=bus, pid=7, process="python",
                    message="GPU has fallen off the bus.")  # fmt: skip


def gauged(ts, since, code=79, bus=BUS, node="n1"):
    """A change of DCGM_FI_DEV_XID_ERRORS, as the DCGM parser and the receiver make it."""
    return XidEvent(ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id=bus, gpu=0,
                    message="reported by DCGM field 230", since_ms=since)  # fmt: skip


def outcome(records):
    """Every incident version, and which records the core took as repeats (an application XID a
    day later on another node moves the watermark past every quiet period at the end)."""
    core = DetectionCore(CoreConfig())
    repeats = []
    for record in records:
        repeats.append(core.repeats(record))
        assert core.process(record)
    assert core.process(logged(T0 + 30 * HOUR, code=13, node="n9"))
    versions = [*core.drain().incidents, *core.finish().incidents]
    xids = [i for i in versions if "xid_counts" in i.evidence]  # not the failed job's own incident
    return [
        (i.incident_id, i.status.value, i.evidence_count, i.evidence["xid_counts"]) for i in xids
    ], repeats


def everything(records):
    """All the core decided: incidents, attributions, MTTF rows."""
    core = DetectionCore(CoreConfig())
    for record in [*records, logged(T0 + 30 * HOUR, code=13, node="n9")]:
        assert core.process(record)
    out = [core.drain(), core.finish()]
    return [(e.incidents, e.attributions, e.mttf) for e in out]


def job_records():
    return [
        JobEvent(ts_ms=T0, cluster="c", job_id="j1", state=JobState.RUNNING, nodes=("n1",), gpus=8, start_ms=T0),
        JobEvent(ts_ms=T0 + 2 * MIN, cluster="c", job_id="j1", state=JobState.FAILED, nodes=("n1",), gpus=8,
                 start_ms=T0, end_ms=T0 + 2 * MIN),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "gauge_after",
    [30_000, 50 * MIN, 5 * HOUR],  # a 30 s scrape, within the quiet period, after it (6 h scrapes)
)
def test_the_gauge_after_the_kernel_line_changes_nothing(gauge_after):
    kernel = [*job_records(), logged(T0 + MIN)]
    alone, _ = outcome(kernel)
    both, repeats = outcome(
        [*kernel, gauged(T0 + MIN + gauge_after, since=T0 + MIN - 6 * HOUR + gauge_after)]
    )
    assert both == alone
    assert repeats == [False, False, False, True]
    assert everything([*kernel, gauged(T0 + MIN + gauge_after, since=T0)]) == everything(kernel)
    assert [(status, count) for _, status, count, _ in both] == [("open", 1), ("resolved", 1)]


def test_a_first_sample_of_the_gauge_covers_any_time_before():
    kernel = [logged(T0)]
    alone, _ = outcome(kernel)
    both, repeats = outcome([*kernel, gauged(T0 + 20 * HOUR, since=0)])
    assert (both, repeats) == (alone, [False, True])


def test_a_gauge_change_the_kernel_log_has_no_line_for_is_an_xid():
    # The kernel line came before the gauge's previous sample: the change is another XID (the
    # same code again, after a 0), whose line the kernel log lost.
    found, repeats = outcome([logged(T0), gauged(T0 + 7 * HOUR, since=T0 + HOUR)])
    assert repeats == [False, False]
    assert [(status, count) for _, status, count, _ in found] == [
        ("open", 1), ("resolved", 1), ("open", 1), ("resolved", 1),
    ]  # fmt: skip
    only, _ = outcome([gauged(T0 + 7 * HOUR, since=T0 + HOUR)])
    assert [(status, count) for _, status, count, _ in only] == [("open", 1), ("resolved", 1)]


def test_other_codes_and_other_gpus_are_other_xids():
    _, repeats = outcome([
        logged(T0), gauged(T0 + MIN, since=0, code=48), gauged(T0 + MIN, since=0, bus="0000:07:00"),
        replace(gauged(T0 + MIN, since=0), pci_bus_id=""),  # an exporter without pci_bus_id: GPU "0"
        gauged(T0 + MIN, since=0, node="n2"),
    ])  # fmt: skip
    assert repeats == [False, False, False, False, False]


def test_the_gauge_first_pairs_with_one_kernel_line_of_its_interval():
    # Out of time order (a kernel log that came late): the gauge stands, its interval's first
    # kernel line is its repeat, a second line of the same failure counts as it does alone.
    found, repeats = outcome([gauged(T0 + MIN, since=T0 - HOUR), logged(T0), logged(T0 + 30_000)])
    assert repeats == [False, True, False]
    assert [(status, count, codes) for _, status, count, codes in found] == [
        ("open", 1, {"79": 1}), ("updated", 2, {"79": 2}), ("resolved", 2, {"79": 2}),
    ]  # fmt: skip
    # A kernel line after the gauge's own time is another XID.
    _, repeats = outcome([gauged(T0 + MIN, since=T0 - HOUR), logged(T0 + 2 * MIN)])
    assert repeats == [False, False]


def test_nvswitch_sxids_are_never_paired():
    switch = replace(logged(T0, code=12028), device="nvswitch")
    _, repeats = outcome([switch, replace(gauged(T0 + MIN, since=0, code=12028), device="nvswitch")])
    assert repeats == [False, False]


def test_a_checkpoint_between_the_two_reports_keeps_the_pairing():
    core = DetectionCore(CoreConfig())
    assert core.process(logged(T0))
    restored = pickle.loads(pickle.dumps(core))
    assert restored.repeats(gauged(T0 + HOUR, since=T0 - HOUR))
    # A checkpoint from before the pairing existed: nothing to pair with, nothing refused.
    state = core.__dict__.copy()
    del state["_reports"]
    old = DetectionCore.__new__(DetectionCore)
    old.__setstate__(state)
    assert not old.repeats(gauged(T0 + HOUR, since=T0 - HOUR))
    assert old.process(gauged(T0 + HOUR, since=T0 - HOUR))
