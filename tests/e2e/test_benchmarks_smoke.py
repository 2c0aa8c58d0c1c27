"""The benchmark scripts run end to end (``--smoke``: tiny inputs) against the test broker and print
their tables with every row filled. No speed is asserted: only that each figure is there and > 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"^-?[\d,]+(?:\.\d+)?$")


def run_benchmark(script: str, bootstrap: str, tmp_path: Path, *options: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--kafka", bootstrap, "--smoke",
         "--workdir", str(tmp_path), *options],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def cells(table: str, label: str) -> list[str]:
    """The cells after ``label`` on the table's row that starts with it (cells: 2+ spaces apart)."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in table.splitlines()]
    found = [row[1:] for row in rows if row and row[0].startswith(label) and len(row) > 1]
    assert len(found) == 1, f"no single row {label!r} in:\n{table}"
    return found[0]


def number(cell: str) -> float:
    assert NUMBER.match(cell), f"not a number: {cell!r}"
    return float(cell.replace(",", ""))


def test_worker_throughput_smoke(bootstrap: str, tmp_path: Path) -> None:
    # A scrape every hour, not the simulator's 6: the option reaches the simulation (its ECC samples
    # are counted on the records line), and the smoke cluster is still tiny (8 nodes x 1 day).
    table = run_benchmark("worker_throughput.py", bootstrap, tmp_path, "--ecc-interval-minutes", "60")
    assert "(DCGM scraped every 60 min)" in table
    samples = re.search(r"\becc ([\d,]+)\b", table)
    assert samples is not None and number(samples[1]) >= 8 * 8 * 24, table.splitlines()[:2]
    assert "1 record a message" in table and "256 records a message" in table
    for label in (
        "bare aiokafka consumer",
        "bare consumer + validation",
        "Faust decode-only agent",
        "faultstream worker",
        "embedded replay, same files",
        "embedded replay, files parsed in process",
    ):
        values = cells(table, label)
        assert len(values) == 4, (label, values)  # launch and steady, at 1 and at 256 records a message
        launch_1, steady_1, launch_256, steady_256 = values
        assert number(launch_1) > 0 and number(launch_256) > 0, (label, values)
        for steady in (steady_1, steady_256):  # a worker done at its first commit has no steady part
            assert steady == "n/a" or number(steady) > 0, (label, values)
    quix = cells(table, "quix-streams")
    assert quix[0].startswith("not installed") or all(number(v) > 0 for v in quix), quix
    core = cells(table, "detection core alone")  # only its loop is timed: no launch figure
    assert len(core) == 4 and core[0] == core[2] == "n/a", core
    assert number(core[1]) > 0 and number(core[3]) > 0, core
    for label in ("ratio core alone / bare consumer", "ratio worker / core alone"):
        values = cells(table, label)
        # steady only; a smoke run's worker is mostly start, its ratio may print as 2e-05
        assert len(values) == 4 and float(values[1]) > 0 and float(values[3]) > 0, (label, values)
    for label in (
        "ratio worker / embedded replay (",
        "ratio worker / embedded replay on 1 CPU",
        "ratio worker / bare consumer (",
        "ratio worker / bare consumer + validation",
    ):
        values = cells(table, label)
        assert len(values) == 4 and number(values[0]) > 0 and number(values[2]) > 0, (label, values)
    messages = cells(table, "messages xid / ecc / jobs")
    assert len(messages) == 2
    single, batched = ([number(n) for n in cell.split(" / ")] for cell in messages)
    assert all(n > 0 for n in single) and all(0 < b <= s for b, s in zip(batched, single, strict=True))
    copies = cells(table, "jobs-by-node copies")
    assert all(number(n) > 0 for cell in copies for n in cell.split(" / ")), copies


def test_worker_settings_smoke(bootstrap: str, tmp_path: Path) -> None:
    table = run_benchmark("worker_settings.py", bootstrap, tmp_path)
    assert "FAULTSTREAM_WORKER_POLL_BYTES" in table and "(DCGM scraped every 360 min)" in table
    for value in ("1048576", "1000000000"):
        launch, steady, launch_ratio, _steady_ratio = cells(table, value)
        assert number(launch) > 0 and number(launch_ratio) > 0, table
        assert steady == "n/a" or number(steady) > 0, table
    assert cells(table, "1048576")[2] == "1", table  # the first value is the ratios' reference


def test_latency_smoke(bootstrap: str, tmp_path: Path) -> None:
    table = run_benchmark("latency.py", bootstrap, tmp_path)
    assert "FAULTSTREAM_WORKER_FLUSH_SECONDS=" in table and "row is in ClickHouse" in table
    # The row of the smoke's one rate, 200 records/s: the cells after the rate.
    actual, seconds, records, messages, planted, matched, p50, p90, p99, top, lag, caught = cells(
        table, "200"
    )
    for value in (actual, seconds, records, messages, planted, matched, p50, p90, p99, top):
        assert number(value) > 0, table
    assert number(lag) >= 0, table
    assert caught == "n/a" or number(caught) >= 0, table  # n/a: not caught up within the drain time


