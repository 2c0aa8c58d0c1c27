"""The River-protocol models: ECC trend, XID storm, NVLink spread; and lemon fleet statistics."""

import pickle
from collections import deque

import pytest

from detectors.core import CoreConfig, DetectionCore
from detectors.ecc_trend import ecc_trend_filter
from detectors.lemon import LemonConfig, LemonTracker
from detectors.surprise import poisson_surprise
from detectors.xid_burst import XidStormScorer, spread_filter, storm_filter
from schemas.outputs import IncidentKind
from schemas.records import EccSample, JobEvent, JobState, XidEvent
from schemas.timeutil import DAY_MS

HOUR = 3_600_000
T0 = 1_704_067_200_000


def flagged(model, x):
    score = model.score_one(x)
    model.learn_one(x)
    return model.classify(score)


def feed(model, deltas, hours=6.0, start_watched=0.0):
    decisions = []
    for step, delta in enumerate(deltas, start=1):
        x = {"sbe_delta": delta, "hours": hours, "watched_hours": start_watched + step * hours}
        decisions.append(flagged(model, x))
    return decisions


def test_ecc_trend_leaves_steady_rates_and_stray_bursts_alone():
    steady = ecc_trend_filter()  # ~6 per 6 h, every day, from the start: its normal
    assert not any(feed(steady, [5, 7, 6, 4, 8, 6, 5, 7, 6, 6, 9, 4] * 5))
    clean = ecc_trend_filter()  # watched for a week, then one burst of three bits
    assert not any(feed(clean, [3, 0, 0, 0, 0], start_watched=168.0))


def test_ecc_trend_flags_a_rising_rate_within_a_day():
    degrading = ecc_trend_filter()
    decisions = feed(degrading, [1, 2, 4, 7, 13, 25, 50], start_watched=168.0)
    assert True in decisions[:4]
    assert decisions[-1]  # protected baseline: still anomalous as it grows


def test_ecc_trend_accounts_for_gaps_between_samples():
    gap = ecc_trend_filter()
    feed(gap, [6, 5, 7, 6, 6, 5])  # ~1 per hour
    assert not feed(gap, [70], hours=72.0, start_watched=36.0)[0]  # three days of it at once
    burst = ecc_trend_filter()
    feed(burst, [6, 5, 7, 6, 6, 5])
    assert feed(burst, [70], hours=6.0, start_watched=36.0)[0]  # the same count in six hours


def test_storm_needs_many_xids_from_one_gpu_and_learns_nothing_from_storms():
    model = storm_filter(window_hours=1.0, min_events=10)
    decisions = [flagged(model, {"t": minute / 60}) for minute in range(0, 60, 5)]
    assert decisions.index(True) == 9  # the 10th XID within the hour
    scorer: XidStormScorer = model.anomaly_detector
    assert scorer.window_count(1.0) < 12  # protected: flagged XIDs were not learned


def test_storm_threshold_rises_with_the_fleet_usual_count():
    model = storm_filter(window_hours=1.0, min_events=5)
    decisions = [flagged(model, {"t": m / 60, "fleet_usual": 4.0}) for m in range(0, 60, 5)]
    assert decisions.index(True) == 11  # 3 x fleet usual of 4 = 12 XIDs


def test_spread_needs_several_gpus():
    one_gpu = spread_filter(window_hours=24, min_events=4, min_gpus=2)
    assert not any(flagged(one_gpu, {"t": h, "gpu": "a"}) for h in range(10))
    spreading = spread_filter(window_hours=24, min_events=4, min_gpus=2)
    decisions = [flagged(spreading, {"t": h, "gpu": g}) for h, g in enumerate("aabab")]
    assert decisions == [False, False, False, True, True]


def test_model_state_is_small_and_picklable():
    storm = storm_filter().clone()
    trend = ecc_trend_filter().clone()
    for minute in range(30):
        storm.learn_one({"t": minute / 60})
        trend.learn_one({"sbe_delta": minute, "hours": 6.0})
    # The trend test keeps a day of hourly error bins and baselines: still well under the
    # 10 kB a GPU may take (100,000 GPUs in 1 GiB).
    assert len(pickle.dumps(trend)) < 1500
    assert len(pickle.dumps(storm)) < 2000
    restored = pickle.loads(pickle.dumps(storm))
    assert restored.score_one({"t": 0.6}) == storm.score_one({"t": 0.6})


