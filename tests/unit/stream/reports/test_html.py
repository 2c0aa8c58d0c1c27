"""The HTML report's rendering, from plain report data (no store, no browser: tests/e2e has those)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from stream.reports.html import render_html, write_html
from stream.reports.text import PAPER_RF
from stream.sinks.store import redact_dsn

HOSTILE = '<script>alert("x")</script>&'


def empty_report() -> dict[str, Any]:
    """What build_report returns for a store with tables and no rows."""
    return {
        "database": "faultstream",
        "store": "chdb:///tmp/store",
        "generated": "2024-02-01 00:00:00",
        "time_span": {"first": None, "last": None},
        "rows": dict.fromkeys(
            ("xid_events", "job_events", "ecc_samples", "incidents", "job_attributions", "dead_letters"), 0
        ),
        "incidents": [],
        "open_critical": [],
        "incident_list": [],
        "incidents_over_time": {"bin_seconds": None, "bins": []},
        "lemon_nodes": [],
        "xid_mix": [],
        "dead_letter_reasons": [],
        "attribution": [],
        "mttf": [],
        "rf_per_1000_node_days": None,
        "paper_rf_per_1000_node_days": PAPER_RF,
        "ettr_guidance": [],
        "ettr_assumptions": {"checkpoint_write_minutes": 2.0, "restart_overhead_minutes": 10.0},
    }


def bucket(name: str, min_gpus: int, node_hours: float, job_hours: float, failures: int) -> dict[str, Any]:
    return {
        "size_bucket": name,
        "min_gpus": min_gpus,
        "node_hours": node_hours,
        "gpu_hours": node_hours * 8,
        "job_hours": job_hours,
        "jobs_ended": 10,
        "jobs_failed": failures + 1,
        "failures": failures,
        "rf_per_1000_node_days": 1000 * failures / (node_hours / 24),
        "mttf_hours": job_hours / failures if failures else None,
        "median_window_rf": 0.0,
        "mean_job_nodes": node_hours / job_hours,
    }


def full_report(text: str = "x") -> dict[str, Any]:
    """A small report with every section filled; ``text`` goes into every free-text field."""
    report = empty_report()
    report["store"] = f"chdb:///tmp/{text}"
    report["time_span"] = {"first": "2024-01-01 00:00:00", "last": "2024-01-03 00:00:00"}
    report["rows"].update(xid_events=5, job_events=9, incidents=2, dead_letters=1)
    report["incidents"] = [
        {"kind": text, "severity": "critical", "incidents": 1, "open": 1, "evidence": 3},
        {"kind": "lemon_node", "severity": "warn", "incidents": 1, "open": 0, "evidence": 2},
    ]
    incident = {
        "incident_id": "inc-1", "kind": text, "severity": "critical", "status": "open", "cluster": text,
        "node": text, "gpu": text, "first_evidence": "2024-01-01 10:00:00.123000",
        "last_evidence": "2024-01-01 11:00:00", "detector": text, "score": 1.0, "evidence_count": 3,
        "action": f"drain {text}", "summary": f"[critical] {text} on node. Action: drain {text}",
    }  # fmt: skip
    report["incident_list"] = [incident, {**incident, "incident_id": "inc-2", "status": "resolved"}]
    report["incidents_over_time"] = {
        "bin_seconds": 3600,
        "bins": [
            {"start": "2024-01-01 10:00:00", "critical": 1, "warn": 0, "info": 0},
            {"start": "2024-01-01 11:00:00", "critical": 0, "warn": 1, "info": 2},
        ],
    }
    report["lemon_nodes"] = [
        {
            "incident_id": "inc-3", "cluster": text, "node": text, "status": "updated",
            "first_evidence": "2024-01-02 00:00:00", "last_evidence": "2024-01-03 00:00:00", "score": 9.5,
            "action": text, "verdicts": 2, "signals": {text: 3, "xid_days": 4}, "signals_at": "x",
            "jobs_hurt": ["1", "2"],
        }
    ]  # fmt: skip
    report["xid_mix"] = [
        {"xid": 79, "name": text, "category": text, "severity": "critical", "hardware": True, "events": 3,
         "nodes": 1},
        {"xid": 31, "name": "GPU memory page fault", "category": "application", "severity": "info",
         "hardware": False, "events": 2, "nodes": 2},
    ]  # fmt: skip
    report["dead_letter_reasons"] = [{"reason_class": text, "n": 1}]
    report["attribution"] = [{"hardware": True, "jobs": 1, "gpu_hours": 10.0}]
    buckets = [bucket("1-7", 1, 48.0, 48.0, 1), bucket("64-511", 64, 480.0, 40.0, 0)]
    buckets.append(bucket("all", 0, 528.0, 88.0, 1))
    points = [
        {"start": f"2024-01-0{day} 00:00:00", "size_bucket": b["size_bucket"], "node_hours": b["node_hours"] / 2,
         "failures": b["failures"] if day == 2 else 0}
        for day in (1, 2) for b in buckets
    ]  # fmt: skip
    report["mttf"] = [
        {
            "window_seconds": 86400, "windows": 2, "first": "2024-01-01 00:00:00", "last": "2024-01-03 00:00:00",
            "buckets": buckets, "series": {"bin_seconds": 86400, "points": points},
        }
    ]  # fmt: skip
    report["rf_per_1000_node_days"] = buckets[-1]["rf_per_1000_node_days"]
    report["ettr_guidance"] = [
        {
            "gpus": 8,
            "projected_mttf_hours": 500.0,
            "optimal_checkpoint_minutes": 100.0,
            "expected_ettr": 0.99,
        },
        {
            "gpus": 131072,
            "projected_mttf_hours": 0.1,
            "optimal_checkpoint_minutes": 4.0,
            "expected_ettr": -0.2,
        },
    ]
    report["fleet"] = {
        "window": "week", "inventory": True, "nodes": 100, "note": "inventory of 100 nodes",
        "windows": [
            {"start": f"2024-01-{day:02d}T00:00:00Z", "end": "", "nodes": 100, "node_days": 700.0,
             "hardware_failures": failures, "failures_per_1000_node_days": 1000 * failures / 700 if failures else 0.0,
             "mtbf_hours": 168 / failures if failures else None}
            for day, failures in ((1, 2), (8, 0), (15, 5))
        ],
    }  # fmt: skip
    return report


def charts(page: str) -> dict[str, str]:
    """Each chart's figure, by name."""
    return dict(re.findall(r'<figure class="chart[^"]*" data-chart="([^"]+)">(.*?)</figure>', page, re.S))