def run_offline_benchmark(script: str, *args: str) -> str:
    """A benchmark that needs no broker (the embedded store is chdb, in its own process)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def test_replay_throughput_smoke(tmp_path: Path) -> None:
    out = run_offline_benchmark(
        "replay_throughput.py",
        "--simulate",
        "--nodes",
        "4",
        "--days",
        "1",
        "--runs",
        "1",
        "--workdir",
        str(tmp_path),
    )
    medians = re.search(r"median of 1: read\+decode ([\d,]+) records/s, replay ([\d,]+) records/s", out)
    assert medians and number(medians.group(1)) > 0 and number(medians.group(2)) > 0, out
    assert re.search(r"ratio replay/decode = [\d.]+ \(target >= 0.5\)", out), out
    decoded = re.search(r"read\+decode run 0: ([\d,]+) records", out)
    replayed = re.search(r"replay run 0: +([\d,]+) records", out)
    assert decoded and replayed and decoded.group(1) == replayed.group(1), out  # the same records each side


def test_state_size_smoke(tmp_path: Path) -> None:
    out = run_offline_benchmark(
        "state_size.py", "--simulate", "--nodes", "4", "--days", "1", "--workdir", str(tmp_path)
    )
    per_gpu = re.search(r"pickled state: [\d,]+ B = ([\d,]+) B per GPU", out)
    per_node = re.search(r"fleet stage state \(pickled\): [\d,]+ B = ([\d,]+) B per node", out)
    assert per_gpu and number(per_gpu.group(1)) > 0, out
    assert per_node and number(per_node.group(1)) > 0, out


def test_decode_smoke() -> None:
    out = run_offline_benchmark("decode.py", "--smoke")
    for kind in ("ecc", "xid", "job"):
        [row] = [line.split() for line in out.splitlines() if line.split()[:2] == [kind, "wire"]]
        assert len(row) == 8 and all(number(cell) > 0 for cell in row[2:5] + row[6:]), out


def test_storm_cost_smoke() -> None:
    """The XID storm benchmark needs no broker: every code's row, with and without a job, has a
    cost a line for each storm size and the ratio of the largest to the smallest."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "storm_cost.py"), "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"storm_cost.py failed:\n{done.stderr[-4000:]}"
    for code in ("XID 43", "XID 79", "XID 48", "XID 144"):
        rows = [
            re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines() if line.startswith(code)
        ]
        assert [row[1] for row in rows] == ["no", "yes"], (code, done.stdout)
        for row in rows:
            assert len(row) == 5 and all(number(cell) > 0 for cell in row[2:]), row
    [sweep] = [
        re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines() if line.startswith("sweep")
    ]
    assert len(sweep) == 4 and all(number(cell) > 0 for cell in sweep[1:]), sweep


def test_compiled_core_smoke() -> None:
    """The compiled-core benchmark builds the detectors with mypyc (needs gcc, no broker), checks
    that the compiled core emits what the interpreted one does, and prints both rows and the ratio."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compiled_core.py"), "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"compiled_core.py failed:\n{done.stderr[-4000:]}"
    for label in ("core interpreted", "core compiled"):
        row = cells(done.stdout, label)
        assert len(row) == 3 and all(number(cell) > 0 for cell in row), row
    assert number(cells(done.stdout, "ratio compiled / interpreted")[0]) > 0
    assert "outputs equal: yes" in done.stdout, done.stdout


def test_worker_path_smoke() -> None:
    """The worker's path without Kafka (no broker): a cost a record for each part, the path's and
    the core alone's records/s, and the path's outputs equal to the core alone's."""
    out = run_offline_benchmark("worker_path.py", "--smoke")
    for label in ("decode", "merge: add", "merge: release"):
        [cost] = cells(out, label)
        assert number(cost) > 0, out
    for label in ("path in all", "detection core alone"):
        row = cells(out, label)
        assert len(row) == 2 and all(number(cell) > 0 for cell in row), out
    assert "outputs equal to the core alone's: yes" in out, out


def markdown_row(table: str, label: str) -> list[str]:
    """The cells after ``label`` on the markdown table row that starts with it."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("|")
    ]
    found = [row[1:] for row in rows if row[0] == label]
    assert len(found) == 1, f"no single row {label!r} in:\n{table}"
    return found[0]


def test_kernel_log_worker_smoke(bootstrap: str, tmp_path: Path) -> None:
    table = run_benchmark("kernel_log_worker.py", bootstrap, tmp_path)
    for label in ("json", "raw XID lines", "raw, 9 others each"):
        assert all(number(cell) > 0 for cell in markdown_row(table, label)), table


def test_shipped_latency_smoke(bootstrap: str, tmp_path: Path) -> None:
    table = run_benchmark("shipped_latency.py", bootstrap, tmp_path)
    [row] = [line for line in table.splitlines() if line.startswith("| 200 |")]
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    assert all(number(cell) > 0 for cell in cells), table
    assert cells[2] == cells[3], f"every planted line must make its incident: {table}"


def test_receive_throughput_smoke(bootstrap: str, tmp_path: Path) -> None:
    table = run_benchmark("receive_throughput.py", bootstrap, tmp_path)
    [row] = [line for line in table.splitlines() if line.startswith("| 4 |")]
    assert all(number(cell.strip()) > 0 for cell in row.strip().strip("|").split("|")), table


def test_sparse_history_smoke() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sparse_history.py"), "--events", "300", "--nodes", "500",
         "--years", "1", "--runs", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rates = re.findall(r"^\s+(sparse|dense) \([^)]*\):\s+([\d,]+) events/s", done.stdout, re.M)
    assert [name for name, _ in rates] == ["sparse", "dense"] and all(
        number(rate) > 0 for _, rate in rates
    ), done.stdout
    assert re.search(r"sparse / dense: \d+\.\d\dx", done.stdout), done.stdout
