"""The trace-driven simulation (InfiniteHBD-Trace): deterministic, it plants exactly the trace's
faults (its own statistics file is the count by level, class and description), and the matrix's
trace cell simulates, replays into the real ClickHouse engine (chdb) and scores as the matrix does.

The cell is the matrix's largest history (400 nodes x 349 days): a few minutes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream.reports.matrix import run_cell
from stream.simulator import simulate
from stream.simulator.matrix import cell_config, cells_named
from stream.simulator.trace import TRACES
from stream.simulator.truth import Truth

pytestmark = pytest.mark.integration

CELL = cells_named(("trace-infinitehbd-400n-349d",))[0]
STATISTICS = TRACES["infinitehbd"].path.with_name("fault_statistics.json")


def trace_counts(truth: Truth) -> Counter[tuple[str, str, str]]:
    """(level, class, description) of every trace fault in the truth, observable or not."""
    return Counter(
        (f.details["trace_level"], f.details["trace_class"], f.details["trace_desc"])
        for f in truth.faults
        if "trace_fault" in f.details
    )


def published_counts() -> Counter[tuple[str, str, str]]:
    counts: Counter[tuple[str, str, str]] = Counter()
    for level, classes in json.loads(STATISTICS.read_text()).items():
        for fault_class, descs in classes.items():
            if fault_class == "LevelTotal":
                continue
            for desc, count in descs.items():
                if desc != "ClassTotal":
                    counts[(level, fault_class, desc)] += count
    return counts


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    work = tmp_path_factory.mktemp("trace-cell")
    return work, run_cell(CELL, 1001, work)


def test_a_trace_simulation_is_deterministic_and_plants_the_traces_faults(tmp_path: Path) -> None:
    config = cell_config(CELL, seed=7, days=60.0)
    first, second = tmp_path / "a", tmp_path / "b"
    truth = simulate(config, first)
    simulate(config, second)
    for name in ("kernel.log", "sacct.txt", "dcgm.prom", "truth.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    data = orjson.loads((first / "truth.json").read_bytes())
    assert data["config"]["fault_trace"] == "infinitehbd"
    assert Truth.load(first / "truth.json") == truth
    events = orjson.loads(TRACES["infinitehbd"].path.read_bytes())
    starts = [e for e in events if e["event_type"] == "fault_start" and e["event_time"] < 60.0]
    assert sum(trace_counts(truth).values()) == len(starts) > 0


def test_the_cell_plants_exactly_the_traces_faults_by_class(scored: tuple[Path, dict[str, Any]]) -> None:
    work, _ = scored
    truth = Truth.load(work / f"{CELL.name}-s1001" / "sim" / "truth.json")
    assert trace_counts(truth) == published_counts()
    kinds = Counter(f.kind for f in truth.faults)
    assert kinds == {"critical_hw": 126, "unobservable": 458, "lemon_node": 8}
    observable = Counter(f.details["trace_desc"] for f in truth.faults if f.kind == "critical_hw")
    assert observable == {
        "GPU DBE(Double Bit ECC) > Threshold": 60,
        "GPU device unknow error": 40,
        "GPU xid Error": 11,
        "nvidia-smi Timeout": 9,
        "GPU Lost": 5,
        "GPU device not found": 1,
    }
    dbe = [f for f in truth.faults if f.details.get("trace_desc", "").startswith("GPU DBE")]
    assert {f.xids for f in dbe} == {(48, 63)}
    assert len(truth.config.node_names) == 400


def test_the_cell_scores_every_critical_fault_and_the_traces_lemons(
    scored: tuple[Path, dict[str, Any]],
) -> None:
    _, result = scored
    rows = {(row["kind"], row["rule"]): row for row in result["comparison"] if row["rule"] == "detector"}
    critical = rows[("critical_hw", "detector")]
    assert (critical["truth"], critical["detected"]) == (126, 126), critical["missed"]
    assert critical["max_delay_hours"] == 0.0  # at the first XID line
    lemons = rows[("lemon_node", "detector")]
    # The lemons with at most one fault GPU telemetry shows are censored: 4 of the 8.
    assert lemons["truth"] == 4 and len(lemons["censored"]) == 4
    assert result["unobservable"]["faults"] == 458
    assert result["lemon_nodes"]["healthy"] == 392
