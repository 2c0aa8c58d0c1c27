"""End to end: what `faultstream diff` calls the base run is what `faultstream replay` stores.

diff replays in memory; the claim that it shows what a rule change would do to real history rests
on its base being the replay users know. Both run as a user runs them, each in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

LOGS = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14" / "logs"


def faultstream(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == code, (
        f"faultstream {' '.join(args)}: {result.returncode}\n{result.stderr[-3000:]}"
    )
    return result


def test_the_base_of_a_diff_is_what_replay_stores(tmp_path: Path) -> None:
    store = tmp_path / "store"
    faultstream("replay", str(LOGS), "--clickhouse", f"chdb://{store}", "--json", "--no-progress")
    out = faultstream(
        "query",
        "SELECT incident_id, kind, severity, toUnixTimestamp64Milli(first_evidence) AS first_ms "
        "FROM faultstream.incidents FINAL",
        "--clickhouse",
        f"chdb://{store}",
    ).stdout
    stored = {
        row["incident_id"]: (row["kind"], row["severity"], int(row["first_ms"]))
        for row in map(json.loads, filter(str.strip, out.splitlines()))
    }
    # --exit-code: 1 because the candidate differs; the base is the environment's, as replay's.
    result = json.loads(
        faultstream(
            "diff", str(LOGS), "--set", "storm_min_events=1000", "--all", "--json", "--exit-code", code=1
        ).stdout
    )
    from schemas.timeutil import parse_ts

    base = {
        change["base"]["incident_id"]: (
            change["kind"],
            change["base"]["severity"],
            parse_ts(change["base"]["first_evidence"]),
        )
        for change in result["changes"]
        if change["base"] is not None
    }
    assert len(stored) > 20
    assert base == stored
    assert [c["kind"] for c in result["changes"] if c["change"] != "unchanged"] == ["job_xid_storm"]
