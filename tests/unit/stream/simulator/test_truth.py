"""truth.json: round trip, extensibility, agreement with the model."""

from __future__ import annotations

from pathlib import Path

import orjson

from schemas.records import JobState
from stream.simulator import SimulationConfig, simulate
from stream.simulator.history import run_model
from stream.simulator.truth import FaultTruth, Truth, build_truth

CONFIG = SimulationConfig(nodes=16, days=3, seed=9, ecc_interval_minutes=240, hardware_failure_rate=200)


def test_truth_round_trips_through_json(tmp_path: Path) -> None:
    truth = simulate(CONFIG, tmp_path)
    loaded = Truth.load(tmp_path / "truth.json")
    assert loaded == truth
    loaded.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "truth.json").read_bytes()


def test_truth_json_has_the_documented_keys(tmp_path: Path) -> None:
    simulate(CONFIG, tmp_path)
    data = orjson.loads((tmp_path / "truth.json").read_bytes())
    assert list(data) == [
        "config",
        "span",
        "true_rf_per_1000_node_days",
        "exposure_node_days",
        "hardware_failures",
        "jobs",
        "jobs_failed",
        "utilization",
        "faults",
        "job_failures",
        "xid_counts",
        "lemon_nodes",
        "maintenance",
        "crash_loop_users",
    ]
    assert data["span"] == {"start": "2024-01-01T00:00:00.000Z", "end": "2024-01-04T00:00:00.000Z"}
    common = {"fault_id", "kind", "node", "gpu", "pci_bus_id", "xid", "xids", "onset", "job_id", "repaired"}
    assert all(common <= fault.keys() for fault in data["faults"])
    critical = next(fault for fault in data["faults"] if fault["kind"] == "critical_hw")
    assert {"job_id", "repaired", "template", "killed_job", "source"} <= critical.keys()
    failure = data["job_failures"][0]
    assert list(failure) == ["job_id", "state", "end", "hardware", "nodes", "gpus", "fault_id"]
    assert all(code.isdigit() for code in data["xid_counts"])


def test_unknown_fault_kinds_and_keys_survive_a_round_trip() -> None:
    raw = {
        "fault_id": "lemon-000001",
        "kind": "lemon_node",
        "node": "node0003",
        "gpu": None,
        "pci_bus_id": "",
        "xid": None,
        "xids": [],
        "onset": "2024-01-02T00:00:00.000Z",
        "job_id": None,
        "repaired": None,
        "signals": {"xid_count": 40},
    }
    fault = FaultTruth.from_dict(raw)
    assert fault.kind == "lemon_node" and fault.gpu is None
    assert fault.details == {"signals": {"xid_count": 40}}
    assert fault.to_dict() == raw
    assert (fault.end_ms, fault.failure_ms, fault.gpus) == (None, None, ())


def test_end_failure_and_gpus_are_read_from_the_details() -> None:
    raw = {
        "fault_id": "deg-000001",
        "kind": "ecc_degradation",
        "node": "node0003",
        "gpu": 2,
        "pci_bus_id": "0000:47:00",
        "xid": None,
        "xids": [],
        "onset": "2024-01-02T00:00:00.000Z",
        "job_id": None,
        "repaired": None,
        "end": "2024-01-05T00:00:00.000Z",
        "failure": "2024-01-05T00:00:00.000Z",
        "gpus": [2],
        "critical_fault_id": "hw-000004",
    }
    fault = FaultTruth.from_dict(raw)
    assert fault.failure_ms == fault.end_ms == fault.onset_ms + 3 * 86_400_000
    assert fault.gpus == (2,)
    assert fault.details["critical_fault_id"] == "hw-000004"
    assert fault.to_dict() == raw


def test_a_fault_of_an_older_truth_file_loads_without_the_new_keys() -> None:
    old = {
        "fault_id": "hw-000001",
        "kind": "critical_hw",
        "node": "node0003",
        "gpu": 2,
        "pci_bus_id": "0000:47:00",
        "xid": 79,
        "xids": [79],
        "onset": "2024-01-02T00:00:00.000Z",
        "job_id": "4200010",
        "repaired": None,
        "template": "fallen_off_bus",
    }
    fault = FaultTruth.from_dict(old)
    assert fault.end_ms is None and fault.failure_ms is None and fault.gpus == (2,)
    assert fault.details == {"template": "fallen_off_bus"}


def test_truth_counts_match_the_history() -> None:
    history = run_model(CONFIG)
    truth = build_truth(history)
    assert truth.hardware_failures == sum(1 for failure in truth.job_failures if failure.hardware)
    assert truth.jobs == len(history.jobs)
    assert truth.true_rf_per_1000_node_days == 1000 * truth.hardware_failures / truth.exposure_node_days
    assert all(failure.state is not JobState.COMPLETED for failure in truth.job_failures)
    assert [fault.onset_ms for fault in truth.faults] == sorted(fault.onset_ms for fault in truth.faults)
    assert sum(truth.xid_counts.values()) == len(history.xids)
