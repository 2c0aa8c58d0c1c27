"""The text report's first screen: one MTTF table, no all-zero column, ETTR rows that say why."""

from __future__ import annotations

from typing import Any

import pytest

from stream.reports.text import _ettr_note, choose_mttf_windows, render_text, window_label


def bucket(name: str, median: float | None = 0.0, failures: int = 2) -> dict[str, Any]:
    return {
        "size_bucket": name, "min_gpus": 1, "node_hours": 240.0, "gpu_hours": 1920.0, "job_hours": 240.0,
        "jobs_ended": 10, "jobs_failed": 3, "failures": failures, "rf_per_1000_node_days": 200.0,
        "mttf_hours": 120.0, "median_window_rf": median, "mean_job_nodes": 1.0,
    }  # fmt: skip


def window(seconds: int, windows: int, median: float | None = 0.0) -> dict[str, Any]:
    return {
        "window_seconds": seconds, "windows": windows, "first": "2024-01-01 00:00:00",
        "last": "2024-01-15 00:00:00", "buckets": [bucket("1-7", median), bucket("all", median)],
        "series": {"bin_seconds": seconds, "points": []},
    }  # fmt: skip


def report(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "database": "faultstream",
        "time_span": {"first": "2024-01-01 00:00:00", "last": "2024-01-15 00:00:00"},
        "rows": {"xid_events": 9, "job_events": 20, "ecc_samples": 5, "incidents": 3, "dead_letters": 0},
        "incidents": [{"kind": "gpu_bus", "severity": "critical", "incidents": 2, "open": 1, "evidence": 2}],
        "incident_list": [
            {
                "incident_id": "a",
                "kind": "gpu_bus",
                "severity": "critical",
                "status": "open",
                "node": "node07",
                "gpu": "0000:b7:00",
                "first_evidence": "2024-01-12 11:22:13.438",
                "action": "RESTART_BM: drain and reboot the node",
                "summary": "...",
            },
            {
                "incident_id": "b",
                "kind": "gpu_bus",
                "severity": "critical",
                "status": "resolved",
                "node": "node07",
                "gpu": "0000:07:00",
                "first_evidence": "2024-01-02 00:00:00.000",
                "action": "RESTART_BM: drain and reboot the node",
                "summary": "...",
            },
        ],
        "attribution": [{"hardware": True, "jobs": 2, "gpu_hours": 100.0}],
        "mttf": [window(3600, 336), window(86400, 14)],
        "rf_per_1000_node_days": 14.67,
        "paper_rf_per_1000_node_days": {"RSC-1": 6.5, "RSC-2": 2.34},
        "ettr_guidance": [
            {
                "gpus": 8,
                "projected_mttf_hours": 1636.0,
                "optimal_checkpoint_minutes": 626.7,
                "expected_ettr": 0.994,
                "note": None,
            },
            {
                "gpus": 131072,
                "projected_mttf_hours": 0.1,
                "optimal_checkpoint_minutes": 4.9,
                "expected_ettr": 0.0,
                "note": "no progress: a failure every 6 min, a restart takes 10 min",
            },
        ],
        "ettr_assumptions": {"checkpoint_write_minutes": 2.0, "restart_overhead_minutes": 10.0},
        "dead_letter_reasons": [],
    }
    base.update(changes)
    return base


def test_one_mttf_table_fitting_the_span_and_the_others_named() -> None:
    text = render_text(report())
    assert text.count("MTTF by job size") == 1
    assert "1d windows: 14 from" in text and "(other lengths: --mttf-window 1h)" in text
    assert render_text(report(), "1h").count("1h windows: 336 from") == 1
    assert render_text(report(), "all").count("MTTF by job size") == 2


def test_a_short_span_gets_hourly_windows() -> None:
    short = [window(3600, 24), window(86400, 1)]
    assert [w["window_seconds"] for w in choose_mttf_windows(short)] == [3600]
    assert [w["window_seconds"] for w in choose_mttf_windows(short, "1d")] == [86400]
    with pytest.raises(ValueError, match="MTTF windows of 1h, 1d"):
        choose_mttf_windows(short, "2h")
    assert window_label(3600) == "1h"


def test_the_median_column_shows_only_when_most_windows_saw_a_failure() -> None:
    assert "median window r_f" not in render_text(report())  # 0.00 everywhere: noise
    busy = report(mttf=[window(86400, 14, median=12.5)])
    assert "median window r_f" in render_text(busy) and "12.50" in render_text(busy)


def test_an_ettr_row_that_cannot_progress_says_why() -> None:
    [row] = [line for line in render_text(report()).splitlines() if line.strip().startswith("131,072")]
    assert row.rstrip().endswith("0.000  no progress: a failure every 6 min, a restart takes 10 min")
    assert _ettr_note(0.0, 0.1, 4.9, 10.0) == "no progress: a failure every 6 min, a restart takes 10 min"
    assert _ettr_note(0.0, 0.25, 20.0, 10.0).startswith(
        "no progress: a failure every 15 min, each costs 20 min"
    )
    assert _ettr_note(0.3, 2.0, 20.0, 10.0) == "under half the time trains: a failure every 2.0 h"
    assert _ettr_note(0.9, 100.0, 60.0, 10.0) is None
    healthy = report(ettr_guidance=report()["ettr_guidance"][:1])
    assert " why" not in render_text(healthy)


def test_the_first_screen_says_health_what_broke_and_what_to_do() -> None:
    text = render_text(report())
    assert "Failure rate r_f = 14.67 per 1000 node-days, 2.3x the paper's worst cluster" in text
    assert "Critical incidents by node: node07 (2)" in text
    assert "critical gpu_bus on node07/0000:b7:00, open, since 2024-01-12 11:22" in text
    assert "    -> RESTART_BM: drain and reboot the node" in text
    assert len(text.splitlines()) < 50
    calm = report(incident_list=[], rf_per_1000_node_days=None, ettr_guidance=[])
    assert "Nothing to do: no critical or warn incident is open." in render_text(calm)
    assert "r_f and MTTF are not defined" in render_text(calm)
