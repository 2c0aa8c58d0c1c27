"""``faultstream evaluate --matrix``: run the scenario matrix and score each detector beside its
baseline rules.

For each cell of :mod:`stream.simulator.matrix` and each seed: simulate the cell into a folder,
replay it through the embedded pipeline into a chdb store of its own, and score the store
(:func:`stream.reports.evaluation.evaluate_store` with baselines). chdb allows one store per
process, so each replay and each scoring runs as a ``faultstream`` subprocess. The table pools the
cells' counts per detector and baseline (precision and recall over every fault and alert of the
cells, the median of the per-cell median leads) and lists each cell's figures.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stream.simulator import simulate
from stream.simulator.matrix import MatrixCell, cell_config

__all__ = ["matrix_chart", "pool_rows", "render_matrix", "run_cell", "run_matrix", "write_matrix_html"]


def _faultstream(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"faultstream {' '.join(args[:1])} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def run_cell(cell: MatrixCell, seed: int, work_dir: Path) -> dict[str, Any]:
    """Simulate, replay and score one cell with one seed; return the evaluation (JSON form)."""
    folder = work_dir / f"{cell.name}-s{seed}"
    sim = folder / "sim"
    simulate(cell_config(cell, seed), sim)
    store = f"chdb://{folder / 'store'}"
    files = [str(sim / name) for name in ("kernel.log", "sacct.txt", "dcgm.prom")]
    _faultstream("replay", *files, "--clickhouse", store, "--no-progress")
    result: dict[str, Any] = json.loads(
        _faultstream(
            "evaluate", "--truth", str(sim / "truth.json"), "--clickhouse", store, "--json", "--baselines"
        )
    )
    result["cell"] = cell.name
    result["family"] = cell.family
    result["seed"] = seed
    result["node_days"] = cell.nodes * cell.days
    return result


def run_matrix(
    cells: Sequence[MatrixCell],
    seeds: Sequence[int],
    work_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every cell with every seed (a :attr:`~MatrixCell.big` cell with the first seed only), in
    order; ``progress`` hears each cell's name as it starts."""
    results = []
    for cell in cells:
        for seed in seeds[:1] if cell.big else seeds:
            if progress is not None:
                progress(f"{cell.name} seed {seed}")
            results.append(run_cell(cell, seed, work_dir))
    return results


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def pool_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per detector and baseline over the cells that plant its kind (critical faults: every
    cell): pooled truth, detections, alerts and false alarms, the median of the cells' median
    leads and delays, and the false alarms per 1,000 node-days of those cells."""
    pooled: dict[tuple[str, str, str], dict[str, Any]] = {}
    for result in results:
        for row in result.get("comparison", ()):
            if row["kind"] != "critical_hw" and row["kind"] != result["family"]:
                continue
            key = (row["kind"], row["rule"], row["detector"])
            entry = pooled.setdefault(
                key,
                {
                    "kind": row["kind"],
                    "rule": row["rule"],
                    "detector": row["detector"],
                    "truth": 0,
                    "detected": 0,
                    "incidents": 0,
                    "false_positives": 0,
                    "node_days": 0.0,
                    "leads": [],
                    "delays": [],
                    "cells": set(),
                    "missed": [],
                },
            )
            entry["truth"] += row["truth"]
            entry["detected"] += row["detected"]
            entry["incidents"] += row["incidents"]
            entry["false_positives"] += row["false_positives"]
            entry["node_days"] += result["node_days"]
            entry["leads"].append(row["median_lead_time_hours"])
            entry["delays"].append(row["median_delay_hours"])
            entry["cells"].add(result["cell"])
            entry["missed"] += [f"{result['cell']}/s{result['seed']}/{m}" for m in row["missed"]]
    out = []
    for entry in pooled.values():
        incidents, fp, truth = entry["incidents"], entry["false_positives"], entry["truth"]
        out.append(
            {
                "kind": entry["kind"],
                "rule": entry["rule"],
                "detector": entry["detector"],
                "cells": len(entry["cells"]),
                "truth": truth,
                "detected": entry["detected"],
                "alerts": incidents,
                "false_positives": fp,
                "precision": (incidents - fp) / incidents if incidents else None,
                "recall": entry["detected"] / truth if truth else None,
                "median_lead_hours": _median(entry["leads"]),
                "median_delay_hours": _median(entry["delays"]),
                "false_alarms_per_1000_node_days": 1000.0 * fp / entry["node_days"]
                if entry["node_days"]
                else None,
                "missed": entry["missed"],
            }
        )
    return out


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def render_matrix(results: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> str:
    """The pooled table (Markdown), then each cell's detector rows, then the lemon figures."""
    lines = [
        f"Seeds {', '.join(map(str, seeds))}; {len({r['cell'] for r in results})} cells. Precision and "
        "recall pool every cell that plants the kind (critical faults: all cells); lead and delay are "
        "medians of the cells' medians; FA/1k nd = false alarms per 1,000 node-days.",
        "",
        "| kind | rule | detector | cells | truth | found | alerts | precision | recall | med lead h "
        "| med delay h | FA/1k nd |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in pool_rows(results):
        lines.append(
            f"| {row['kind']} | {row['rule']} | {row['detector']} | {row['cells']} | {row['truth']} "
            f"| {row['detected']} | {row['alerts']} | {_fmt(row['precision'])} | {_fmt(row['recall'])} "
            f"| {_fmt(row['median_lead_hours'], '{:.1f}')} | {_fmt(row['median_delay_hours'], '{:.2f}')} "
            f"| {_fmt(row['false_alarms_per_1000_node_days'])} |"
        )
    lines += [
        "",
        "| cell | seed | detector | truth | found | alerts | FP | med lead h | lemon healthy flagged |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for row in result.get("comparison", ()):
            if row["rule"] != "detector" or row["kind"] != result["family"]:
                continue
            share = result["lemon_nodes"]["healthy_flagged_share"]
            lemon = _fmt(share, "{:.2%}") if row["kind"] == "lemon_node" else ""
            lines.append(
                f"| {result['cell']} | {result['seed']} | {row['detector']} | {row['truth']} "
                f"| {row['detected']} | {row['incidents']} | {row['false_positives']} "
                f"| {_fmt(row['median_lead_time_hours'], '{:.1f}')} | {lemon} |"
            )
    return "\n".join(lines)


def matrix_chart(results: Sequence[Mapping[str, Any]]) -> str:
    """Precision and recall of each detector and its baselines, pooled over the cells, as grouped
    horizontal bars (an SVG ``<figure>`` built with the HTML report's helpers)."""
    from stream.reports.html.svg import Frame, chart_figure, legend, svg_rect, svg_root, svg_text

    rows = sorted(pool_rows(results), key=lambda r: (r["kind"], r["rule"] != "detector", r["detector"]))
    row_height, bar = 34, 12
    frame = Frame(40 + row_height * max(len(rows), 1), left=330, right=60, bottom=20)
    body: list[str] = []
    colours = {"precision": "#4c78a8", "recall": "#f58518"}
    for index, row in enumerate(rows):
        y = frame.y1 + index * row_height
        label = f"{row['kind']}: {row['detector']}"
        body.append(
            svg_text("label", frame.x0 - 6, y + 16, label if len(label) <= 52 else label[:51] + "…", "end")
        )
        for offset, measure in enumerate(("precision", "recall")):
            value = row[measure]
            width = frame.plot_width * (value or 0.0)
            tip = f"{label} {measure} {'-' if value is None else f'{value:.2f}'}"
            body.append(
                svg_rect(f"mark {measure}", frame.x0, y + offset * bar, width, bar - 2, colours[measure], tip)
            )
            text = "-" if value is None else f"{value:.2f}"
            body.append(svg_text("value", frame.x0 + width + 4, y + offset * bar + 10, text))
    title = "Detectors beside baseline rules: precision and recall over the matrix"
    keys = legend([(colour, name, "bar") for name, colour in colours.items()])
    return chart_figure("matrix-precision-recall", title, svg_root(frame, title, body), keys)


def write_matrix_html(results: Sequence[Mapping[str, Any]], seeds: Sequence[int], path: Path) -> None:
    """A standalone page: the chart of :func:`matrix_chart` and the table of :func:`render_matrix`."""
    from stream.reports.html.markup import escape

    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>faultstream: scenario matrix'
        "</title><style>body{font-family:sans-serif;margin:2em}pre{font-size:12px}"
        ".label,.value{font-size:12px}</style></head><body><h1>Scenario matrix</h1>"
        f"{matrix_chart(results)}<pre>{escape(render_matrix(results, seeds))}</pre></body></html>\n"
    )
    path.write_text(page, encoding="utf-8")