@pytest.mark.parametrize(
    ("template", "sample"),
    [
        (storm_filter(window_hours=6, min_events=4), {"t": 0.5}),
        (spread_filter(window_hours=1, min_events=3, min_gpus=2), {"t": 0.5, "gpu": "0"}),
        (ecc_trend_filter(window=12, floor_per_day=2.0), {"sbe_delta": 1, "hours": 1.0}),
    ],
    ids=["storm", "spread", "ecc trend"],
)
def test_a_clone_is_rivers_fresh_unfitted_copy_each_time(template, sample):
    from river.base import AnomalyFilter

    rivers = AnomalyFilter.clone(template)  # River's own, through the parameters
    first, second = template.clone(), template.clone()
    assert pickle.dumps(first) == pickle.dumps(rivers) == pickle.dumps(second)
    assert first is not second and first.anomaly_detector is not second.anomaly_detector
    for _ in range(3):
        first.learn_one(sample)
    assert pickle.dumps(first) != pickle.dumps(second)  # learning one leaves the others alone
    assert pickle.dumps(template.clone()) == pickle.dumps(rivers)
    # Asked with River's arguments, it is River's clone.
    assert template.clone(include_attributes=True).threshold == template.threshold


def test_poisson_surprise_is_monotone():
    values = [poisson_surprise(n, 0.3) for n in range(6)]
    assert values == sorted(values) and values[0] == 0.0
    assert poisson_surprise(2, 5.0) < 0.1


def test_lemon_is_a_node_far_above_what_its_load_explains():
    tracker = LemonTracker(LemonConfig(threshold=6.0, min_signal_surprise=3.0, min_history_ms=0))
    for n in range(100):
        tracker.see_node(f"n{n}", 0)
        tracker.record(f"n{n}", "job_runs", 0)
        if n % 5 == 0:  # one job in five fails, with an XID
            tracker.record_failed_job(f"n{n}", f"job{n}", 0)
            tracker.record_xid(f"n{n}", 0)
    for day in range(20):
        tracker.record("busy", "job_runs", day * DAY_MS)  # twenty times the work of the others ...
        if day % 5 == 0:  # ... and as many failures for it
            tracker.record_failed_job("busy", f"user{day}", day * DAY_MS)
            tracker.record_xid("busy", day * DAY_MS)
        tracker.record_xid("lemon", day * DAY_MS + 1)  # XIDs every day with no more work than anyone
    for day in range(3):
        tracker.record("lemon", "hw_incidents", day * 5 * DAY_MS)
    verdicts = tracker.evaluate(20 * DAY_MS)
    assert [v.node for v in verdicts] == ["lemon"]
    assert "xid_days" in verdicts[0].crossed
    assert tracker.evaluate(50 * DAY_MS) == []  # the window slid past the evidence


def test_one_fault_is_one_episode_and_no_verdict_before_enough_history():
    tracker = LemonTracker(LemonConfig(min_history_ms=7 * DAY_MS))
    for n in range(50):
        tracker.see_node(f"n{n}", 0)
    for minute in range(3):  # XID 79, DBE and row-remap failure of one fault
        tracker.record("n1", "hw_incidents", DAY_MS + minute * 60_000)
    assert tracker.evaluate(3 * DAY_MS) == []
    assert tracker._nodes["n1"].signals["hw_incidents"] == deque([DAY_MS])


def xid(ts, node="n1", code=13, bus="0000:07:00", message=""):
    return XidEvent(ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id=bus, message=message)


#: A non-fatal NVLink error (NVIDIA's decode sheet: ignore), as a flapping link logs it.
NONFATAL_144 = "NVLink: SAW MVB non-fatal error, Link 03 (0x00000000 0x00000000 0x00000000 0x00000000)"


def incidents_of(records, config=None):
    core = DetectionCore(config or CoreConfig())
    for record in records:
        assert core.process(record)
    out = core.drain().incidents + core.finish().incidents
    return out


def running(job_id, user, node="n1", ts=T0 - HOUR):
    return JobEvent(ts_ms=ts, cluster="c", job_id=job_id, state=JobState.RUNNING, nodes=(node,), gpus=8,
                    start_ms=ts, user=user, name="train")  # fmt: skip


def ended(job_id, user, ts, node="n1", start=T0 - HOUR):
    return JobEvent(ts_ms=ts, cluster="c", job_id=job_id, state=JobState.FAILED, nodes=(node,), gpus=8,
                    start_ms=start, end_ms=ts, user=user, name="train")  # fmt: skip


