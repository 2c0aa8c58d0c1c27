"""The detection core: attribution windows, incident lifecycle, MTTF partial rows, lateness, determinism."""

from collections import defaultdict

import pytest

from detectors.core import CoreConfig, DetectionCore, Emitted
from schemas.outputs import IncidentKind, IncidentStatus, Severity
from schemas.records import EccSample, JobEvent, JobState, XidEvent

MIN = 60_000
HOUR = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z, a window boundary


def xid(ts, node="n1", code=79, bus="0000:07:00"):
    return XidEvent(ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id=bus, message=f"xid {code}")


def job(ts, job_id, state, nodes=("n1",), gpus=8, start=None, end=None):
    return JobEvent(
        ts_ms=ts, cluster="c", job_id=job_id, state=state, nodes=nodes, gpus=gpus, start_ms=start, end_ms=end
    )


def run_all(records, config=None, drain_every=1):
    core = DetectionCore(config or CoreConfig())
    out = Emitted()
    for number, record in enumerate(records, 1):
        assert core.process(record)
        if number % drain_every == 0:
            _extend(out, core.drain())
    _extend(out, core.drain())
    _extend(out, core.finish())
    return core, out


def _extend(into, emitted):
    into.incidents += emitted.incidents
    into.attributions += emitted.attributions
    into.mttf += emitted.mttf
    into.ecc_rows += emitted.ecc_rows


def failed_job_with_xid_at(offset_ms, code=79, xid_node="n1", state=JobState.FAILED):
    end = T0 + 2 * HOUR
    records = [
        job(T0, "j1", JobState.RUNNING, nodes=("n1", "n2"), gpus=16, start=T0),
        job(end, "j1", state, nodes=("n1", "n2"), gpus=16, start=T0, end=end),
        xid(end + offset_ms, node=xid_node, code=code),
        xid(end + 2 * HOUR, node="n9", code=13),  # moves the watermark past the decision
    ]
    records.sort(key=lambda r: r.ts_ms)
    _, out = run_all(records)
    [attribution] = out.attributions
    return attribution, out


@pytest.mark.parametrize(
    ("offset_ms", "expected"),
    [
        (-10 * MIN, True),
        (-5 * MIN, True),
        (0, True),
        (5 * MIN, True),
        (-10 * MIN - 1, False),
        (5 * MIN + 1, False),
    ],
)
def test_attribution_window_is_ten_minutes_before_to_five_after(offset_ms, expected):
    attribution, _ = failed_job_with_xid_at(offset_ms)
    assert attribution.hardware is expected


def test_attribution_ignores_application_xids_and_other_nodes():
    assert not failed_job_with_xid_at(-MIN, code=13)[0].hardware
    assert not failed_job_with_xid_at(-MIN, xid_node="n7")[0].hardware
    assert failed_job_with_xid_at(-MIN, xid_node="n2")[0].hardware


def test_attributed_failure_names_job_size_nodes_and_evidence():
    attribution, out = failed_job_with_xid_at(-2 * MIN, state=JobState.NODE_FAIL)
    assert attribution.evidence_nodes == ("n1",)
    assert attribution.evidence_xids == (79,)
    assert attribution.size_bucket == "8-63"
    [job_incident] = [i for i in out.incidents if i.kind == IncidentKind.JOB_HW_FAILURE]
    assert job_incident.incident_id == attribution.incident_id
    assert job_incident.evidence["job_id"] == "j1"
    assert job_incident.evidence["gpus"] == 16
    assert job_incident.evidence["nodes"] == ["n1", "n2"]
    assert "j1" in job_incident.summary and "NODE_FAIL" in job_incident.summary


def test_attribution_waits_for_the_watermark():
    core = DetectionCore(CoreConfig())
    end = T0 + HOUR
    core.process(job(end, "j1", JobState.FAILED, start=T0, end=end))
    core.process(xid(end + 4 * MIN))
    assert core.drain().attributions == []  # evidence could still arrive
    core.process(xid(end + 11 * MIN, node="n5", code=13))  # watermark = end + 6 min > end + 5 min
    [attribution] = core.drain().attributions
    assert attribution.hardware


