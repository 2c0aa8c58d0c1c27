"""Invariants of the event-driven cluster: placement, timing, kills and the attribution window."""

from __future__ import annotations

import itertools
from collections import defaultdict

from schemas.records import JobState
from schemas.timeutil import MINUTE_MS
from stream.simulator.faults import FAULT_QUIET_AFTER_END_MS
from stream.simulator.history import ClusterHistory

# SPEC 4.4: a hardware event between 10 minutes before and 5 minutes after the end.
WINDOW_BEFORE_MS = 10 * MINUTE_MS
WINDOW_AFTER_MS = 5 * MINUTE_MS


def test_nodes_never_run_two_jobs_or_a_job_while_down(mid: ClusterHistory) -> None:
    end_of_span = mid.config.end_ms
    busy: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for job in mid.jobs:
        for node in job.nodes:
            busy[node].append((job.start_ms, job.end_ms if job.end_ms is not None else end_of_span))
    for fault in mid.faults:
        # Down from the onset to the repair; the killed job may linger until its end.
        down_from = fault.onset_ms
        if fault.job_index is not None:
            dying = next(job for job in mid.jobs if job.index == fault.job_index)
            down_from = dying.end_ms if dying.end_ms is not None else end_of_span
        busy[fault.node].append((down_from, fault.repaired_ms))
    for intervals in busy.values():
        intervals.sort()
        for (_, first_end), (second_start, _) in itertools.pairwise(intervals):
            assert second_start >= first_end


def test_scheduler_times_are_whole_seconds(mid: ClusterHistory) -> None:
    """sacct prints seconds, so submit/start/end must be whole seconds for truth to match it."""
    for job in mid.jobs:
        for ts_ms in (job.submit_ms, job.start_ms, job.end_ms):
            assert ts_ms is None or ts_ms % 1000 == 0, job
    assert all(fault.repaired_ms % 1000 == 0 for fault in mid.faults)


def test_killed_jobs_end_within_minutes_of_their_fault(mid: ClusterHistory) -> None:
    killed = [job for job in mid.jobs if job.hardware]
    assert killed
    for job in killed:
        assert job.fault_index is not None and job.end_ms is not None
        fault = mid.faults[job.fault_index]
        assert fault.killed_job and fault.node in job.nodes
        assert 30_000 <= job.end_ms - fault.onset_ms <= 241_000
        assert job.state in (JobState.FAILED, JobState.NODE_FAIL)
    resubmitted = [job for job in mid.jobs if job.resubmit_of is not None]
    assert resubmitted


def test_truth_agrees_with_the_attribution_window(mid: ClusterHistory) -> None:
    """A FAILED/NODE_FAIL end is hardware exactly when a fault of its nodes is in its window."""
    onsets: dict[int, list[int]] = defaultdict(list)
    for fault in mid.faults:
        onsets[fault.node].append(fault.onset_ms)
    checked = 0
    for job in mid.jobs:
        if job.end_ms is None or not job.state.may_be_hardware_failure:
            continue
        low, high = job.end_ms - WINDOW_BEFORE_MS, job.end_ms + WINDOW_AFTER_MS
        in_window = any(low <= onset <= high for node in job.nodes for onset in onsets[node])
        assert in_window == job.hardware, job
        checked += 1
    assert checked > 100


def test_faults_never_follow_a_job_end_closely(mid: ClusterHistory) -> None:
    ends: dict[int, list[int]] = defaultdict(list)
    for job in mid.jobs:
        if job.end_ms is not None:
            for node in job.nodes:
                ends[node].append(job.end_ms)
    for fault in mid.faults:
        if fault.killed_job:
            continue
        assert all(not (0 <= fault.onset_ms - end < FAULT_QUIET_AFTER_END_MS) for end in ends[fault.node]), (
            fault
        )