def test_every_chart_draws_marks_from_a_full_report() -> None:
    figures = charts(render_html(full_report()))
    assert set(figures) == {
        "incidents-over-time", "xid-mix", "rf-by-size", "mttf-by-size", "rf-over-time-86400", "ettr", "fleet-mtbf",
    }  # fmt: skip
    for name, figure in figures.items():
        assert "<svg" in figure and 'class="mark' in figure, name
    # stacked severities: one rect per non-zero (bin, severity)
    assert figures["incidents-over-time"].count('<rect class="mark') == 3
    assert figures["xid-mix"].count('<rect class="mark') == 2
    assert figures["fleet-mtbf"].count('<rect class="mark') == 2  # a week without failure has no bar
    # a bucket without failures has no MTTF bar; the paper's rates are lines with a point per bucket
    assert "no failure" in figures["mttf-by-size"]
    assert figures["mttf-by-size"].count('<circle class="mark ref-point"') == 2 * 3
    assert figures["rf-by-size"].count('<line class="ref"') == 2
    # a negative expected ETTR (the job never finishes) is drawn as 0
    assert "0.000" in figures["ettr"]


def test_an_empty_store_renders_every_section_without_charts() -> None:
    page = render_html(empty_report())
    assert "<svg" not in page
    for section in ("summary", "incidents", "mttf", "ettr", "lemons", "xids"):
        assert f'<section id="{section}">' in page
    assert "No incidents in the store." in page and "not defined" in page
    assert not re.search(r"\b(None|nan)\b", re.sub(r"<[^>]+>", " ", page))


def test_text_from_the_store_is_escaped_everywhere() -> None:
    page = render_html(full_report(HOSTILE))
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;") >= 10
    assert 'alert("x")' not in page  # quotes are escaped too: no attribute can be broken out of


def test_the_action_is_not_repeated_in_the_summary_line() -> None:
    page = render_html(full_report())
    assert "[critical] x on node." in page and "on node. Action:" not in page


def test_the_report_data_is_not_changed_by_rendering() -> None:
    report = full_report()
    before = copy.deepcopy(report)
    render_html(report)
    assert report == before


def test_write_html_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    size = write_html(full_report(), target)
    assert target.stat().st_size == size and target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    with pytest.raises(ValueError, match="does not exist"):
        write_html(full_report(), tmp_path / "missing" / "report.html")
    with pytest.raises(ValueError, match="is a folder"):
        write_html(full_report(), tmp_path)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("chdb:///data/store", "chdb:///data/store"),
        ("http://default:secret@clickhouse:8123", "http://default:***@clickhouse:8123"),
        ("https://ch.example:8443", "https://ch.example:8443"),
    ],
)
def test_the_store_is_named_without_its_password(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
