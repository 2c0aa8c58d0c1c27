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

__all__ = [
    "matrix_chart",
    "pool_job_aware",
    "pool_rows",
    "render_matrix",
    "run_cell",
    "run_matrix",
    "write_matrix_html",
]


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
    result["kinds"] = list(cell.kinds)
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


def _kinds(result: Mapping[str, Any]) -> list[str]:
    """The truth kinds a cell's pooled rows count: critical faults (every cell) and the cell's own."""
    return ["critical_hw", *result.get("kinds", [result["family"]])]


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else None


def pool_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per detector and baseline over the cells that plant its kind (critical faults: every
    cell): pooled truth, detections, alerts and false alarms, the median of the cells' median
    leads and delays, the p95 and largest delay of every detected fault, and the false alarms per
    1,000 node-days of those cells. A baseline tried at several thresholds (``sweep``) also gets
    its precision at the detector's pooled recall: the best precision of a threshold whose pooled
    recall reaches the detector's (``None`` when none does), and that threshold."""
    pooled: dict[tuple[str, str, str], dict[str, Any]] = {}
    for result in results:
        for row in result.get("comparison", ()):
            if row["kind"] not in _kinds(result):
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
                    "all_delays": [],
                    "cells": set(),
                    "missed": [],
                    "sweep": {},
                },
            )
            entry["truth"] += row["truth"]
            entry["detected"] += row["detected"]
            entry["incidents"] += row["incidents"]
            entry["false_positives"] += row["false_positives"]
            entry["node_days"] += result["node_days"]
            entry["leads"].append(row["median_lead_time_hours"])
            entry["delays"].append(row["median_delay_hours"])
            entry["all_delays"] += row.get("delays_hours", ())
            entry["cells"].add(result["cell"])
            entry["missed"] += [f"{result['cell']}/s{result['seed']}/{m}" for m in row["missed"]]
            for tried in row.get("sweep", ()):
                counts = entry["sweep"].setdefault(tried["threshold"], [0, 0, 0, 0, [], []])
                for index, name in enumerate(("truth", "detected", "incidents", "false_positives")):
                    counts[index] += tried[name]
                counts[4].append(tried.get("median_delay_hours"))
                counts[5].append(tried.get("median_lead_time_hours"))
    out = []
    for entry in pooled.values():
        incidents, fp, truth = entry["incidents"], entry["false_positives"], entry["truth"]
        delays = sorted(entry["all_delays"])
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
                "p95_delay_hours": _quantile(delays, 0.95),
                "max_delay_hours": delays[-1] if delays else None,
                "false_alarms_per_1000_node_days": 1000.0 * fp / entry["node_days"]
                if entry["node_days"]
                else None,
                "missed": entry["missed"],
                "sweep": [
                    {
                        "threshold": k,
                        "truth": c[0],
                        "detected": c[1],
                        "incidents": c[2],
                        "false_positives": c[3],
                        "median_delay_hours": _median(c[4]),
                        "median_lead_hours": _median(c[5]),
                    }
                    for k, c in sorted(entry["sweep"].items())
                ],
            }
        )
    detectors = {row["kind"]: row for row in out if row["rule"] == "detector"}
    for row in out:
        rival = detectors.get(row["kind"])
        row["precision_at_detector_recall"] = row["threshold_at_detector_recall"] = None
        row["at_detector_recall"] = None
        if not row["sweep"] or rival is None or rival["recall"] is None:
            continue
        reaching = [
            ((t["incidents"] - t["false_positives"]) / t["incidents"], t["detected"], -t["threshold"], t)
            for t in row["sweep"]
            if t["truth"] and t["incidents"] and t["detected"] / t["truth"] >= rival["recall"] - 1e-9
        ]
        if reaching:
            # The best precision; among equals, the most found, then the lowest threshold (earliest).
            precision, _, _, best = max(reaching, key=lambda item: item[:3])
            row["precision_at_detector_recall"] = precision
            row["threshold_at_detector_recall"] = best["threshold"]
            row["at_detector_recall"] = best
    return out


def pool_job_aware(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job-aware figures pooled over every cell: false lemon verdicts (per 1,000 node-days of all
    the cells, and on nodes of crash-looping users), node storm verdicts on jobs' storms, and the
    incidents routed to their owners; and the healthy nodes the lemon cells flagged."""
    keys = (
        "false_lemon_verdicts",
        "false_lemon_verdicts_on_crash_loop_nodes",
        "false_lemon_verdicts_on_pinned_nodes",
        "pinned_nodes",
        "crash_loop_users",
        "crash_loop_users_told",
        "app_incidents",
        "app_incidents_to_owners",
        "job_storms",
        "job_storms_to_owners",
        "node_storm_verdicts_on_job_storms",
    )
    total: dict[str, Any] = dict.fromkeys(keys, 0)
    total["node_days"] = 0.0
    healthy = flagged = 0
    for result in results:
        aware = result.get("job_aware") or {}
        for key in keys:
            total[key] += aware.get(key, 0)
        total["node_days"] += aware.get("node_days", result["node_days"])
        if result["family"] == "lemon_node":
            healthy += result["lemon_nodes"].get("healthy", 0)
            flagged += result["lemon_nodes"].get("healthy_flagged", 0)
    node_days = total["node_days"]
    total["false_lemon_verdicts_per_1000_node_days"] = (
        1000.0 * total["false_lemon_verdicts"] / node_days if node_days else None
    )
    total["lemon_cells_healthy_nodes"] = healthy
    total["lemon_cells_healthy_flagged"] = flagged
    total["lemon_cells_healthy_flagged_share"] = flagged / healthy if healthy else None
    return total


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def _at_recall(row: Mapping[str, Any]) -> str:
    """The baseline at its best threshold for the detector's recall: precision (threshold, and its
    median lead or delay)."""
    if not row.get("sweep"):
        return ""
    best = row.get("at_detector_recall")
    if best is None:
        return "never"
    timing = ""
    if best.get("median_lead_hours") is not None:
        timing = f", lead {best['median_lead_hours']:.1f} h"
    elif best.get("median_delay_hours") is not None:
        timing = f", delay {best['median_delay_hours']:.2f} h"
    return f"{row['precision_at_detector_recall']:.2f} (>= {best['threshold']}{timing})"


def _lemons_scored(result: Mapping[str, Any]) -> str:
    """The lemon detector's found of scored lemons in a cell, and the censored ones."""
    row = next(
        (r for r in result.get("comparison", ()) if r["kind"] == "lemon_node" and r["rule"] == "detector"),
        None,
    )
    if row is None:
        return "-"
    censored = f" ({len(row['censored'])} censored)" if row.get("censored") else ""
    return f"{row['detected']} of {row['truth']}{censored}"


