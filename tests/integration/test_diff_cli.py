"""`faultstream diff` on the bundled example history: a changed threshold or catalog entry adds,
removes or changes known incidents, and an unchanged configuration changes none.

The example (examples/sim-48x14, README) has one XID storm (node0021, GPU 0000:bd:00, from
2024-01-10 00:35: application XIDs of the one job running there, so that job's ``job_xid_storm``,
addressed to its owner) and one lemon node (node0037, from 2024-01-08); its kernel log has XID 13 lines,
application errors that open no incident. Both replays run in memory: no store, no service.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stream.cli.main import main

pytestmark = pytest.mark.integration

LOGS = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14" / "logs"


def diff(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> dict[str, Any]:
    assert main(["diff", str(LOGS), "--json", "--no-progress", *args]) == code
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def where(change: dict[str, Any]) -> tuple[str, str, str]:
    return (change["kind"], change["node"], change["gpu"])


def test_the_same_configuration_gives_an_empty_diff(capsys: pytest.CaptureFixture[str]) -> None:
    # The default quiet period, set explicitly: the same configuration in other words.
    result = diff(capsys, "--set", "FAULTSTREAM_QUIET_PERIOD_SECONDS=3600", "--exit-code", "--all")
    counts = result["counts"]
    assert counts["added"] == counts["removed"] == counts["changed"] == 0
    assert counts["unchanged"] == result["variants"]["base"]["incidents"] > 20
    assert all(c["base"]["incident_id"] == c["candidate"]["incident_id"] for c in result["changes"])
    assert result["variants"]["base"]["events"] == result["variants"]["candidate"]["events"] == 25_882


def test_raising_the_storm_floor_removes_the_known_storm_and_nothing_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = diff(capsys, "--set", "storm_min_events=1000", "--exit-code", code=1)
    assert result["counts"]["removed"] == 1
    assert result["counts"]["added"] == result["counts"]["changed"] == 0
    [removed] = result["changes"]
    assert removed["change"] == "removed" and removed["candidate"] is None
    assert where(removed) == ("job_xid_storm", "node0021", "0000:bd:00")
    assert removed["base"]["first_evidence"].startswith("2024-01-10T00:33")
    by_kind = result["by_kind"]
    assert by_kind.pop("job_xid_storm") == {"added": 0, "removed": 1, "changed": 0, "unchanged": 0}
    assert by_kind and all(
        row["unchanged"] and row["unchanged"] == sum(row.values()) for row in by_kind.values()
    )


def test_lowering_the_storm_floor_finds_the_same_storm_earlier(capsys: pytest.CaptureFixture[str]) -> None:
    result = diff(capsys, "--set", "storm_min_events=5")  # the default floor is 10
    assert result["counts"]["changed"] == 1 and result["counts"]["added"] == result["counts"]["removed"] == 0
    [changed] = result["changes"]
    assert where(changed) == ("job_xid_storm", "node0021", "0000:bd:00")
    assert changed["differences"] == ["first_evidence"]
    assert changed["candidate"]["first_evidence"] < changed["base"]["first_evidence"]
    assert changed["base"]["severity"] == changed["candidate"]["severity"] == "warn"


def test_a_stricter_lemon_threshold_removes_the_lemon(capsys: pytest.CaptureFixture[str]) -> None:
    result = diff(capsys, "--set", "lemon.threshold=100")
    assert [(c["change"], *where(c)) for c in result["changes"]] == [
        ("removed", "lemon_node", "node0037", "")
    ]


def test_a_catalog_entry_that_makes_xid_13_a_warning_adds_incidents_of_xid_13_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalog = tmp_path / "xid13.toml"
    catalog.write_text('[xid.13]\nseverity = "warn"\naction = "look at the job"\n')
    result = diff(capsys, "--catalog", str(catalog))
    counts = result["counts"]
    assert counts["added"] > 10 and counts["removed"] == counts["changed"] == 0
    assert counts["unchanged"] == result["variants"]["base"]["incidents"]
    for added in result["changes"]:
        assert added["change"] == "added" and added["kind"] == "gpu_application"
        assert added["candidate"]["severity"] == "warn" and "XID 13 x" in added["candidate"]["summary"]
    assert result["variants"]["candidate"]["assignments"] == [f"catalog {catalog}"]


def test_a_candidate_env_file_with_a_narrow_attribution_window_removes_the_job_failures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = tmp_path / "candidate.env"
    env.write_text(
        "# a compose env file: other variables are ignored\nCLICKHOUSE_WRITER_PASSWORD=x\n"
        "FAULTSTREAM_ATTRIBUTION_BEFORE_SECONDS=1\nFAULTSTREAM_ATTRIBUTION_AFTER_SECONDS=1\n"
    )
    result = diff(capsys, "--candidate-env", str(env))
    removed = [c for c in result["changes"] if c["change"] == "removed"]
    assert len(removed) == 8 and {c["kind"] for c in removed} == {"job_hw_failure"}
    assert result["counts"]["added"] == 0
    assert result["variants"]["candidate"]["described"] == f"the base with env {env}"


def test_the_base_can_be_changed_too(capsys: pytest.CaptureFixture[str]) -> None:
    # Base and candidate both without the storm: nothing differs between them.
    result = diff(capsys, "--base-set", "storm_min_events=1000", "--set", "lemon.threshold=100")
    assert result["variants"]["base"]["incidents"] == result["variants"]["candidate"]["incidents"] + 1
    assert [where(c) for c in result["changes"]] == [("lemon_node", "node0037", "")]


def test_the_text_output_counts_then_lists_the_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(LOGS), "--no-progress", "--set", "storm_min_events=1000"]) == 0
    out = capsys.readouterr().out
    assert "added 0, removed 1, changed 0, unchanged 22" in out
    assert "the base with storm_min_events=1000" in out
    [line] = [line for line in out.splitlines() if " removed " in line and "job_xid_storm" in line]
    assert "node0021/0000:bd:00" in line and "warn -> -" in line and "2024-01-10 00:33:52 -> -" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "storm_min_evnts=10"], "unknown setting 'storm_min_evnts'"),
        (["--set", "FAULTSTREAM_DATABASE=x"], "does not change what the detectors decide"),
        (["--catalog", "/nonexistent/rules.toml"], "rules.toml"),
    ],
)
def test_a_bad_setting_or_file_is_a_usage_error_before_any_replay(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["diff", str(LOGS), "--no-progress", *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_missing_input_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["diff", str(tmp_path / "no-such-log"), "--no-progress"]) == 2
    assert "no-such-log" in capsys.readouterr().err
