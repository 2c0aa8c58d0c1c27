"""One XID, two reporters: the kernel log's line and dcgm-exporter's XID gauge (issue 41).

A cluster that ships its kernel log and also remote_writes dcgm-exporter's series hears of each
XID twice: the kernel line, at the XID's time, and the change of ``DCGM_FI_DEV_XID_ERRORS`` (the
last XID code) at the next scrape. Replaying a simulated cluster's files with the gauge beside
them must give every table the replay without it gives: no second incident when the scrape comes
after the quiet period, no second piece of evidence when it comes within it, no second raw row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.dump_tables import TABLES
from tests.services.chdb_sql import SqlSession
from tests.services.worker import cli
from tests.services.xid_gauge import gauge_reports, write_xid_gauge

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def tables(store: Path) -> dict[str, list[str]]:
    """Every row of every table (``FINAL``; the wall-clock ``recorded_at`` left out), sorted."""
    session = SqlSession(store)
    try:
        found = {}
        for table in TABLES:
            answer = session.run(f"DESCRIBE TABLE faultstream.{table}")
            assert "error" not in answer, answer
            columns = [row[0] for row in answer["rows"] if row[0] != "recorded_at"]
            final = "" if table == "mttf_windows" else " FINAL"
            answer = session.run(f"SELECT {', '.join(columns)} FROM faultstream.{table}{final}")
            assert "error" not in answer, answer
            found[table] = sorted(str(dict(zip(columns, row, strict=True))) for row in answer["rows"])
        return found
    finally:
        session.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("two-reporters") / "sim"
    cli({}, "simulate", "--nodes", "24", "--days", "10", "--seed", "43", "--out", str(folder))
    return folder


def test_the_gauge_beside_the_kernel_log_changes_nothing(sim: Path, tmp_path: Path) -> None:
    gauge = tmp_path / "dcgm-xid.prom"
    kernel = write_xid_gauge(sim, gauge)
    reports = gauge_reports(gauge)
    # Not vacuous: the gauge reports XIDs, most of them after the kernel's incident went quiet
    # (scrapes every 6 h), some of them critical hardware XIDs that open incidents.
    assert len(reports) >= 10
    logged = {(event.node, event.pci_bus_id, event.xid): event.ts_ms for event in kernel}
    late = [r for r in reports if r.ts_ms - logged[(r.node, r.pci_bus_id, r.xid)] > HOUR_MS]
    assert len(late) >= len(reports) // 2
    assert {79, 48} & {report.xid for report in reports}
    inputs = [str(sim / "kernel.log"), str(sim / "dcgm.prom"), str(sim / "sacct.txt")]
    alone, both = tmp_path / "alone", tmp_path / "both"
    cli({}, "replay", *inputs, "--clickhouse", f"chdb://{alone}", "--no-progress")
    cli({}, "replay", *inputs, str(gauge), "--clickhouse", f"chdb://{both}", "--no-progress")
    expected, got = tables(alone), tables(both)
    assert len(expected["incidents"]) >= 5
    # The incidents first: what the two reports did to them is the point.
    for table in ("incidents", *TABLES):
        assert got[table] == expected[table], table
