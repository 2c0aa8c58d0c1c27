"""`faultstream report --html` opened in headless Chromium: the page loads cleanly and its charts draw.

The store is the session's replay of examples/sim-48x14 (`embedded_store`). One `report --json
--html` run writes the page and prints the data it was drawn from, so the page is checked against
that data. The browser is Debian's chromium package driven by Playwright (tests/services/browser.py);
without it the test fails and says what to install.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services.browser import BrowserMissing, open_page, png_size
from tests.services.worker import cli

pytestmark = pytest.mark.e2e

#: Every chart the example store has data for, by its data-chart name.
CHARTS = (
    "incidents-over-time",
    "xid-mix",
    "rf-by-size",
    "mttf-by-size",
    "rf-over-time-3600",
    "rf-over-time-86400",
    "ettr",
)

# For each chart: its <svg>, how many data marks (class "mark": rect, path, circle) it holds, how
# many of them the browser actually laid out with a non-empty box, and the svg's own box.
_CHART_STATS = """
(figure) => {
  const svg = figure.querySelector('svg');
  if (!svg) return null;
  const marks = [...svg.querySelectorAll('.mark')];
  const drawn = marks.filter((m) => { const b = m.getBoundingClientRect(); return b.width > 0 || b.height > 0; });
  const box = svg.getBoundingClientRect();
  return {
    marks: marks.length,
    drawn: drawn.length,
    tags: [...new Set(marks.map((m) => m.tagName))].sort(),
    width: box.width,
    height: box.height,
    refs: svg.querySelectorAll('line.ref, path.ref-line').length,
  };
}
"""


@pytest.fixture(scope="module")
def report_page(embedded_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The HTML report of the example store and the report data it was drawn from."""
    html = tmp_path_factory.mktemp("report") / "report.html"
    out = cli(
        {},
        "report",
        "--html",
        str(html),
        "--json",
        "--clickhouse",
        f"chdb://{embedded_store}",
        "--no-progress",
    )
    return html, json.loads(out)


def test_the_html_file_is_self_contained(report_page) -> None:
    html, report = report_page
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "<script" not in text.lower() and "@import" not in text and "url(http" not in text
    # only in-page links (#section) and the SVG namespace: nothing to fetch
    assert re.findall(r'\b(?:src|href)="(?!#)[^"]*"', text) == []
    assert "Content-Security-Policy" in text
    assert report["rows"]["incidents"] > 0 and report["incident_list"]


def test_report_renders_in_chromium(report_page, tmp_path: Path) -> None:
    html, report = report_page
    try:
        with open_page(html) as (page, problems):
            charts = {
                name: page.locator(f'figure.chart[data-chart="{name}"]').evaluate(_CHART_STATS)
                for name in CHARTS
            }
            incident_rows = page.locator("table.incidents tbody tr").all_inner_texts()
            lemon_rows = page.locator("#lemons tbody tr").all_inner_texts()
            xid_bars = page.locator('figure[data-chart="xid-mix"] rect.mark').count()
            body_text = page.locator("body").inner_text()
            png = tmp_path / "report.png"
            page.screenshot(path=str(png), full_page=True)
    except BrowserMissing as exc:
        pytest.fail(str(exc), pytrace=False)

    assert problems.all() == [], "\n".join(problems.all())
    outside = [url for url in problems.requests if url != html.resolve().as_uri()]
    assert outside == [], f"the page fetched something besides itself: {outside}"

    for name, stats in charts.items():
        assert stats is not None, f"chart {name}: no <svg> (the page says it has no data)"
        assert stats["width"] > 100 and stats["height"] > 100, f"chart {name}: svg box {stats}"
        assert stats["marks"] > 0 and stats["drawn"] > 0, f"chart {name}: no drawn marks {stats}"
    # the paper's RSC-1 / RSC-2 rates are drawn as reference lines where the brief asks for them
    for name in ("rf-by-size", "rf-over-time-3600", "rf-over-time-86400", "mttf-by-size"):
        assert charts[name]["refs"] == 2, f"chart {name}: {charts[name]}"
    assert xid_bars == len(report["xid_mix"]) <= 16  # one bar per XID code of the store

    assert len(incident_rows) == min(report["rows"]["incidents"], 200) > 0
    # open incidents first, and each row shows its suggested action
    listed = report["incident_list"]
    opened = [row["status"] != "resolved" for row in listed]
    assert opened == sorted(opened, reverse=True)
    for row, text in zip(listed, incident_rows, strict=True):
        assert row["action"] in text and row["kind"] in text
    assert len(lemon_rows) == len(report["lemon_nodes"]) > 0
    assert report["lemon_nodes"][0]["node"] in lemon_rows[0]
    for word in ("None", "nan", "undefined", "Traceback"):
        assert not re.search(rf"\b{word}\b", body_text), f"{word!r} in the page text"

    width, height = png_size(png)
    assert width == 1280 and height > 2000, (width, height)
    assert png.stat().st_size > 100_000, "the screenshot is nearly empty"


def test_an_unwritable_html_path_is_a_clear_error_before_any_query(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "report.html"
    store = tmp_path / "store"
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", "report", "--html", str(missing), "--clickhouse", f"chdb://{store}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"folder {missing.parent} does not exist" in result.stderr and "Traceback" not in result.stderr
    assert not missing.parent.exists() and not store.exists()