def of_kind(incidents, kind):
    return [i for i in incidents if i.kind == kind]


def test_core_turns_an_application_xid_storm_into_one_warn_incident():
    """With no job on the node (no owner known), a storm of application XIDs is the GPU's; with
    the one job that runs there, the same storm is that job's, addressed to its owner."""
    storm = [xid(T0 + i * 60_000) for i in range(60)]
    found = of_kind(incidents_of(storm), IncidentKind.XID_STORM)
    assert len({i.incident_id for i in found}) == 1
    assert found[0].severity.value == "warn"
    assert found[0].gpu == "0000:07:00"
    isolated = [xid(T0 + i * HOUR) for i in range(60)]
    assert not of_kind(incidents_of(isolated), IncidentKind.XID_STORM)

    owned = incidents_of([running("7", "dbg"), *storm])
    assert not of_kind(owned, IncidentKind.XID_STORM)
    [job_storm] = {i.incident_id: i for i in of_kind(owned, IncidentKind.JOB_XID_STORM)}.values()
    assert job_storm.severity.value == "warn" and job_storm.evidence["owner"] == "dbg"
    assert job_storm.evidence["jobs"] == ["7"] and "no node action" in job_storm.action


def test_a_crash_loop_under_one_users_job_makes_no_node_storm():
    """One job of user ``dbg`` crash-loops: its process dies and restarts on GPU 0, logging XID 13
    and 43 a dozen times an hour for three hours. That is the job's crash loop, told to ``dbg``
    (one ``job_xid_storm``); the node and its GPU get no storm verdict."""
    records = [running("7", "dbg")]
    for minute in range(0, 180, 5):
        records.append(xid(T0 + minute * 60_000, code=13))
        records.append(xid(T0 + minute * 60_000 + 500, code=43))
    records.append(ended("7", "dbg", T0 + 181 * 60_000))
    found = incidents_of(records)
    assert sum(1 for r in records if isinstance(r, XidEvent) and r.ts_ms < T0 + HOUR) >= 10
    assert not of_kind(found, IncidentKind.XID_STORM)
    owner = {i.incident_id: i for i in of_kind(found, IncidentKind.JOB_XID_STORM)}
    assert [i.evidence["owner"] for i in owner.values()] == ["dbg"]
    assert [i.node for i in found if i.kind != IncidentKind.JOB_XID_STORM] == []  # no node incident at all


def test_a_hardware_class_storm_under_one_users_job_is_still_the_gpus():
    """The same job, the same rate, but XID 92 (high single-bit ECC error rate, hardware-class):
    evidence of the GPU whoever runs there, so it is a GPU storm, not the job's."""
    records = [running("7", "dbg")]
    for minute in range(0, 180, 5):
        records.append(xid(T0 + minute * 60_000, code=92))
        records.append(xid(T0 + minute * 60_000 + 500, code=92))
    storms = of_kind(incidents_of(records), IncidentKind.XID_STORM)
    assert len({i.incident_id for i in storms}) == 1 and storms[0].gpu == "0000:07:00"
    assert storms[0].evidence["job_context"][0]["user"] == "dbg"
    assert not of_kind(incidents_of(records), IncidentKind.JOB_XID_STORM)


def test_application_storms_that_follow_one_gpu_across_users_are_the_gpus():
    """A GPU whose application XIDs storm under ``ann``'s job, then, days later, under ``bob``'s:
    the evidence stays with the GPU across users, so bob's storm is a GPU storm. The same user's
    second job storming there again stays that user's."""

    def storm_under(job_id, user, start):
        out = [running(job_id, user, ts=start - HOUR)]
        out += [xid(start + minute * 60_000, code=31) for minute in range(0, 30, 2)]
        out.append(ended(job_id, user, start + HOUR, start=start - HOUR))
        return out

    again = storm_under("1", "ann", T0) + storm_under("2", "ann", T0 + 2 * DAY_MS)
    assert not of_kind(incidents_of(again), IncidentKind.XID_STORM)
    assert len({i.incident_id for i in of_kind(incidents_of(again), IncidentKind.JOB_XID_STORM)}) == 2

    moved = storm_under("1", "ann", T0) + storm_under("2", "bob", T0 + 2 * DAY_MS)
    found = incidents_of(moved)
    [gpu_storm] = {i.incident_id: i for i in of_kind(found, IncidentKind.XID_STORM)}.values()
    assert gpu_storm.gpu == "0000:07:00" and gpu_storm.first_evidence_ms > T0 + 2 * DAY_MS
    assert [i.evidence["owner"] for i in of_kind(found, IncidentKind.JOB_XID_STORM)][-1] == "ann"
    late = storm_under("1", "ann", T0) + storm_under("2", "bob", T0 + 9 * DAY_MS)  # past the window
    assert not of_kind(incidents_of(late), IncidentKind.XID_STORM)


