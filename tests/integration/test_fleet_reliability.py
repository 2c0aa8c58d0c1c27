"""Fleet reliability without job records (issue 45): MTBF and failures per 1,000 node-days per
calendar window, over the inventory's nodes, from a real replay into the real ClickHouse engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.services.worker import cli, query

pytestmark = pytest.mark.integration


def inputs(sim: Path) -> list[str]:
    return [str(sim / name) for name in ("kernel.log", "sacct.txt", "dcgm.prom")]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fleet")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "30", "--days", "21", "--seed", "5", "--ecc-interval-minutes", "720",
        "--out", str(sim))  # fmt: skip
    return folder, sim


def test_with_an_inventory_every_node_counts_and_mtbf_is_hours_over_failures(
    replayed: tuple[Path, Path],
) -> None:
    folder, sim = replayed
    spare = [f"spare{n:03d}" for n in range(70)]  # never named by any input: they never failed
    inventory = folder / "inventory.txt"
    inventory.write_text("\n".join([f"node{n:04d}" for n in range(1, 31)] + spare) + "\n")
    store = folder / "with-inventory"
    cli(
        {},
        "replay",
        *inputs(sim),
        "--inventory",
        str(inventory),
        "--clickhouse",
        f"chdb://{store}",
        "--no-progress",
    )
    report = json.loads(cli({}, "report", "--json", "--fleet-window", "week", "--clickhouse", f"chdb://{store}",
                            "--no-progress"))  # fmt: skip
    fleet = report["fleet"]
    assert fleet["inventory"] and fleet["nodes"] == 100 and fleet["window"] == "week"
    kinds = "'gpu_memory','gpu_row_remap','gpu_nvlink','gpu_bus','gpu_firmware','gpu_engine','gpu_thermal_power','gpu_recovery','nvswitch_fatal'"
    rows = query(
        store,
        f"""SELECT node, gpu, toString(toMonday(first_evidence)) AS week, toUnixTimestamp(first_evidence) AS at,
        toUnixTimestamp(last_evidence) AS last
        FROM faultstream.incidents FINAL WHERE severity = 'critical' AND kind IN ({kinds})""",
    )
    # A failure: a GPU's critical incidents each within the hour of the latest evidence before it.
    by_gpu: dict[tuple[str, str], list[dict[str, object]]] = {}
    for row in rows:
        by_gpu.setdefault((row["node"], row["gpu"]), []).append(row)
    expected: dict[str, int] = {}
    for incidents in by_gpu.values():
        incidents.sort(key=lambda row: (row["at"], row["last"]))
        for index, row in enumerate(incidents):
            if index == 0 or int(row["at"]) > max(int(r["last"]) for r in incidents[:index]) + 3600:
                expected[str(row["week"])] = expected.get(str(row["week"]), 0) + 1
    assert sum(expected.values()) > 0, "the simulated weeks have no hardware failure to count"
    got = {w["start"][:10]: w["hardware_failures"] for w in fleet["windows"] if w["hardware_failures"]}
    assert got == expected
    [span] = query(store, """SELECT toUnixTimestamp(min(ts)) AS first, toUnixTimestamp(max(ts)) AS last FROM (
        SELECT ts FROM faultstream.xid_events UNION ALL SELECT ts FROM faultstream.job_events
        UNION ALL SELECT ts FROM faultstream.ecc_samples)""")  # fmt: skip
    total_days = (int(span["last"]) - int(span["first"])) / 86400
    assert sum(w["node_days"] for w in fleet["windows"]) == pytest.approx(100 * total_days, rel=1e-3)
    for window in fleet["windows"]:
        days = window["node_days"] / 100
        if window["hardware_failures"]:
            assert window["mtbf_hours"] == pytest.approx(24 * days / window["hardware_failures"], rel=1e-3)
            assert window["failures_per_1000_node_days"] == pytest.approx(
                1000 * window["hardware_failures"] / window["node_days"], rel=1e-3)  # fmt: skip
        else:
            assert window["mtbf_hours"] is None
    # The reliability dashboard's fleet panel gives the report's figures for every full week.
    board = json.loads(
        (Path(__file__).resolve().parents[2] / "docker/grafana/dashboards/reliability.json").read_text()
    )
    [panel] = [p for p in board["panels"] if p["title"] == "Fleet MTBF per week (hours)"]
    sql = panel["targets"][0]["rawSql"].replace("$__timeFilter(first_evidence)", "1")
    rows = {str(row["time"])[:10]: row for row in query(store, sql)}
    full_weeks = [
        w for w in fleet["windows"] if w["node_days"] == pytest.approx(700) and w["hardware_failures"]
    ]
    assert full_weeks, "no full week with a failure: the panel is not compared"
    for window in full_weeks:
        row = rows[window["start"][:10]]
        assert int(row["hardware failures"]) == window["hardware_failures"]
        assert float(row["MTBF (hours)"]) == pytest.approx(window["mtbf_hours"], rel=1e-3)
        assert float(row["failures per 1000 node-days"]) == pytest.approx(
            window["failures_per_1000_node_days"], rel=1e-3)  # fmt: skip
    text = cli({}, "report", "--fleet-window", "week", "--clickhouse", f"chdb://{store}", "--no-progress")
    # With job records the text gives the fleet's view in one line beside the MTTF tables.
    failures = sum(expected.values())
    assert f"Fleet (no jobs needed): {failures} critical hardware failures over 100 nodes" in text, text


def test_without_an_inventory_the_report_says_which_nodes_it_assumed(replayed: tuple[Path, Path]) -> None:
    folder, sim = replayed
    store = folder / "no-inventory"
    cli({}, "replay", *inputs(sim), "--clickhouse", f"chdb://{store}", "--no-progress")
    fleet = json.loads(cli({}, "report", "--json", "--clickhouse", f"chdb://{store}", "--no-progress"))[
        "fleet"
    ]
    assert not fleet["inventory"] and fleet["nodes"] == 30
    assert "no inventory: the fleet is taken as the 30 nodes the inputs name" in fleet["note"]


def test_a_bad_inventory_stops_the_replay_before_it_starts(
    replayed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, sim = replayed
    bad = tmp_path / "inventory.csv"
    bad.write_text("node,gpus\nnode0001,eight\n")
    import subprocess
    import sys

    from tests.services.worker import ROOT  # noqa: F401 (cli runs from the repository root)

    done = subprocess.run(
        [sys.executable, "-m", "stream.cli", "replay", *inputs(sim), "--inventory", str(bad), "--clickhouse",
         f"chdb://{tmp_path / 'store'}", "--no-progress"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "inventory.csv:2: gpus must be a whole number" in done.stderr, done.stderr
    assert not (tmp_path / "store").exists()


def test_without_job_records_the_text_report_gives_the_window_table(replayed: tuple[Path, Path]) -> None:
    folder, sim = replayed
    store = folder / "kernel-only"
    text = cli({}, "replay", str(sim / "kernel.log"), "--clickhouse", f"chdb://{store}", "--no-progress")
    assert "r_f and MTTF are not defined" in text
    assert "Fleet reliability per day (critical hardware incidents; no inventory" in text, text
    assert "MTBF h" in text
