"""Calibration and determinism of the cluster model as a whole (no files written)."""

from __future__ import annotations

import pytest

from schemas.records import JobState
from schemas.timeutil import DAY_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.history import ClusterHistory, run_model

PAPER_RF = 6.5


def _exposure_days(history: ClusterHistory) -> float:
    end = history.config.end_ms
    total = 0
    for job in history.jobs:
        job_end = end if job.end_ms is None else min(job.end_ms, end)
        total += len(job.nodes) * (job_end - job.start_ms)
    return total / DAY_MS


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