def test_one_burst_of_nvlink_errors_is_no_flapping_and_recurring_bursts_are():
    """A GPU reset or reboot takes the node's links down at once: one burst of NVLink XIDs on
    every GPU (NVIDIA: peers log NVLink errors "simply because the link went down"). That is no
    flapping link, however many GPUs log it; the same errors coming back half an hour later are,
    on one GPU too, from the first line of the second burst."""
    buses = ["0000:07:00", "0000:0f:00", "0000:47:00", "0000:4e:00", "0000:87:00", "0000:90:00"]
    reset = [xid(T0 + k * 300, code=144, bus=buses[k % 6], message=NONFATAL_144) for k in range(18)]
    assert not of_kind(incidents_of(reset), IncidentKind.NVLINK_FLAPPING)
    first = [xid(T0 + k * 1_000, code=144, message=NONFATAL_144) for k in range(5)]
    again = [xid(T0 + 30 * 60_000 + k * 1_000, code=144, message=NONFATAL_144) for k in range(5)]
    found = of_kind(incidents_of(first + again), IncidentKind.NVLINK_FLAPPING)
    assert found and found[0].detected_ms == T0 + 30 * 60_000 and found[0].node == "n1"


def test_a_fatal_nvlink_error_and_its_repairs_reboot_are_no_flapping():
    """XID 74 (fatal: a critical incident at once), then, hours later, the burst its repair's reboot
    logs as the links go down: two bursts of NVLink errors, but only one of them non-fatal."""
    records = [xid(T0, code=74, message="NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000)")]
    records += [
        xid(T0 + 8 * HOUR + k * 300, code=144, bus=f"0000:{k:02x}:00", message=NONFATAL_144) for k in range(8)
    ]
    found = incidents_of(records)
    assert of_kind(found, IncidentKind.GPU_NVLINK) and not of_kind(found, IncidentKind.NVLINK_FLAPPING)


def test_core_flags_nvlink_errors_spreading_over_a_node():
    buses = ["0000:07:00", "0000:0f:00", "0000:47:00"]
    records = [xid(T0 + i * 30 * 60_000, code=144, bus=buses[i % 3], message=NONFATAL_144) for i in range(8)]
    found = [i for i in incidents_of(records) if i.kind == IncidentKind.NVLINK_FLAPPING]
    assert found and found[0].gpu == "" and found[0].node == "n1"


def test_core_flags_a_degrading_gpu_before_its_uncorrectable_error():
    def sample(step, sbe, dbe=0):
        return EccSample(ts_ms=T0 + step * 6 * HOUR, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00",
                         counters={"sbe_volatile": sbe, "dbe_volatile": dbe})  # fmt: skip

    counts = [0, 0, 0, 2, 6, 14, 30, 62, 126]
    records = [sample(i, c) for i, c in enumerate(counts)] + [sample(len(counts), 200, dbe=1)]
    found = incidents_of(records)
    trend = [i for i in found if i.kind == IncidentKind.ECC_TREND]
    memory = [i for i in found if i.kind == IncidentKind.GPU_MEMORY]
    assert trend and memory
    assert trend[0].detected_ms <= T0 + 7 * 6 * HOUR  # within a day of the first rise
    assert trend[0].detected_ms < memory[0].detected_ms
    assert len({i.incident_id for i in trend}) == 1  # one incident across 6-hourly evidence


