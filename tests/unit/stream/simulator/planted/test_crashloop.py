"""Crash-looping users: their jobs fail with application XIDs wherever the scheduler puts them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from schemas.records import JobState
from stream.simulator import SimulationConfig, simulate
from stream.simulator.config import pci_bus_id
from stream.simulator.history import run_model
from stream.simulator.planted.crashloop import CRASH_LOOP_XIDS, crash_loop_user_names

CONFIG = SimulationConfig(nodes=32, days=4, seed=5, ecc_interval_minutes=720, crash_loop_users=1)


def test_a_crash_looping_users_jobs_fail_with_application_xids_on_many_nodes() -> None:
    history = run_model(CONFIG)
    [user] = history.crash_loop_users
    assert user == crash_loop_user_names(CONFIG)[0] == "user009"  # after the 8 regular users
    theirs = [job for job in history.jobs if job.user == user]
    assert len(theirs) >= 0.7 * CONFIG.crash_loop_jobs_per_day * CONFIG.days
    assert all(len(job.nodes) == 1 for job in theirs)
    crashed = [job for job in theirs if job.state is JobState.FAILED and not job.hardware and job.end_ms]
    assert len(crashed) >= 0.9 * len(theirs)
    assert len({job.nodes[0] for job in crashed}) >= 8  # wherever they run
    codes = {code for code, _ in CRASH_LOOP_XIDS}
    for job in crashed:
        assert job.end_ms is not None
        lines = [
            x
            for x in history.xids
            if x.node == job.nodes[0] and job.start_ms <= x.ts_us // 1000 < job.end_ms and x.xid in codes
        ]
        assert lines, f"job {job.job_id} crashed without an application XID"


def test_without_crash_looping_users_the_cluster_is_what_it_was() -> None:
    """The scenario draws from its own stream: turning it off leaves every other draw alone."""
    plain = run_model(dataclasses.replace(CONFIG, crash_loop_users=0))
    assert plain.crash_loop_users == ()
    assert {job.user for job in plain.jobs} <= {f"user{n:03d}" for n in range(1, 9)}
    again = run_model(dataclasses.replace(CONFIG, crash_loop_users=0, crash_loop_jobs_per_day=99.0))
    assert again.jobs == plain.jobs and again.xids == plain.xids


def test_the_truth_names_the_crash_looping_users(tmp_path: Path) -> None:
    truth = simulate(CONFIG, tmp_path)
    assert truth.crash_loop_users == ("user009",)
    assert "user009" in (tmp_path / "sacct.txt").read_text()
    assert pci_bus_id(0) in (tmp_path / "kernel.log").read_text()


def test_a_pinned_crash_looping_user_crashes_on_one_node_among_other_users_jobs(tmp_path: Path) -> None:
    """The issue's case: one user's debug jobs all run on one node and crash there, day after day,
    while other users' jobs on that node keep completing. Pinning draws from the crash-loop stream
    after everything else: the regular submissions are those of the unpinned cluster."""
    pinned = dataclasses.replace(CONFIG, crash_loop_pinned_users=1)
    history = run_model(pinned)
    [(user, node)] = history.crash_loop_nodes.items()
    assert user == "user009"
    theirs = [job for job in history.jobs if job.user == user]
    assert len(theirs) >= 0.7 * CONFIG.crash_loop_jobs_per_day * CONFIG.days
    assert {job.nodes for job in theirs} == {(node,)}
    crashed = [job for job in theirs if job.state is JobState.FAILED and not job.hardware]
    assert len(crashed) >= 0.9 * len(theirs)
    others = [job for job in history.jobs if node in job.nodes and job.user != user]
    assert sum(job.state is JobState.COMPLETED for job in others) >= 3
    assert len({job.user for job in others}) >= 3
    truth = simulate(pinned, tmp_path)
    assert dict(truth.crash_loop_nodes) == {user: pinned.node_names[node]}
    regular = {job.job_id for job in run_model(CONFIG).jobs if job.user != user}
    assert regular <= {job.job_id for job in history.jobs}
