"""End to end through the command line: simulate -> replay into embedded ClickHouse -> SQL vs truth.

Each replay runs in its own process (chdb allows one store path per process), exactly as a user
runs it; the tables are read back with `faultstream query`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream.simulator import SimulationConfig, Truth, simulate

pytestmark = pytest.mark.e2e

INPUTS = ("kernel.log", "sacct.txt", "dcgm.prom")


def faultstream(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"faultstream {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result


def query(store: Path, sql: str) -> list[dict]:
    out = faultstream("query", sql, "--clickhouse", f"chdb://{store}").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def replay(store: Path, files: list[Path]) -> dict:
    out = faultstream(
        "replay", *map(str, files), "--clickhouse", f"chdb://{store}", "--json", "--no-progress"
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    out = tmp_path_factory.mktemp("sim")
    truth = simulate(SimulationConfig(nodes=96, days=21, seed=11), out)
    return out, truth


@pytest.fixture(scope="module")
def replayed(simulated, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out, _ = simulated
    store = tmp_path_factory.mktemp("store")
    summary = replay(store, [out / name for name in INPUTS])
    return store, summary


def test_replay_reads_every_source_and_dead_letters_nothing(replayed):
    _, summary = replayed
    kinds = {kind for source in summary["sources"] for kind in source["records"]}
    assert kinds == {"xid", "job", "ecc"}
    assert summary["dead_letters"] == 0
    assert summary["events"] > 10_000


def test_every_critical_fault_is_an_incident_at_its_first_evidence(simulated, replayed):
    _, truth = simulated
    store, _ = replayed
    incidents = query(
        store,
        "SELECT node, gpu, kind, severity, toUnixTimestamp64Milli(first_evidence) AS first "
        "FROM faultstream.incidents FINAL WHERE severity = 'critical'",
    )
    found = {(i["node"], i["gpu"], i["first"]) for i in incidents}
    critical = [f for f in truth.faults if f.kind == "critical_hw"]
    assert critical, "the simulation planted no critical fault"
    missed = [f for f in critical if (f.node, f.pci_bus_id, f.onset_ms) not in found]
    assert missed == []


def test_job_failure_attribution_matches_the_truth(simulated, replayed):
    _, truth = simulated
    store, _ = replayed
    rows = query(store, "SELECT job_id, hardware FROM faultstream.job_attributions FINAL")
    decided = {r["job_id"]: r["hardware"] for r in rows}
    expected = {f.job_id: f.hardware for f in truth.job_failures if f.state in ("FAILED", "NODE_FAIL")}
    assert set(expected) <= set(decided)
    correct = sum(decided[job] == hardware for job, hardware in expected.items())
    assert correct / len(expected) >= 0.95
    assert sum(expected.values()) > 0


def test_failure_rate_is_within_five_percent_of_the_truth(simulated, replayed):
    _, truth = simulated
    store, _ = replayed
    [row] = query(
        store,
        "SELECT sum(failures) AS failures, sum(node_hours) AS node_hours FROM faultstream.mttf_windows "
        "WHERE window_seconds = 86400 AND size_bucket = 'all'",
    )
    measured = 1000 * row["failures"] / (row["node_hours"] / 24)
    assert row["failures"] == truth.hardware_failures
    assert measured == pytest.approx(truth.true_rf_per_1000_node_days, rel=0.05)
    assert row["node_hours"] / 24 == pytest.approx(truth.exposure_node_days, rel=0.01)


def test_replaying_again_leaves_each_incident_once(simulated, replayed):
    out, _ = simulated
    store, _ = replayed
    replay(store, [out / name for name in INPUTS])
    [row] = query(
        store,
        "SELECT (SELECT count() FROM faultstream.incidents FINAL) AS final_rows, "
        "(SELECT uniqExact(incident_id) FROM faultstream.incidents) AS ids, "
        "(SELECT count() FROM faultstream.xid_events FINAL) AS xids, "
        "(SELECT uniqExact(event_id) FROM faultstream.xid_events) AS xid_ids",
    )
    assert row["final_rows"] == row["ids"] > 0
    assert row["xids"] == row["xid_ids"]


def table_dump(store: Path) -> dict[str, list[dict]]:
    return {
        "incidents": query(
            store,
            "SELECT incident_id, version, kind, severity, status, node, gpu, first_evidence, last_evidence, "
            "evidence_count, evidence FROM faultstream.incidents FINAL ORDER BY incident_id",
        ),
        "mttf": query(
            store,
            "SELECT window_seconds, window_start, size_bucket, round(node_hours, 6) AS nh, failures, jobs_ended "
            "FROM faultstream.mttf_windows ORDER BY window_seconds, window_start, size_bucket",
        ),
        "attributions": query(
            store,
            "SELECT job_id, start, hardware, evidence_nodes FROM faultstream.job_attributions FINAL ORDER BY job_id, start",
        ),
    }


def test_file_order_does_not_change_the_tables(simulated, replayed, tmp_path):
    out, _ = simulated
    store, _ = replayed
    other = tmp_path / "reversed"
    replay(other, [out / name for name in reversed(INPUTS)])
    assert table_dump(other) == table_dump(store)


def test_the_bundled_example_replays_as_readme_says(tmp_path):
    """README's quick start: `faultstream replay examples/sim-48x14/logs`, checked against its truth."""
    example = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14"
    truth = Truth.load(example / "truth.json")
    summary = replay(tmp_path / "store", [example / "logs"])
    assert summary["dead_letters"] == 0
    report = summary["report"]
    assert report["rf_per_1000_node_days"] == pytest.approx(truth.true_rf_per_1000_node_days, rel=0.05)
    critical = {(f.node, f.pci_bus_id) for f in truth.faults if f.kind == "critical_hw"}
    rows = query(
        tmp_path / "store", "SELECT node, gpu FROM faultstream.incidents FINAL WHERE severity = 'critical'"
    )
    assert critical <= {(r["node"], r["gpu"]) for r in rows}
