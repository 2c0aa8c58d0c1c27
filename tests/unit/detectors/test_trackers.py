"""The trackers behind the detection core: findings, job runs and attribution, MTTF exposure."""

import dataclasses

import pytest

from detectors.attribution import HardwareEvent
from detectors.exposure import ExposureTracker
from detectors.incidents import EvidenceItem, Finding, IncidentTracker
from detectors.jobs import JobTracker
from detectors.mttf import SizeBuckets
from schemas.outputs import IncidentKind, IncidentStatus, Severity
from schemas.records import JobEvent, JobState
from schemas.timeutil import HOUR_MS, MINUTE_MS

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z, a window boundary


def finding(ts_ms, severity=Severity.WARN, score=0.5):
    return Finding(
        cluster="c", kind=IncidentKind.GPU_FIRMWARE, node="n1", gpu="0000:07:00", severity=severity,
        detector="test", score=score, action=f"act on {severity.value}", title=f"{severity.value} title",
        evidence=EvidenceItem(ts_ms),
    )  # fmt: skip


def test_finding_is_keyword_only_frozen_and_gpu_defaults_to_the_whole_node():
    with pytest.raises(TypeError):
        Finding("c", IncidentKind.GPU_BUS, "n1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding(0).score = 2.0
    node_wide = dataclasses.replace(finding(0), gpu="")
    assert node_wide.gpu == ""


def test_an_incident_takes_the_worst_severity_and_the_highest_score_of_its_findings():
    tracker = IncidentTracker(quiet_period_ms=HOUR_MS)
    tracker.observe(finding(T0, Severity.WARN, score=0.9))
    [updated] = tracker.observe(finding(T0 + MINUTE_MS, Severity.CRITICAL, score=0.5))
    assert updated.status is IncidentStatus.UPDATED
    assert (updated.severity, updated.score, updated.action) == (Severity.CRITICAL, 0.9, "act on critical")


def jobs():
    return JobTracker(
        attribution_before_ms=10 * MINUTE_MS, attribution_after_ms=5 * MINUTE_MS,
        allowed_lateness_ms=5 * MINUTE_MS, gpus_per_node=8, size_buckets=SizeBuckets(),
    )  # fmt: skip


def job(ts, state, nodes=("n1", "n2"), start=T0):
    return JobEvent(ts_ms=ts, cluster="c", job_id="j", state=state, nodes=nodes, start_ms=start)


def test_job_tracker_ignores_redelivered_starts_and_ends():
    tracker = jobs()
    run = tracker.start(job(T0, JobState.RUNNING))
    assert run is not None and run.gpus == 16
    assert tracker.start(job(T0, JobState.RUNNING)) is None
    assert tracker.jobs_at("n2") == ("j",)
    ended = tracker.end(job(T0 + HOUR_MS, JobState.COMPLETED))
    assert ended is not None and ended.run is run and ended.decide_at_ms is None
    assert tracker.jobs_at("n2") == ()
    assert tracker.end(job(T0 + HOUR_MS, JobState.COMPLETED)) is None
    assert tracker.start(job(T0, JobState.RUNNING)) is None  # that run is over
    assert list(tracker.running) == []


def test_ended_runs_are_forgotten_in_rounds_not_at_every_deadline():
    """A cluster that ends thousands of runs a day keeps more than the floor within the horizon:
    they are copied to forget the old ones once they have doubled, not at every deadline."""
    tracker = jobs()

    def end(number):
        ended = JobEvent(ts_ms=T0 + number * MINUTE_MS, cluster="c", job_id=str(number),
                         state=JobState.COMPLETED, nodes=("n1",), start_ms=T0)  # fmt: skip
        return tracker.end(ended)

    for number in range(5000):
        assert end(number) is not None
    tracker.forget_ended(T0)  # none ended before the horizon: all kept, 10,000 before the next copy
    kept = tracker._ended_runs
    for _ in range(100):
        tracker.forget_ended(T0)
    assert tracker._ended_runs is kept and len(kept) == 5000
    for number in range(5000, 10001):
        end(number)
    tracker.forget_ended(T0 + 5000 * MINUTE_MS)  # past the limit: those ended before go
    assert len(tracker._ended_runs) == 5001
    assert end(9000) is None  # a redelivered end of a run remembered
    assert end(10) is not None  # one forgotten: taken as a run that ended now


def test_job_tracker_attributes_a_failure_once_the_window_has_passed():
    tracker = jobs()
    tracker.start(job(T0, JobState.RUNNING))
    end = T0 + HOUR_MS
    tracker.add_evidence(HardwareEvent(end - MINUTE_MS, "n2", "0000:07:00", IncidentKind.GPU_MEMORY, 48))
    ended = tracker.end(job(end, JobState.NODE_FAIL))
    assert ended is not None and ended.decide_at_ms == end + 5 * MINUTE_MS
    assert tracker.next_decision_ms == end + 5 * MINUTE_MS
    assert tracker.decide_due(before_ms=end + 5 * MINUTE_MS) == []  # evidence may still come
    [decided] = tracker.decide_due(before_ms=end + 5 * MINUTE_MS + 1)
    assert decided.state is JobState.NODE_FAIL and decided.end_ms == end
    assert [(e.node, e.kind) for e in decided.evidence] == [("n2", IncidentKind.GPU_MEMORY)]
    assert tracker.next_decision_ms is None


def test_exposure_rows_of_a_run_add_up_to_its_duration():
    exposure = ExposureTracker((3600,), SizeBuckets())
    exposure.start_clock(T0)
    tracker = jobs()
    run = tracker.start(job(T0 + 30 * MINUTE_MS, JobState.RUNNING, start=T0 + 30 * MINUTE_MS))
    closed = exposure.close_windows(T0 + 2 * HOUR_MS, tracker.running)
    assert [r.window_start_ms for r in closed] == [T0, T0 + HOUR_MS]
    assert exposure.next_close_ms == T0 + 3 * HOUR_MS
    final = exposure.run_ended(run, T0 + 2 * HOUR_MS + 15 * MINUTE_MS, JobState.FAILED, hardware_failure=True)
    assert [(r.window_start_ms, r.failures, r.jobs_failed) for r in final] == [(T0 + 2 * HOUR_MS, 1, 1)]
    assert sum(r.job_hours for r in closed + final) == pytest.approx(1.75)
    assert all(r.node_hours == pytest.approx(2 * r.job_hours) for r in closed + final)


def test_an_incidents_job_context_is_made_again_only_when_a_job_joins_it():
    """An owner's incident gets a version at each failure of a sweep: the job context it shows is
    the jobs' (capped, by job id) at every version, each version with a list of its own, and a
    checkpoint leaves out what is made again."""
    import pickle

    from detectors.incidents import MAX_JOBS
    from detectors.jobs import JobContext

    tracker = IncidentTracker(quiet_period_ms=HOUR_MS)
    versions = []
    for number in range(MAX_JOBS + 10):
        context = JobContext(job_id=f"{number:03d}", user="sweeper")
        evidence = EvidenceItem(T0 + number * MINUTE_MS, jobs=(context.job_id,), job_context=(context,))
        [version] = tracker.observe(dataclasses.replace(finding(0), owner="sweeper", evidence=evidence))
        versions.append(version)
        shown = [c["job_id"] for c in version.evidence["job_context"]]
        assert shown == [f"{k:03d}" for k in range(min(number + 1, MAX_JOBS))], number
    versions[-1].evidence["job_context"].clear()
    assert len(versions[-2].evidence["job_context"]) == MAX_JOBS
    [open_incident] = tracker._open.values()
    assert open_incident.context_dicts is not None
    restored = pickle.loads(pickle.dumps(tracker))
    [reopened] = restored._open.values()
    assert reopened.context_dicts is None and reopened.job_context == open_incident.job_context
    later = EvidenceItem(T0 + HOUR_MS // 2, jobs=("999",), job_context=(JobContext(job_id="999"),))
    [again] = restored.observe(dataclasses.replace(finding(0), owner="sweeper", evidence=later))
    assert again.evidence["job_context"] == versions[-2].evidence["job_context"]
