"""docs/performance.md and README's summary show what ``benchmarks/results/*.json`` hold: rendered by
``scripts/render_performance.py``, never edited by hand between the markers."""

from __future__ import annotations

import doctest
import importlib.util
import json
import re
from datetime import date
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


def renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "render_performance", ROOT / "scripts" / "render_performance.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("document", ["docs/performance.md", "README.md"])
def test_the_document_is_up_to_date_with_the_results(document: str) -> None:
    render = renderer()
    path = ROOT / document
    text = path.read_text()
    assert text == render.render(text, render.load(), render.link_from(path)), (
        f"{document} is out of date with benchmarks/results: run python scripts/render_performance.py"
    )


def test_every_result_file_is_shown_on_the_performance_page() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    shown = {name for names in re.findall(r"<!-- results:([\w,-]+) -->", page) for name in names.split(",")}
    assert {path.stem for path in RESULTS} <= shown
    assert "summary" in shown
    # The front page shows the targets marked as headline: at least one.
    assert "<!-- results:headline -->" in (ROOT / "README.md").read_text()
    headline = [
        target
        for path in RESULTS
        for result in json.loads(path.read_text())["results"]
        for target in result.get("targets", [])
        if target.get("headline")
    ]
    assert headline, "no headline target: the front page's performance table would be empty"


@pytest.mark.parametrize("path", RESULTS, ids=[path.stem for path in RESULTS])
def test_a_result_says_when_where_how_and_what(path: Path) -> None:
    bench = json.loads(path.read_text())
    assert bench["benchmark"] == path.stem
    assert (ROOT / bench["script"]).is_file(), f"{bench['script']} does not exist"
    assert bench["heading"] and bench["what"] and bench["results"]
    for result in bench["results"]:
        date.fromisoformat(result["date"])
        assert result["machine"] and result["title"]
        assert bench["script"] in result["command"], "the command runs the benchmark's script"
        for spec in result["tables"]:
            assert all(len(row) == len(spec["columns"]) for row in spec["rows"]), "a row per column"
        for target in result.get("targets", []):
            assert {"figure", "target", "measured"} <= target.keys()
            assert isinstance(target["met"], bool)


def test_a_changed_figure_shows_as_out_of_date() -> None:
    render = renderer()
    results = render.load()
    page = (ROOT / "docs" / "performance.md").read_text()
    results["latency"]["results"][0]["tables"][0]["rows"][0][9] += 1  # the p99 at 5,000 records/s
    assert render.render(page, results, "") != page


def test_the_renderers_examples() -> None:
    assert doctest.testmod(renderer()).failed == 0
