"""Bad input through the command line: dead letters with reasons, good records kept, loud stop on a bad source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


KERNEL = (
    b"2024-03-01T10:00:00+0000 node7 kernel: NVRM: Xid (PCI:0000:07:00): 79, pid='<unknown>', name=<unknown>, "
    b"GPU has fallen off the bus.\n"
    b"2024-03-01T10:00:01+0000 node7 kernel: NVRM: Xid (PCI:0000:07\n"  # truncated
    b"\xff\xfe garbage that is not a log line\n"
    b"2024-03-01T10:00:02+0000 node7 kernel: NVRM: Xid (PCI:0000:0f:00): 9999, pid=1, name=x, a new code\n"
    b"2024-03-01T09:00:00+0000 node7 kernel: NVRM: Xid (PCI:0000:0f:00): 48, pid=1, name=x, DBE far too late\n"
)


def test_bad_lines_are_dead_lettered_and_good_ones_kept(tmp_path: Path) -> None:
    log = tmp_path / "node7.log"
    log.write_bytes(KERNEL)
    store = f"chdb://{tmp_path / 'store'}"
    result = run("replay", str(log), "--clickhouse", store, "--json", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    [source] = summary["sources"]
    assert source["records"] == {"xid": 2}
    assert source["dead_letters"] == 1
    assert source["late"] == 1
    letters = run("query", "SELECT location, reason, raw FROM faultstream.dead_letters FINAL ORDER BY location",
                  "--clickhouse", store)  # fmt: skip
    rows = [json.loads(line) for line in letters.stdout.splitlines()]
    assert [r["location"] for r in rows] == ["line 2", "line 5"]
    assert "truncated" in rows[0]["reason"] and rows[0]["raw"].endswith("NVRM: Xid (PCI:0000:07")
    assert rows[1]["reason"].startswith("late event")
    assert json.loads(rows[1]["raw"])["xid"] == 48  # replayable as JSON Lines once the clock is fixed
    kinds = run(
        "query", "SELECT kind, severity FROM faultstream.incidents FINAL ORDER BY kind", "--clickhouse", store
    )
    assert [json.loads(line) for line in kinds.stdout.splitlines()] == [
        {"kind": "gpu_bus", "severity": "critical"},
        {"kind": "xid_unknown", "severity": "info"},
    ]


def test_a_source_that_is_mostly_bad_stops_the_replay_loudly(tmp_path: Path) -> None:
    bad = tmp_path / "events.jsonl"
    lines = [b'{"ts": "2024-03-01T10:00:00Z", "cluster": "c", "node": "n1", "xid": 79}']
    lines += [b'{"ts": "2024-03-01T10:00:00Z", "node": 5}'] * 300
    bad.write_bytes(b"\n".join(lines) + b"\n")
    result = run("replay", str(bad), "--clickhouse", f"chdb://{tmp_path / 'store'}", "--no-progress")
    assert result.returncode == 3
    assert "dead letters, above the limit" in result.stderr
    assert str(bad) in result.stderr


def test_missing_file_and_unknown_format_are_clear_errors(tmp_path: Path) -> None:
    missing = run("replay", str(tmp_path / "nope.log"), "--clickhouse", f"chdb://{tmp_path / 's'}")
    assert missing.returncode == 2
    assert "nope.log" in missing.stderr and "Traceback" not in missing.stderr


def test_init_db_and_report_on_an_empty_store(tmp_path: Path) -> None:
    store = f"chdb://{tmp_path / 'store'}"
    first = run("init-db", "--clickhouse", store)
    again = run("init-db", "--clickhouse", store)
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    report = run("report", "--json", "--clickhouse", store)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["rows"]["incidents"] == 0
    assert data["rf_per_1000_node_days"] is None


def test_a_folder_stands_for_its_files(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "node7").mkdir(parents=True)
    (logs / "node7" / "kern.log").write_bytes(KERNEL)
    (logs / ".hidden").write_bytes(b"not ours")
    result = run(
        "replay", str(logs), "--clickhouse", f"chdb://{tmp_path / 'store'}", "--json", "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    [source] = json.loads(result.stdout)["sources"]
    assert source["file"].endswith("node7/kern.log") and source["records"] == {"xid": 2}


def test_a_sql_error_is_clickhouses_one_line_message_and_a_non_zero_exit(tmp_path: Path) -> None:
    store = f"chdb://{tmp_path / 'store'}"
    for sql, says in (("SELEC 1", "Syntax error"), ("SELECT nope FROM faultstream.xid_events", "nope")):
        result = run("query", sql, "--clickhouse", store)
        assert result.returncode == 4
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        [line] = result.stderr.splitlines()  # one line
        assert line.startswith("faultstream: ClickHouse: query failed: Code: ") and says in line
        assert "FORMAT Native" not in line  # the driver's suffix, not the user's SQL