def render_matrix(results: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> str:
    """The pooled table (Markdown), the critical, lemon and job-aware figures, then each cell's
    detector rows and job-aware figures."""
    rows = pool_rows(results)
    lines = [
        f"Seeds {', '.join(map(str, seeds))}; {len({r['cell'] for r in results})} cells. Precision and "
        "recall pool every cell that plants the kind (critical faults: all cells); lead and delay are "
        "medians of the cells' medians; FA/1k nd = false alarms per 1,000 node-days; P at det. R = the "
        "baseline rule's best precision at a threshold whose pooled recall reaches the detector's "
        "(that threshold, and the rule's median lead or delay there; never: no threshold tried does).",
        "",
        "| kind | rule | detector | cells | truth | found | alerts | precision | recall | P at det. R "
        "| med lead h | med delay h | FA/1k nd |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['kind']} | {row['rule']} | {row['detector']} | {row['cells']} | {row['truth']} "
            f"| {row['detected']} | {row['alerts']} | {_fmt(row['precision'])} | {_fmt(row['recall'])} "
            f"| {_at_recall(row)} | {_fmt(row['median_lead_hours'], '{:.1f}')} "
            f"| {_fmt(row['median_delay_hours'], '{:.2f}')} "
            f"| {_fmt(row['false_alarms_per_1000_node_days'])} |"
        )
    critical = next((r for r in rows if r["kind"] == "critical_hw" and r["rule"] == "detector"), None)
    aware = pool_job_aware(results)
    lines.append("")
    if critical is not None:
        lines.append(
            f"Critical hardware faults: {critical['detected']} of {critical['truth']} found; detection delay "
            f"p95 {_fmt(critical['p95_delay_hours'])} h, max {_fmt(critical['max_delay_hours'])} h "
            "(0: at the first evidence line)."
        )
    share = aware["lemon_cells_healthy_flagged_share"]
    lines.append(
        f"Lemon cells: healthy nodes flagged {aware['lemon_cells_healthy_flagged']} of "
        f"{aware['lemon_cells_healthy_nodes']} ({_fmt(share, '{:.2%}')}), pooled."
    )
    per_1000 = _fmt(aware["false_lemon_verdicts_per_1000_node_days"], "{:.3f}")
    a = aware
    lines.append(
        f"Job-aware (all cells, {a['node_days']:,.0f} node-days): false lemon verdicts "
        f"{a['false_lemon_verdicts']} ({per_1000} per 1,000 node-days; "
        f"{a['false_lemon_verdicts_on_crash_loop_nodes']} on nodes where crash-looping users' jobs "
        f"failed, {a['false_lemon_verdicts_on_pinned_nodes']} on the {a['pinned_nodes']} nodes a "
        f"crash-looping user is pinned to); app-class incidents routed to their owners "
        f"{a['app_incidents_to_owners']} of {a['app_incidents']} (crash-looping users told "
        f"{a['crash_loop_users_told']} of {a['crash_loop_users']}; job storms told to their owners "
        f"{a['job_storms_to_owners']} of {a['job_storms']}); node storm verdicts on jobs' storms "
        f"{a['node_storm_verdicts_on_job_storms']}."
    )
    lines += [
        "",
        "| cell | seed | detector | truth | found | alerts | FP | med lead h | lemon healthy flagged |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for row in result.get("comparison", ()):
            if row["rule"] != "detector" or row["kind"] not in result.get("kinds", [result["family"]]):
                continue
            share = result["lemon_nodes"]["healthy_flagged_share"]
            lemon = _fmt(share, "{:.2%}") if row["kind"] == "lemon_node" else ""
            lines.append(
                f"| {result['cell']} | {result['seed']} | {row['detector']} | {row['truth']} "
                f"| {row['detected']} | {row['incidents']} | {row['false_positives']} "
                f"| {_fmt(row['median_lead_time_hours'], '{:.1f}')} | {lemon} |"
            )
    aware_cells = [r for r in results if (r.get("job_aware") or {}).get("crash_loop_users")]
    if aware_cells:
        lines += [
            "",
            "| cell | seed | false lemons | on crash-loop nodes | on pinned nodes | crash-looping users told "
            "| owner incidents to the right owner | lemons found (scored) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for result in aware_cells:
            cell = result["job_aware"]
            lines.append(
                f"| {result['cell']} | {result['seed']} | {cell['false_lemon_verdicts']} "
                f"| {cell['false_lemon_verdicts_on_crash_loop_nodes']} "
                f"| {cell.get('false_lemon_verdicts_on_pinned_nodes', 0)} "
                f"| {cell['crash_loop_users_told']} of {cell['crash_loop_users']} "
                f"| {cell['app_incidents_to_owners']} of {cell['app_incidents']} "
                f"| {_lemons_scored(result)} |"
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
