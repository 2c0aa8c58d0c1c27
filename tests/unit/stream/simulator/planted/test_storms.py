"""XID storms: their lines are on one GPU within the storm; a job's storm repeats an application XID
and may kill its job, a GPU's repeats a hardware-class one and kills none."""

from __future__ import annotations

from pathlib import Path

from schemas.records import JobState
from stream.simulator import FaultTruth, Truth
from stream.simulator.planted.storms import GPU_STORM_XIDS, STORM_XIDS


def test_storm_lines_are_on_one_gpu_within_the_storm(
    written: tuple[Path, Truth],
    faults_by_kind: dict[str, list[FaultTruth]],
    xid_lines: list[tuple[int, str, str, int]],
) -> None:
    _, truth = written
    gpu_storms, job_storms = faults_by_kind["xid_storm"], faults_by_kind["job_xid_storm"]
    assert len(gpu_storms) >= 2 and len(job_storms) >= 2
    assert all(storm.xid in GPU_STORM_XIDS and not storm.details["killed_job"] for storm in gpu_storms)
    assert all(storm.xid in STORM_XIDS for storm in job_storms)
    users = {storm.details["user"] for storm in gpu_storms + job_storms}
    assert all(user.startswith("user") for user in users)
    failures = {failure.job_id: failure for failure in truth.job_failures}
    storms = gpu_storms + job_storms
    for storm in storms:
        assert storm.end_ms is not None and storm.job_id is not None
        inside = [
            line for line in xid_lines if line[1] == storm.node and storm.onset_ms <= line[0] <= storm.end_ms
        ]
        on_gpu = [line for line in inside if line[2] == storm.pci_bus_id and line[3] == storm.xid]
        assert len(on_gpu) >= storm.details["lines"] >= 2
        assert on_gpu[0][0] == storm.onset_ms and on_gpu[-1][0] == storm.end_ms
        # Other lines of the same code on the node within the storm: at most a stray one or two.
        assert sum(1 for line in inside if line[3] == storm.xid) - len(on_gpu) <= 2
        if storm.details["killed_job"]:
            assert storm.job_id is not None
            failure = failures[storm.job_id]
            assert failure.state is JobState.FAILED and not failure.hardware and failure.fault_id is None
            assert 0 < failure.end_ms - storm.end_ms <= 301_000
    assert any(storm.details["killed_job"] for storm in storms)