def test_core_names_a_lemon_node_from_fleet_statistics():
    records = []
    for n in range(60):
        records.append(JobEvent(ts_ms=T0, cluster="c", job_id=f"idle{n}", state=JobState.RUNNING,
                                nodes=(f"node{n:02d}",), gpus=8, start_ms=T0))  # fmt: skip
    for day in range(0, 20, 4):
        records.append(xid(T0 + day * DAY_MS, node="node07", code=79))
        records.append(xid(T0 + day * DAY_MS + 12 * HOUR, node="node07", code=119, bus="0000:0f:00"))
    for day in range(20):
        records.append(xid(T0 + day * DAY_MS + 2 * HOUR, node="node07", code=13))
    records.append(xid(T0 + 25 * DAY_MS, node="node01", code=13))  # moves the watermark
    records.sort(key=lambda r: r.ts_ms)
    lemons = [i for i in incidents_of(records) if i.kind == IncidentKind.LEMON_NODE]
    assert {i.node for i in lemons} == {"node07"}
    assert len({i.incident_id for i in lemons}) == 1
    assert lemons[-1].evidence["counter_deltas"]["hw_incidents"] >= 5


def quadratic_rise(model, scrape_hours, days=3.5, final_per_day=200.0, clean_hours=168.0):
    """A GPU clean for a week, then errors at a rate rising linearly from zero (the count rises
    quadratically) for ``days``; the hours into the rise of the first anomalous sample."""
    model.learn_one({"sbe_delta": 0, "hours": clean_hours, "watched_hours": clean_hours})
    steps = round(days * 24 / scrape_hours)
    owed = 0.0
    for k in range(1, steps + 1):
        owed += final_per_day / 24 * (k * scrape_hours / (days * 24)) * scrape_hours
        delta = int(owed)  # deterministic: the expected count, carried between samples
        owed -= delta
        x = {"sbe_delta": delta, "hours": scrape_hours, "watched_hours": clean_hours + k * scrape_hours}
        if flagged(model, x):
            return k * scrape_hours
    return None


@pytest.mark.parametrize("scrape_hours", [30 / 3600, 0.25, 6.0])
def test_ecc_trend_warns_a_day_ahead_of_a_slow_quadratic_rise_at_any_scrape_interval(scrape_hours):
    warned = quadratic_rise(ecc_trend_filter(), scrape_hours)
    assert warned is not None and warned <= 3.5 * 24 - 24  # a day or more before the failure


@pytest.mark.parametrize("scrape_hours", [30 / 3600, 0.25, 6.0])
def test_ecc_trend_leaves_a_steady_rate_alone_at_any_scrape_interval(scrape_hours):
    model = ecc_trend_filter()
    rate = 40.0 / 24  # a GPU that corrects 40 bits a day, every day: high, but its normal
    owed = 0.0
    for k in range(1, round(7 * 24 / scrape_hours)):
        owed += rate * scrape_hours
        delta = int(owed)
        owed -= delta
        assert not flagged(
            model, {"sbe_delta": delta, "hours": scrape_hours, "watched_hours": k * scrape_hours}
        )


def test_ecc_trend_state_stays_small_at_30_second_scrapes():
    model = ecc_trend_filter().clone()
    quadratic_rise(model, 30 / 3600, days=2.0)
    assert len(pickle.dumps(model)) < 4000  # hourly bins, not one entry per sample


def test_lemon_in_a_week_old_fleet_of_32_nodes():
    """The issue's case: five hardware-attributed NODE_FAIL jobs and five critical faults in six
    days, in a 32-node fleet with one week of history, is a lemon; one fault is not."""
    tracker = LemonTracker(LemonConfig())
    for n in range(32):
        tracker.see_node(f"n{n}", 0)
        for day in range(7):
            tracker.record(f"n{n}", "job_runs", day * DAY_MS + n)
    for day in range(5):
        at = (day + 1) * DAY_MS + 3 * 3_600_000
        for signal in ("hw_incidents", "hw_failures", "node_fails"):
            tracker.record("n7", signal, at)
        tracker.record_failed_job("n7", f"j{day}", at)
    tracker.record("n3", "hw_incidents", 2 * DAY_MS)
    tracker.record("n3", "hw_failures", 2 * DAY_MS)
    [verdict] = tracker.evaluate(7 * DAY_MS - 1)
    assert verdict.node == "n7" and verdict.confidence > 0.99
    assert 6 < verdict.exposure_days <= 7
    assert tracker.evaluate(DAY_MS) == []  # less than the minimum history: no verdict yet


def test_lemon_expectation_scales_with_exposure():
    """Two faults (each killing a job) on a node that joined a day ago make a lemon; the same two
    in four weeks on a node of a 200-node fleet do not."""
    tracker = LemonTracker(LemonConfig())
    for n in range(200):
        tracker.see_node(f"n{n}", 0)
    tracker.see_node("new", 27 * DAY_MS)
    for node in ("new", "n1"):
        for hours in (1, 7):
            tracker.record(node, "hw_incidents", 27 * DAY_MS + hours * 3_600_000)
            tracker.record(node, "hw_failures", 27 * DAY_MS + hours * 3_600_000)
    [verdict] = tracker.evaluate(28 * DAY_MS)
    assert verdict.node == "new" and verdict.exposure_days == 1.0


