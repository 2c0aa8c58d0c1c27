"""Job-aware verdicts (issue 19): application errors follow the job, hardware errors stay with the node.

A hand-built fleet of 40 nodes where many users' jobs run every day, with three stories in it:

* ``n07``: user ``dbg``'s debug jobs crash there again and again with XID 13 (the issue's case:
  the other users' jobs on that node complete);
* ``n13``: a node with a real fault: a GPU falls off the bus (XID 79) under a different user's
  job every other day;
* ``n21``: both.
"""

from __future__ import annotations

import dataclasses

from detectors.core import CoreConfig, DetectionCore, Emitted
from detectors.lemon import LemonConfig
from schemas.outputs import Incident, IncidentKind
from schemas.records import JobEvent, JobState, Record, XidEvent
from schemas.timeutil import DAY_MS, HOUR_MS, MINUTE_MS

NODES = [f"n{i:02d}" for i in range(40)]
DAYS = 12


def job(
    ts: int, job_id: str, user: str, node: str, state: JobState, start: int, partition: str = ""
) -> JobEvent:
    end = None if state is JobState.RUNNING else ts
    return JobEvent(ts_ms=ts, cluster="c", job_id=job_id, state=state, nodes=(node,), gpus=8, start_ms=start,
                    end_ms=end, user=user, name="train", partition=partition)  # fmt: skip


def xid(ts: int, node: str, code: int) -> XidEvent:
    return XidEvent(ts_ms=ts, cluster="c", node=node, xid=code, pci_bus_id="0000:07:00")


def fleet_records(*, crash_on: tuple[str, ...] = (), faulty: tuple[str, ...] = ()) -> list[Record]:
    """Every node runs a 2 h job of a rotating user every 3 h; ``dbg`` crash-loops on ``crash_on``
    (six 20 min jobs a day, each dying with XID 13); a GPU of each ``faulty`` node falls off the
    bus every other day, killing the job of whoever runs there."""
    records: list[Record] = []
    serial = iter(range(10**6))
    for day in range(DAYS):
        for slot in range(8):
            start = day * DAY_MS + slot * 3 * HOUR_MS
            for index, node in enumerate(NODES):
                user = f"u{(index + slot + day * 3) % 25}"
                job_id = str(next(serial))
                end = start + 2 * HOUR_MS
                killed = node in faulty and day % 2 == 0 and slot == 3
                records.append(job(start, job_id, user, node, JobState.RUNNING, start))
                if killed:
                    records.append(xid(end - 3 * MINUTE_MS, node, 79))
                state = JobState.NODE_FAIL if killed else JobState.COMPLETED
                records.append(job(end, job_id, user, node, state, start))
        for node in crash_on:
            for run in range(6):
                start = day * DAY_MS + run * 3 * HOUR_MS + 2 * HOUR_MS + 5 * MINUTE_MS
                job_id = f"dbg-{next(serial)}"
                end = start + 20 * MINUTE_MS
                records.append(job(start, job_id, "dbg", node, JobState.RUNNING, start, "debug"))
                records.append(xid(end - 2 * MINUTE_MS, node, 13))
                records.append(xid(end - 2 * MINUTE_MS + 500, node, 43))
                records.append(job(end, job_id, "dbg", node, JobState.FAILED, start, "debug"))
    records.sort(key=lambda r: r.ts_ms)
    return records


def config() -> CoreConfig:
    return CoreConfig(lemon=LemonConfig(min_history_ms=3 * DAY_MS))


def run(records: list[Record]) -> dict[str, Incident]:
    core = DetectionCore(config())
    latest: dict[str, Incident] = {}

    def keep(emitted: Emitted) -> None:
        for incident in emitted.incidents:
            known = latest.get(incident.incident_id)
            if known is None or incident.version >= known.version:
                latest[incident.incident_id] = incident

    for record in records:
        assert core.process(record)
        keep(core.drain())
    keep(core.finish())
    return latest


def kinds_on(incidents: dict[str, Incident], kind: IncidentKind) -> set[str]:
    return {i.node for i in incidents.values() if i.kind is kind}