def test_storm_on_one_gpu_is_one_incident_updated_then_resolved():
    storm = [xid(T0 + i * MIN, code=74) for i in range(30)]
    later = [xid(T0 + 5 * HOUR, node="n2", code=13)]
    _, out = run_all(storm + later)
    # The storm detector also fires; the family incident is the one under test.
    out.incidents = [i for i in out.incidents if i.kind == IncidentKind.GPU_NVLINK]
    ids = {i.incident_id for i in out.incidents}
    assert len(ids) == 1
    statuses = [i.status for i in out.incidents]
    assert statuses[0] is IncidentStatus.OPEN
    assert statuses[-1] is IncidentStatus.RESOLVED
    assert out.incidents[-1].evidence_count == 30
    assert out.incidents[-1].evidence["xid_counts"] == {"74": 30}
    assert out.incidents[0].detected_ms == T0  # detected at the first evidence
    versions = [i.version for i in out.incidents]
    assert versions == sorted(versions)


def test_evidence_after_the_quiet_period_opens_a_new_incident():
    _, out = run_all([xid(T0), xid(T0 + 2 * HOUR)])
    assert len({i.incident_id for i in out.incidents}) == 2


def test_different_gpus_and_families_are_different_incidents():
    records = [xid(T0, bus="0000:07:00"), xid(T0 + 1, bus="0000:0f:00"), xid(T0 + 2, code=48)]
    _, out = run_all(records)
    assert len({i.incident_id for i in out.incidents}) == 3


def test_application_xids_alone_open_no_incident_but_unknown_ones_are_flagged():
    scattered = [xid(T0 + i * HOUR, node=f"n{i % 7}", code=13) for i in range(50)]
    _, out = run_all([*scattered, xid(T0 + 50 * HOUR, code=4242)])
    kinds = {(i.kind, i.severity) for i in out.incidents}
    assert kinds == {(IncidentKind.XID_UNKNOWN, Severity.INFO)}


def test_unknown_xids_open_at_most_one_info_incident_per_node_and_day():
    buses = [f"0000:{n:02x}:00" for n in range(8)]
    day1 = [xid(T0 + i * MIN, bus=bus, code=4242) for i, bus in enumerate(buses)]
    day1 += [xid(T0 + 10 * HOUR, bus=buses[0], code=4343)]
    day2 = [xid(T0 + 24 * HOUR + MIN, bus=buses[3], code=4242)]
    _, out = run_all([*day1, *day2])
    opened = [i for i in out.incidents if i.status is IncidentStatus.OPEN]
    assert [(i.kind, i.severity, i.gpu) for i in opened] == [
        (IncidentKind.XID_UNKNOWN, Severity.INFO, "")
    ] * 2


def test_a_row_remap_after_a_dbe_joins_its_incident_and_45_after_it_opens_none():
    records = [xid(T0, code=48), xid(T0 + 200, code=63), xid(T0 + 400, code=45)]
    _, out = run_all(records)
    assert {(i.kind, i.severity) for i in out.incidents} == {(IncidentKind.GPU_MEMORY, Severity.CRITICAL)}
    assert len({i.incident_id for i in out.incidents}) == 1
    [latest] = [i for i in out.incidents if i.evidence_count == 2]
    assert "drain" in latest.action


def test_the_context_window_is_per_gpu_and_looks_back_only():
    # A 63 on another GPU, or a minute and more after the 48, is a row-remap event of its own.
    records = [xid(T0, code=48), xid(T0 + 100, code=63, bus="0000:0f:00"), xid(T0 + 2 * MIN, code=63)]
    _, out = run_all(records)
    kinds = {(i.kind, i.gpu) for i in out.incidents}
    assert kinds == {
        (IncidentKind.GPU_MEMORY, "0000:07:00"),
        (IncidentKind.GPU_ROW_REMAP, "0000:0f:00"),
        (IncidentKind.GPU_ROW_REMAP, "0000:07:00"),
    }


def sxid(ts, code, message, switch="0000:c2:00", node="n1"):
    return XidEvent(
        ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id=switch, message=message, device="nvswitch"
    )