def test_checkpoints_from_before_the_trend_test_and_lemon_exposure_still_load():
    """A worker restarts from a checkpoint its previous version wrote: the ECC trend model lacks the
    trend test's state, the lemon tracker its exposure and new settings."""
    model = ecc_trend_filter().clone()
    for step in range(1, 10):
        model.learn_one({"sbe_delta": 1, "hours": 6.0, "watched_hours": 6.0 * step})
    scorer = model.anomaly_detector
    old = dict(scorer.__dict__)
    for name in ("baseline_half_life_hours", "trend_hours", "reference_lag_hours", "_errors", "_history",
                 "_reference", "_created_watched"):  # fmt: skip
        old.pop(name)
    old["baseline_alpha"] = 0.05
    restored = type(scorer).__new__(type(scorer))
    restored.__setstate__(old)
    x = {"sbe_delta": 40, "hours": 6.0, "watched_hours": 60.0}
    assert restored.score_one(x) > 6.0
    restored.learn_one(x)

    tracker = LemonTracker(LemonConfig())
    for n in range(32):
        tracker.see_node(f"n{n}", 0)
    for day in range(5):
        for signal in ("hw_incidents", "hw_failures", "node_fails"):
            tracker.record("n7", signal, day * DAY_MS + 3_600_000)
    state = dict(tracker.__dict__)
    for node in state["_nodes"].values():
        del node.first_ms
    restored_tracker = LemonTracker.__new__(LemonTracker)
    restored_tracker.__setstate__(pickle.loads(pickle.dumps(state)))
    assert [v.node for v in restored_tracker.evaluate(6 * DAY_MS)] == ["n7"]


def test_a_gpu_without_a_past_is_compared_with_the_fleet():
    """Errors from its first samples: its own past says nothing for two days. At a rate the
    fleet's GPUs show it stays quiet; at one far above theirs it is flagged within hours."""

    def first_flag(per_sample, fleet_per_day):
        model = ecc_trend_filter()
        for step in range(1, 4 * 48):
            x = {"sbe_delta": per_sample, "hours": 0.25, "watched_hours": step * 0.25,
                 "fleet_per_day": fleet_per_day}  # fmt: skip
            if flagged(model, x):
                return step * 0.25
        return None

    assert first_flag(1, 96.0) is None  # 96 a day, as the fleet's third GPU
    assert first_flag(1, -1.0) is None  # no fleet reference: own past only (none before 48 h)
    hours = first_flag(2, 24.0)  # 192 a day where the fleet's third GPU corrects 24
    assert hours is not None and hours < 6


def test_a_core_without_a_local_fleet_holds_a_young_gpus_errors_for_the_fleet_reference():
    def sample(minutes, sbe):
        return EccSample(ts_ms=T0 + minutes * 60_000, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00",
                         counters={"sbe_volatile": sbe})  # fmt: skip

    core = DetectionCore(CoreConfig(), local_fleet=False)
    assert core.ready_for(sample(0, 5))  # a first sample is not scored
    assert core.process(sample(0, 5))
    assert core.ready_for(sample(15, 5))  # nothing corrected since
    core.process(sample(15, 5))
    assert not core.ready_for(sample(30, 9))  # errors, and no past of its own to compare with
    core.learn_baselines({}, {core.ecc_reference_needed_ms(T0 + 30 * 60_000): 4.0})
    assert core.ready_for(sample(30, 9))
    core.process(sample(30, 9))
    assert [f.kind for f in core.drain().facts][-1] == "ecc_sbe"  # the fleet hears of the errors


def test_a_failed_job_counts_once_a_node_until_the_window_drops_it():
    tracker = LemonTracker(LemonConfig(window_ms=7 * DAY_MS, min_history_ms=0))
    assert tracker.record_failed_job("n1", "7", 0)
    assert not tracker.record_failed_job("n1", "7", DAY_MS)  # the same job again
    tracker.evaluate(10 * DAY_MS)  # the window drops it
    assert tracker.record_failed_job("n1", "7", 10 * DAY_MS)