def test_a_users_crash_loop_on_one_node_is_the_users_not_the_nodes() -> None:
    """Without job context, n07 logs XIDs every day and a failed job every 3 h: a lemon. With it,
    the XIDs and failures are one user's, counted once; the user hears of it."""
    incidents = run(fleet_records(crash_on=("n07",)))
    assert kinds_on(incidents, IncidentKind.LEMON_NODE) == set()
    assert kinds_on(incidents, IncidentKind.XID_STORM) == set()
    [app] = [i for i in incidents.values() if i.kind is IncidentKind.JOB_APP_ERRORS]
    assert app.evidence["owner"] == "dbg"
    assert app.evidence["nodes"] == ["n07"]
    assert "dbg" in app.summary and "no node action" in app.action
    assert "Application errors follow user dbg's jobs (partition debug):" in app.summary
    assert {(c["user"], c["partition"]) for c in app.evidence["job_context"]} == {("dbg", "debug")}


def test_a_faulty_node_hitting_many_users_is_a_lemon_and_both_stories_are_told_apart() -> None:
    incidents = run(fleet_records(crash_on=("n07", "n21"), faulty=("n13", "n21")))
    assert kinds_on(incidents, IncidentKind.LEMON_NODE) == {"n13", "n21"}
    apps = [i for i in incidents.values() if i.kind is IncidentKind.JOB_APP_ERRORS]
    assert [i.evidence["owner"] for i in apps] == ["dbg"]
    assert apps[0].evidence["nodes"] == ["n07", "n21"]


def test_application_xids_count_against_the_node_unless_they_follow_the_user() -> None:
    """The lemon signal xid_days: the application XIDs of ``dbg``, whose jobs crash wherever they
    run, count for n07 only until the fleet stage sees that, and are then taken back; the same XIDs
    under the other users' jobs (n30, a different user's job each day) count every day, as do
    hardware XIDs."""
    records = fleet_records(crash_on=("n07",))
    for day in range(DAYS):
        records.append(xid(day * DAY_MS + 3 * HOUR_MS + 30 * MINUTE_MS, "n30", 31))
    records.sort(key=lambda r: r.ts_ms)
    core = DetectionCore(config())
    for record in records:
        core.process(record)
        core.drain()
    assert core.fleet is not None
    signals = core.fleet._lemons._nodes  # the lemon statistics as the fleet stage counted them
    applied = core.fleet._applied_to  # the stage applies facts up to its last verdict instant
    assert applied is not None and applied > (DAYS - 1) * DAY_MS
    n30_days = {
        r.ts_ms - r.ts_ms % DAY_MS for r in records if getattr(r, "node", "") == "n30" and r.ts_ms < applied
    }
    assert len(signals["n30"].signals["xid_days"]) == len(n30_days) >= DAYS - 1
    # dbg's first failures were counted before their pattern could be seen, then taken back.
    assert len(signals["n07"].signals["xid_days"]) == 0
    assert len(signals["n07"].signals["failed_jobs"]) == 0


def test_a_hardware_failure_names_the_job_its_owner_and_its_size() -> None:
    records: list[Record] = [
        JobEvent(
            ts_ms=0,
            cluster="c",
            job_id="9",
            state=JobState.RUNNING,
            nodes=("n1", "n2"),
            gpus=16,
            user="bob",
            name="pretrain",
            partition="train",
        ),
        xid(HOUR_MS, "n2", 79),
        JobEvent(
            ts_ms=HOUR_MS + MINUTE_MS,
            cluster="c",
            job_id="9",
            state=JobState.FAILED,
            nodes=("n1", "n2"),
            gpus=16,
            user="bob",
            name="pretrain",
            end_ms=HOUR_MS + MINUTE_MS,
            partition="train",
        ),
    ]
    [failure] = [i for i in run(records).values() if i.kind is IncidentKind.JOB_HW_FAILURE]
    assert failure.evidence["job_context"] == [
        {"job_id": "9", "user": "bob", "name": "pretrain", "num_nodes": 2, "gpus": 16, "partition": "train"}
    ]
    assert failure.summary.startswith("[warn] Job 9 (16 GPUs on 2 nodes, partition train) ended FAILED")