def test_nvswitch_sxids_are_their_own_incidents_per_switch_and_fatal_ones_are_job_evidence():
    end = T0 + 2 * HOUR
    records = [
        job(T0, "j1", JobState.RUNNING, nodes=("n1",), start=T0),
        sxid(T0 + MIN, 11012, "Non-fatal, Link 10 single bit ECC"),  # corrected: stored, no incident
        sxid(end - MIN, 20034, "Fatal, Link 28 LTSSM Fault Up"),
        sxid(end - MIN + 1, 20034, "Fatal, Link 29 LTSSM Fault Up", switch="0000:c3:00"),
        job(end, "j1", JobState.FAILED, nodes=("n1",), start=T0, end=end),
        xid(end + 2 * HOUR, node="n9", code=13),
    ]
    _, out = run_all(records)
    opened = {(i.kind, i.gpu, i.severity) for i in out.incidents if i.status is IncidentStatus.OPEN}
    assert opened == {
        (IncidentKind.NVSWITCH_FATAL, "0000:c2:00", Severity.CRITICAL),
        (IncidentKind.NVSWITCH_FATAL, "0000:c3:00", Severity.CRITICAL),
    }
    [attribution] = out.attributions
    assert attribution.hardware and IncidentKind.NVSWITCH_FATAL in attribution.evidence_kinds
    assert attribution.evidence_xids == ()  # SXid codes are not GPU XIDs


def test_an_nvswitch_error_reported_non_fatal_is_a_warning():
    _, out = run_all([sxid(T0, 20034, "Non-fatal, Link 28 LTSSM Fault Up")])
    assert {(i.kind, i.severity) for i in out.incidents} == {(IncidentKind.NVSWITCH_NONFATAL, Severity.WARN)}


def test_ecc_dbe_and_xid_48_on_the_same_gpu_are_one_incident():
    def sample(ts, dbe):
        return EccSample(
            ts_ms=ts, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00", counters={"dbe_volatile": dbe}
        )

    _, out = run_all([sample(T0, 0), xid(T0 + MIN, code=48), sample(T0 + 10 * MIN, 1)])
    assert {i.kind for i in out.incidents} == {IncidentKind.GPU_MEMORY}
    assert len({i.incident_id for i in out.incidents}) == 1
    assert out.incidents[-1].evidence["counter_deltas"] == {"dbe_volatile": 1}


def test_ecc_samples_are_downsampled_but_changes_are_kept():
    def sample(ts, sbe):
        return EccSample(ts_ms=ts, cluster="c", node="n1", gpu=0, counters={"sbe_volatile": sbe})

    records = [sample(T0 + i * 15 * MIN, 0) for i in range(8)] + [sample(T0 + 8 * 15 * MIN, 3)]
    _, out = run_all(records, CoreConfig(ecc_keep_interval_ms=HOUR))
    kept = [row.sample.ts_ms for row in out.ecc_rows]
    assert kept == [T0, T0 + HOUR, T0 + 2 * HOUR]
    assert dict(out.ecc_rows[-1].deltas) == {"sbe_volatile": 3}


def exposure(out, window_s):
    totals = defaultdict(float)
    latest = {}
    for row in out.mttf:
        if row.window_seconds != window_s:
            continue
        key = (row.window_start_ms, row.job_id, row.run_start_ms)
        if key not in latest or row.version >= latest[key].version:
            latest[key] = row
    for row in latest.values():
        totals["node_hours"] += row.node_hours
        totals["failures"] += row.failures
        totals["jobs_ended"] += row.jobs_ended
    return totals, latest


def test_exposure_adds_up_across_windows_and_the_failure_counts_once():
    start, end = T0 + 30 * MIN, T0 + 5 * HOUR + 30 * MIN
    records = [
        job(start, "j1", JobState.RUNNING, nodes=("n1", "n2", "n3"), gpus=24, start=start),
        xid(end - MIN),
        job(end, "j1", JobState.NODE_FAIL, nodes=("n1", "n2", "n3"), gpus=24, start=start, end=end),
        xid(end + 3 * HOUR, node="n9", code=13),
    ]
    _, out = run_all(records)
    for window_s in (3600, 86400):
        totals, _ = exposure(out, window_s)
        assert totals["node_hours"] == pytest.approx(3 * 5.0)
        assert totals["failures"] == 1
        assert totals["jobs_ended"] == 1
    _, hourly = exposure(out, 3600)
    assert len(hourly) == 6  # 00:30-01:00, four full hours, 05:00-05:30
    [failure_row] = [r for r in hourly.values() if r.failures]
    assert failure_row.window_start_ms == T0 + 5 * HOUR


