"""Render the benchmark results in ``benchmarks/results/*.json`` into docs/performance.md and README.md.

Each JSON file holds one benchmark's current results: the script, what it measures, and per result
the date, the machine, the command, its tables and the targets it is held to. The documents keep
their prose; the figures go between markers, so a new measurement is a change of its JSON file and
one run of this script:

    <!-- results:summary -->            every target of every result: figure, target, measured, met
    <!-- results:headline -->           the same, of the targets marked ``"headline": true`` (README)
    <!-- results:NAME[,NAME...] -->     benchmark NAME: its heading, each result's command, machine,
                                        tables, notes (several benchmarks one after the other)
    <!-- /results -->                   the end of either

    python scripts/render_performance.py            # rewrite the marked parts of both documents
    python scripts/render_performance.py --check    # exit 1 if either is out of date with the JSON

``tests/unit/test_performance_doc.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = (ROOT / "docs" / "performance.md", ROOT / "README.md")
#: The order of the summary's rows (the product's path first); benchmarks not named come last, by name.
ORDER = (
    "worker_throughput",
    "replay_throughput",
    "decode",
    "latency",
    "storm_cost",
    "state_size",
    "backlog",
    "kernel_log_worker",
    "shipped_latency",
    "receive_throughput",
    "agent_footprint",
    "compiled_core",
)
MARKED = re.compile(r"(<!-- results:(?P<names>[\w,-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


def load(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every benchmark's results, by benchmark name, in the summary's order."""
    loaded = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    rank = {name: index for index, name in enumerate(ORDER)}
    return dict(sorted(loaded.items(), key=lambda item: (rank.get(item[0], len(ORDER)), item[0])))


def cell(value: Any, fmt: str | None = None) -> str:
    """One table cell: ``None`` is n/a, numbers as the column's format says (integers with
    thousands separators by default), text as it is.

    >>> [cell(None), cell(1257508), cell(0.0868), cell(0.5, ".2f"), cell("1 x 1")]
    ['n/a', '1,257,508', '0.0868', '0.50', '1 x 1']
    """
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if fmt is not None:
        return format(value, fmt)
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(spec: dict[str, Any]) -> list[str]:
    """A Markdown table: the first column left-aligned, numeric columns right-aligned."""
    columns = spec["columns"]
    numeric = [any(isinstance(row[i], int | float) for row in spec["rows"]) for i in range(len(columns))]
    lines = [
        "| " + " | ".join(column["name"] for column in columns) + " |",
        "|" + "|".join("---:" if number else "---" for number in numeric) + "|",
    ]
    for row in spec["rows"]:
        cells = [cell(value, column.get("format")) for value, column in zip(row, columns, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(benchmarks: dict[str, dict[str, Any]], link: str, headline: bool = False) -> list[str]:
    """One row a target: what is measured, the target, the current figure, and whether it is met
    (``headline``: only the targets marked so, for the front page)."""
    lines = ["| figure | target | measured | met | benchmark |", "|---|---|---|---|---|"]
    for bench in benchmarks.values():
        for result in bench["results"]:
            for target in result.get("targets", []):
                if headline and not target.get("headline"):
                    continue
                met = "yes" if target["met"] else "**no**"
                where = f"[`{Path(bench['script']).name}`]({link}#{anchor(bench['heading'])})"
                row = [target["figure"], target["target"], target["measured"], met, where]
                lines.append("| " + " | ".join(row) + " |")
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading (as tests/unit/test_docs_links.py computes it).

    >>> anchor("Storms: what a record costs as a storm grows")
    'storms-what-a-record-costs-as-a-storm-grows'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section(bench: dict[str, Any]) -> list[str]:
    """A benchmark's heading, what it measures (its script), then each result's command, tables
    and notes."""
    lines = [f"## {bench['heading']}", "", f"{bench['what']} (`{bench['script']}`)"]
    for result in bench["results"]:
        records = f"; records a run: {result['records']}" if "records" in result else ""
        label = f"{result['label']}, " if "label" in result else ""
        where = f"({result['date']}, {result['machine']}{records})"
        lines += [f"**{label}{result['title']}**: `{result['command']}` {where}", ""]
        if not bench.get("side_by_side"):
            for spec in result["tables"]:
                lines += [*table(spec), ""]
            lines += notes(result)
    if bench.get("side_by_side"):
        lines += [*table(side_by_side(bench["results"])), ""]
    return lines + notes(bench)


def side_by_side(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The first table of each result in one, its columns named by the result's ``label``; the
    results' rows must have the same first cells."""
    first = [row[0] for row in results[0]["tables"][0]["rows"]]
    columns = [results[0]["tables"][0]["columns"][0]]
    for result in results:
        spec = result["tables"][0]
        if [row[0] for row in spec["rows"]] != first:
            raise SystemExit(f"{result['title']}: its rows are not the first result's, side by side")
        named = [{**column, "name": f"{result['label']}: {column['name']}"} for column in spec["columns"][1:]]
        columns += named
    rows = [
        [label, *(value for result in results for value in result["tables"][0]["rows"][index][1:])]
        for index, label in enumerate(first)
    ]
    return {"columns": columns, "rows": rows}


def notes(holder: dict[str, Any]) -> list[str]:
    return [*(f"- {note}" for note in holder.get("notes", [])), ""] if holder.get("notes") else []


def render(text: str, benchmarks: dict[str, dict[str, Any]], link: str) -> str:
    """``text`` with every marked part rendered afresh from ``benchmarks``; ``link`` is the path
    from the document to docs/performance.md ("" for itself)."""

    def body(match: re.Match[str]) -> str:
        lines: list[str] = []
        for name in match["names"].split(","):
            if name in ("summary", "headline"):
                lines += summary(benchmarks, link, headline=name == "headline")
            elif name in benchmarks:
                lines += [*section(benchmarks[name]), ""]
                while lines[-2:] == ["", ""]:
                    lines.pop()
            else:
                raise SystemExit(f"no benchmarks/results/{name}.json for the marker {match[1].strip()}")
        return match[1] + "\n".join(lines).rstrip("\n") + "\n" + match[4]

    return MARKED.sub(body, text)


def link_from(document: Path) -> str:
    return "" if document.name == "performance.md" else "docs/performance.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document is out of date")
    args = parser.parse_args()
    benchmarks = load()
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        rendered = render(text, benchmarks, link_from(document))
        if rendered != text:
            stale.append(document.relative_to(ROOT))
            if not args.check:
                document.write_text(rendered)
    if args.check and stale:
        names = ", ".join(map(str, stale))
        print(f"out of date with benchmarks/results: {names} (python scripts/render_performance.py)")
        return 1
    for name in stale:
        print(f"rendered {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