def test_incidents_carry_the_job_context_of_their_evidence() -> None:
    records: list[Record] = [
        JobEvent(
            ts_ms=0,
            cluster="c",
            job_id="42",
            state=JobState.RUNNING,
            nodes=("n1", "n2"),
            gpus=16,
            user="alice",
            name="pretrain",
        ),
        xid(HOUR_MS, "n2", 79),
    ]
    [incident] = run(records).values()
    assert incident.kind is IncidentKind.GPU_BUS
    assert incident.evidence["job_context"] == [
        {"job_id": "42", "user": "alice", "name": "pretrain", "num_nodes": 2, "gpus": 16, "partition": ""}
    ]


def test_a_checkpoint_from_before_job_aware_verdicts_still_loads() -> None:
    """A worker restarted on the new code reads its old checkpoint: the new state starts empty."""
    import pickle

    from detectors.fleet import FleetConfig, FleetCore
    from detectors.incidents import _Open
    from detectors.jobs import JobRun, JobTracker
    from detectors.mttf import SizeBuckets

    old = {"cluster": "c", "job_id": "1", "start_ms": 0, "nodes": ("n1",), "gpus": 8, "covered_ms": {}}
    for state in ((None, old), old, list(old.values())):  # the layouts Pythons 3.11.x pickle slots in
        run = JobRun.__new__(JobRun)
        run.__setstate__(state)
        assert (run.job_id, run.nodes, run.user, run.app_xids, run.partition) == ("1", ("n1",), "", 0, "")

    tracker = JobTracker(attribution_before_ms=1, attribution_after_ms=1, allowed_lateness_ms=1, gpus_per_node=8,
                         size_buckets=SizeBuckets())  # fmt: skip
    tracker.start(
        JobEvent(ts_ms=0, cluster="slurm", job_id="7", state=JobState.RUNNING, nodes=("n1",), user="ann")
    )
    state = dict(tracker.__dict__)
    del state["_runs_of_job"]
    restored = JobTracker.__new__(JobTracker)
    restored.__setstate__(state)
    assert [c.user for c in restored.context_at("n1", "default")] == ["ann"]  # the index is rebuilt

    fleet = FleetCore(FleetConfig())
    state = {
        k: v
        for k, v in fleet.__dict__.items()
        if k not in ("_failure_users", "_user_runs", "_owner_reported")
    }
    revived = FleetCore.__new__(FleetCore)
    revived.__setstate__(state)
    assert revived._owner_reported == {} and revived._user_runs == {}
    assert pickle.loads(pickle.dumps(fleet)).__dict__.keys() == fleet.__dict__.keys()

    incident = _Open.__new__(_Open)
    incident.__setstate__((None, {"incident_id": "i", "jobs": {"7"}}))
    assert (incident.incident_id, incident.job_context, incident.owner, incident.nodes) == (
        "i",
        {},
        "",
        set(),
    )


def test_a_checkpoint_from_before_partitions_still_loads() -> None:
    """Job contexts, runs and fleet parts pickled before ``partition`` existed load without one."""
    import pickle

    from detectors.fleet import JobPart
    from detectors.jobs import JobContext, JobRun

    context = JobContext("7", "ann", "train", 2, 16)
    old = JobContext.__new__(JobContext)
    old.__setstate__(context.__getstate__()[:5])  # the five fields of the previous version
    assert old == context and old.partition == ""
    assert old.to_dict()["partition"] == ""
    debug = JobContext("7", "ann", "train", 2, 16, "debug")
    assert pickle.loads(pickle.dumps(debug)) == debug

    run = JobRun.__new__(JobRun)
    run.__setstate__(["c", "7", 0, ("n1",), 8, {}, "ann", "train", 3])  # nine fields, no partition
    assert (run.app_xids, run.context.partition) == (3, "")

    part = JobPart("c", "7", 0, 1, JobState.FAILED, ("n1",), 8, ("n1",), (), "ann", 0, "train", "debug")
    old_part = JobPart.__new__(JobPart)
    old_part.__setstate__(part.__getstate__()[:12])
    assert (old_part.name, old_part.partition) == ("train", "")
    assert pickle.loads(pickle.dumps(part)) == part


