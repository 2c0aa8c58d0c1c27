"""Calibration and invariants of the cluster model (no files written)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from schemas.records import JobState
from stream.simulator.model import (
    APPLICATION_XIDS,
    FAULT_QUIET_AFTER_END_MS,
    MS_PER_DAY,
    MS_PER_MINUTE,
    ClusterHistory,
    SimulationConfig,
    iter_ecc_scrapes,
    run_model,
)

PAPER_RF = 6.5
# SPEC 4.4: a hardware event between 10 minutes before and 5 minutes after the end.
WINDOW_BEFORE_MS = 10 * MS_PER_MINUTE
WINDOW_AFTER_MS = 5 * MS_PER_MINUTE


@pytest.fixture(scope="module")
def mid() -> ClusterHistory:
    """A mid-size run: 500 nodes x 30 days."""
    return run_model(SimulationConfig(nodes=500, days=30, seed=1))


def _exposure_days(history: ClusterHistory) -> float:
    end = history.config.end_ms
    total = 0
    for job in history.jobs:
        job_end = end if job.end_ms is None else min(job.end_ms, end)
        total += len(job.nodes) * (job_end - job.start_ms)
    return total / MS_PER_DAY


def test_true_rf_is_calibrated_and_matches_its_definition(mid: ClusterHistory) -> None:
    killed = sum(1 for job in mid.jobs if job.fault_index is not None and job.end_ms is not None)
    recomputed = 1000.0 * killed / _exposure_days(mid)
    assert mid.true_rf_per_1000_node_days == pytest.approx(recomputed, rel=1e-12)
    assert mid.hardware_failures == killed
    assert PAPER_RF * 0.75 <= mid.true_rf_per_1000_node_days <= PAPER_RF * 1.25


def test_pooled_rf_over_seeds_is_close_to_the_configured_rate() -> None:
    killed = 0
    exposure = 0.0
    for seed in range(4):
        history = run_model(SimulationConfig(nodes=400, days=30, seed=100 + seed))
        killed += history.hardware_failures
        exposure += history.exposure_node_days
    assert 1000.0 * killed / exposure == pytest.approx(PAPER_RF, rel=0.15)


def test_fault_rate_is_per_node_day_of_wall_time(mid: ClusterHistory) -> None:
    node_days = mid.config.nodes * mid.config.days
    assert 1000.0 * len(mid.faults) / node_days == pytest.approx(PAPER_RF, rel=0.25)
    idle = [fault for fault in mid.faults if fault.job_index is None]
    assert idle, "some faults must strike idle nodes (benign traps: no job dies)"


def test_job_mix_utilisation_and_failure_fraction(mid: ClusterHistory) -> None:
    ended = [job for job in mid.jobs if job.end_ms is not None]
    failed = [job for job in ended if job.state is not JobState.COMPLETED]
    assert 0.18 <= len(failed) / len(mid.jobs) <= 0.30
    assert 0.70 <= mid.utilization <= 0.90
    assert {job.state for job in mid.jobs} >= {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.NODE_FAIL,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.OUT_OF_MEMORY,
        JobState.RUNNING,
    }
    # Hardware hits a small share of the jobs but a large share of the node-time.
    hardware = [job for job in ended if job.hardware]
    assert len(hardware) / len(mid.jobs) < 0.02
    sizes = sorted(len(job.nodes) for job in mid.jobs)
    assert sizes[len(sizes) // 2] == 1
    assert sizes[-1] >= 64


def test_application_xids_dominate(mid: ClusterHistory) -> None:
    application = sum(1 for record in mid.xids if record.xid in APPLICATION_XIDS)
    assert application / len(mid.xids) > 0.5
    hardware_codes = {record.xid for record in mid.xids} - set(APPLICATION_XIDS)
    assert hardware_codes >= {79, 48, 74}


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


def test_ecc_counters_follow_faults_and_reboots() -> None:
    config = SimulationConfig(nodes=30, days=6, seed=5, ecc_interval_minutes=60, hardware_failure_rate=120)
    history = run_model(config)
    scrapes = list(iter_ecc_scrapes(history))
    assert [scrape.ts_ms for scrape in scrapes] == list(history.ecc.scrape_ms)
    assert len(scrapes) == config.scrape_count
    dbe_faults = [fault for fault in history.faults if fault.xids[0] in (48, 94, 95)]
    assert dbe_faults
    gpn = config.gpus_per_node
    for fault in dbe_faults:
        after = next(k for k, scrape in enumerate(scrapes) if scrape.ts_ms >= fault.onset_ms)
        flat = fault.node * gpn + fault.gpu
        assert scrapes[after].dbe_aggregate[flat] > scrapes[after - 1].dbe_aggregate[flat]
    for before, after_scrape in itertools.pairwise(scrapes):
        assert (after_scrape.dbe_aggregate >= before.dbe_aggregate).all()
    assert scrapes[-1].sbe_volatile.sum() > 0


def test_same_config_same_history() -> None:
    config = SimulationConfig(nodes=40, days=4, seed=11, hardware_failure_rate=60)
    first, second = run_model(config), run_model(config)
    assert first.jobs == second.jobs
    assert first.faults == second.faults
    assert first.xids == second.xids
    assert first.kernel_lines == second.kernel_lines
    assert first.ecc.events == second.ecc.events
    other = run_model(SimulationConfig(nodes=40, days=4, seed=12, hardware_failure_rate=60))
    assert other.jobs != first.jobs


@pytest.mark.parametrize(
    "changes",
    [
        {"nodes": 0},
        {"days": 0},
        {"gpus_per_node": 0},
        {"ecc_interval_minutes": 0},
        {"user_failed_fraction": 1.5},
        {"user_failed_fraction": 0.5, "user_cancelled_fraction": 0.6},
        {"repair_min_hours": 5, "repair_max_hours": 2},
        {"cluster": " "},
    ],
)
def test_bad_config_is_rejected(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SimulationConfig(**changes)  # type: ignore[arg-type]


def test_int_and_float_spans_are_the_same_config() -> None:
    assert SimulationConfig(days=3) == SimulationConfig(days=3.0)
    assert isinstance(SimulationConfig(days=3).days, float)