def test_running_jobs_contribute_exposure_as_windows_close_and_at_finish():
    records = [
        job(T0, "long", JobState.RUNNING, nodes=("n1",), start=T0),
        xid(T0 + 3 * HOUR + 10 * MIN, code=13),
    ]
    core = DetectionCore(CoreConfig(windows_s=(3600,)))
    for record in records:
        core.process(record)
    closed = core.drain().mttf
    assert [r.window_start_ms for r in closed] == [T0, T0 + HOUR, T0 + 2 * HOUR]
    assert all(r.node_hours == pytest.approx(1.0) for r in closed)
    tail = core.finish().mttf
    assert [(r.window_start_ms, round(r.node_hours, 4)) for r in tail] == [(T0 + 3 * HOUR, round(10 / 60, 4))]


def test_redelivered_job_end_is_ignored():
    end = T0 + HOUR
    records = [
        job(T0, "j", JobState.RUNNING, start=T0),
        job(end, "j", JobState.COMPLETED, start=T0, end=end),
        job(end, "j", JobState.COMPLETED, start=T0, end=end),
    ]
    _, out = run_all(records, CoreConfig(windows_s=(86400,)))
    assert sum(r.jobs_ended for r in out.mttf) == 1


def test_late_records_are_refused_and_change_nothing():
    core = DetectionCore(CoreConfig(allowed_lateness_ms=5 * MIN))
    assert core.process(xid(T0 + HOUR, code=13))
    assert core.process(xid(T0 + HOUR - 5 * MIN))  # exactly at the watermark: accepted
    assert not core.process(xid(T0 + HOUR - 5 * MIN - 1))
    assert not core.drain().incidents[1:]


def test_output_does_not_depend_on_batching():
    records = []
    for i in range(40):
        start = T0 + i * 20 * MIN
        nodes = (f"n{i % 5}", f"n{(i + 1) % 5}")
        records.append(job(start, f"j{i}", JobState.RUNNING, nodes=nodes, gpus=16, start=start))
        end = start + 50 * MIN
        state = JobState.FAILED if i % 3 == 0 else JobState.COMPLETED
        records.append(job(end, f"j{i}", state, nodes=nodes, gpus=16, start=start, end=end))
        if i % 4 == 0:
            records.append(xid(end - 2 * MIN, node=nodes[0], code=(79, 48, 13, 74)[i % 4]))
    records.sort(key=lambda r: (r.ts_ms, type(r).__name__))

    def fingerprint(drain_every):
        _, out = run_all(records, drain_every=drain_every)
        return (
            sorted((i.incident_id, i.version, i.status) for i in out.incidents),
            sorted((a.job_id, a.hardware) for a in out.attributions),
            sorted(
                (m.window_seconds, m.window_start_ms, m.job_id, m.version, round(m.node_hours, 9))
                for m in out.mttf
            ),
        )

    assert fingerprint(1) == fingerprint(7) == fingerprint(10_000)


def test_quiet_period_is_judged_on_event_time_not_on_how_far_the_watermark_got():
    # With a lateness of 10 h the watermark lags far behind; the gap of 2 h between two XIDs is
    # still longer than the 1 h quiet period, so they are two incidents, the first resolved.
    _, out = run_all([xid(T0), xid(T0 + 2 * HOUR)], CoreConfig(allowed_lateness_ms=10 * HOUR))
    statuses = [(i.incident_id, i.status) for i in out.incidents if i.kind == IncidentKind.GPU_BUS]
    first, second = statuses[0][0], statuses[-1][0]
    assert first != second
    assert (first, IncidentStatus.RESOLVED) in statuses