def test_a_checkpoint_from_before_job_aware_storms_still_loads() -> None:
    """The previous version's core pickled a configuration without the fields added since (a
    frozen dataclass with slots pickles its values in order) and no job-storm state; its fleet
    stage kept no per-GPU peaks. Both load: new fields at their defaults, new state empty, the
    storm baseline from the quantile alone."""
    from detectors.fleet import FleetConfig, FleetCore

    core = DetectionCore(config())
    old_config = CoreConfig.__new__(CoreConfig)
    values = config().__getstate__()
    names = [item.name for item in dataclasses.fields(CoreConfig)]
    old_config.__setstate__(values[: names.index("storm_owner_window_hours")])
    assert not hasattr(old_config, "storm_owner_window_hours")
    state = {k: v for k, v in core.__dict__.items() if k not in ("_job_storms", "_storm_owners")}
    state["config"] = old_config
    restored = DetectionCore.__new__(DetectionCore)
    restored.__setstate__(state)
    assert restored.config == config() and restored._job_storms == {}
    assert restored.process(xid(0, "n1", 13))

    fleet = FleetCore(FleetConfig())
    old_fleet = FleetConfig.__new__(FleetConfig)
    names = [item.name for item in dataclasses.fields(FleetConfig)]
    old_fleet.__setstate__(FleetConfig().__getstate__()[: names.index("baseline_min_gpus")])
    # ... and no ECC reference state either: it starts from the restart on.
    ecc_state = ("_sbe", "_gpu_sbe", "_gpu_flagged", "_next_ecc_ms", "_first_ecc_ms", "_ecc_origin_ms")
    state = {
        k: v
        for k, v in fleet.__dict__.items()
        if k not in ("_gpu_peak", "_gpu_maxima", "_ecc_references", *ecc_state)
    }
    state["config"] = old_fleet
    revived = FleetCore.__new__(FleetCore)
    revived.__setstate__(state)
    assert revived.config == FleetConfig() and revived._gpu_maxima is None
    assert revived._gpu_sbe == {} and revived.ecc_reference(0) is None


def test_failed_runs_are_known_by_job_without_a_pass_over_them() -> None:
    """A user's sweep failing thousands of runs a day: whether a failure is counted already is
    asked of the jobs kept with the failures (a user's, a node's), not of a pass over them (which
    made a sweep quadratic); the jobs kept are those of the failures at every step, after the
    window drops old ones, after a take-back, and through a checkpoint from before they were kept."""
    import pickle
    from collections import deque

    from detectors.fleet import FAILED_APPLICATION, FAILED_JOB, FleetFact

    class Untouchable(deque):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the failures were scanned")

    records = fleet_records(crash_on=("n07", "n21"), faulty=("n13",))
    core = DetectionCore(config())
    assert core.fleet is not None
    for number, record in enumerate(records, 1):
        assert core.process(record)
        core.drain()
        if number % 997 == 0:
            fleet = core.fleet
            for user, failures in fleet._user_app_failures.items():
                assert fleet._user_app_jobs[user] == {job for _, _, job in failures}, user
            for node, state in fleet._lemons._nodes.items():
                assert state.failed_jobs == {job for _, job in state.failed}, node
            # a checkpoint from before the jobs were kept: they are found once
            old = dict(fleet.__dict__)
            del old["_user_app_jobs"]
            restored = type(fleet).__new__(type(fleet))
            restored.__setstate__(pickle.loads(pickle.dumps(old)))
            assert restored._user_app_jobs == fleet._user_app_jobs
    fleet = core.fleet
    failures = fleet._user_app_failures["dbg"]
    assert len(failures) > 10
    fleet._user_app_failures["dbg"] = Untouchable(failures)
    for state in fleet._lemons._nodes.values():
        state.failed = Untouchable(state.failed)
    at = records[-1].ts_ms
    failed = FleetFact(at, FAILED_JOB, "n07", "dbg", "sweep-1", FAILED_APPLICATION)
    fleet._app_failure(failed)
    fleet._app_failure(failed)  # the run's other node: one failure a run
    assert fleet._lemons.record_failed_job("n07", "sweep-1", at)
    assert not fleet._lemons.record_failed_job("n07", "sweep-1", at)
    kept = fleet._user_app_failures["dbg"]
    assert "sweep-1" in fleet._user_app_jobs["dbg"] and len(kept) == len(failures) + 1 == len(
        fleet._user_app_jobs["dbg"]
    )
