"""``faultstream evaluate --matrix``: one small cell end to end (simulate, embedded replay into
chdb, score beside the baseline rules), and the table it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_matrix_runs_a_cell_and_scores_detectors_beside_baselines(tmp_path: Path) -> None:
    work = tmp_path / "matrix"
    table = tmp_path / "table.md"
    command = [sys.executable, "-m", "stream.cli", "evaluate", "--matrix", str(work), "--cells",
               "ecc-quadratic-15m-32n-7d", "--seeds", "1", "--table-out", str(table)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    [cell] = json.loads((work / "matrix.json").read_text())
    assert cell["cell"] == "ecc-quadratic-15m-32n-7d" and cell["seed"] == 1
    rows = {
        (row["rule"], row["detector"]): row for row in cell["comparison"] if row["kind"] == "ecc_degradation"
    }
    mine = rows[("detector", "ECC trend (River)")]
    fixed = rows[("baseline", "SBE >= 100 in 24 h (fixed)")]
    assert mine["truth"] >= 3 and mine["recall"] == 1.0 and mine["precision"] == 1.0
    assert mine["median_lead_time_hours"] >= 24  # the slow quadratic rise is warned of a day ahead
    assert (
        fixed["median_lead_time_hours"] is None
        or fixed["median_lead_time_hours"] < mine["median_lead_time_hours"]
    )
    critical = {row["detector"]: row for row in cell["comparison"] if row["kind"] == "critical_hw"}
    assert critical["critical hardware (rules)"]["recall"] == 1.0
    assert critical["XID > 0 (DCGM rule)"]["false_positives"] > 0  # application XIDs page too
    assert "| ecc_degradation | detector | ECC trend (River) |" in table.read_text()
    assert table.read_text().strip() in result.stdout