def test_a_checkpoint_pickled_before_the_xid_context_existed_still_loads():
    import pickle

    core, _ = run_all([xid(T0, code=48)])
    state = dict(core.__dict__)
    del state["_recent_xids"], state["_unknown_day"]
    old = DetectionCore.__new__(DetectionCore)
    old.__setstate__(state)
    restored = pickle.loads(pickle.dumps(old))
    assert restored.process(xid(T0 + 1000, code=4242))
    assert {i.kind for i in restored.drain().incidents} == {IncidentKind.XID_UNKNOWN}


def test_a_contained_memory_error_does_not_page_but_attributes_the_failed_job():
    attribution, out = failed_job_with_xid_at(-2 * MIN, code=94)
    assert attribution.hardware and attribution.evidence_xids == (94,)
    assert {(i.kind, i.severity) for i in out.incidents} == {
        (IncidentKind.GPU_MEMORY, Severity.WARN),
        (IncidentKind.JOB_HW_FAILURE, Severity.WARN),
    }


def test_the_xid_context_is_what_a_scan_of_the_gpus_last_minute_finds():
    """Which codes came before a line (within CONTEXT_WINDOW_MS, none after it) is kept as lines
    come, not found by a scan of the minute; in time order, out of it, and after a checkpoint."""
    import pickle
    import random
    from collections import deque

    from detectors.core import _RecentXids
    from detectors.xid_catalog import CONTEXT_WINDOW_MS

    for seed in range(4):
        rng = random.Random(seed)
        recent, scan = _RecentXids(), deque()
        t = T0
        for step in range(3000):
            t += rng.choice((rng.randrange(500), rng.randrange(40_000)))
            at = t - rng.randrange(90_000) if rng.random() < 0.05 else t
            code = rng.choice((13, 45, 48, 63, 64, 79))
            # the scan the context was before: older lines forgotten from the front only
            while scan and scan[0][0] < at - CONTEXT_WINDOW_MS:
                scan.popleft()
            expected = {c for ts, c in scan if at - CONTEXT_WINDOW_MS <= ts <= at}
            scan.append((at, code))
            got = recent.take(at, code)
            assert len(got) == len(set(got)) and set(got) == expected, (seed, step)
            if step % 500 == 0:
                recent = pickle.loads(pickle.dumps(recent))


def test_a_checkpoint_with_the_xid_context_as_bare_lists_counts_them_once():
    """A checkpoint from before the context kept counts holds a deque of (time, code) a GPU."""
    import pickle
    from collections import deque

    from detectors.core import _RecentXids

    core, _ = run_all([xid(T0, code=48), xid(T0 + 1000, code=13)])
    state = dict(core.__dict__)
    state["_recent_xids"] = {key: deque(recent.seen) for key, recent in core._recent_xids.items()}
    old = DetectionCore.__new__(DetectionCore)
    old.__setstate__(state)
    [recent] = old._recent_xids.values()
    assert isinstance(recent, _RecentXids) and recent.codes == {48: 1, 13: 1} and recent.descents == 0
    restored = pickle.loads(pickle.dumps(old))
    # a 63 right after the 48: the remap of the DBE's row, part of its memory incident
    assert restored.process(xid(T0 + 2000, code=63))
    assert {i.kind for i in restored.drain().incidents} == {IncidentKind.GPU_MEMORY}


def test_the_xid_context_of_a_storm_costs_no_pass_over_its_minute():
    """Hundreds of lines a minute: a line's context is the codes counted, not a scan of the
    minute; also once a line learnt out of order has left the minute."""
    from collections import deque

    from detectors.core import _RecentXids

    class Untouchable(deque):
        def __iter__(self):
            raise AssertionError("the minute was scanned")

    recent = _RecentXids()
    for at, code in ((T0, 48), (T0 + 500, 63), (T0 + 200, 13)):  # out of order, then forgotten
        recent.take(at, code)
    for k in range(600):
        recent.take(T0 + 2 * MIN + k * 100, 43)
    recent.seen = Untouchable(recent.seen)
    assert recent.take(T0 + 2 * MIN + 60_000, 45) == (43,)
