"""The report's charts: each a function from report data to one figure holding an SVG.

Each chart is an ``<figure class="chart" data-chart=NAME>`` holding one ``<svg>``; data marks carry
the class ``mark``:

``incidents-over-time``
    incidents by the bin of their first evidence, stacked by severity;
``xid-mix``
    XID events by code, coloured by category;
``rf-over-time-<seconds>``
    per MTTF window length: r_f of each window (bars, all job sizes) and the cumulative r_f of
    each job-size bucket (lines), with the paper's RSC-1/RSC-2 rates as reference lines;
``rf-by-size``
    r_f per job-size bucket over the whole span, with the paper's rates;
``mttf-by-size``
    MTTF per job-size bucket (log scale), with the MTTF the bucket's average job would have at the
    paper's rates;
``ettr``
    expected ETTR at the optimal checkpoint interval per reference job size;
``fleet-mtbf``
    the fleet's MTBF (hours per critical hardware failure) per calendar window, no job records needed.

A chart without data is replaced by a sentence saying so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from stream.reports.html.markup import element, format_number, short_time, window_label
from stream.reports.html.svg import (
    HALF_WIDTH,
    MARGIN_TOP,
    Frame,
    chart_figure,
    empty_chart_figure,
    legend,
    nice_ceiling,
    svg_line,
    svg_path,
    svg_rect,
    svg_root,
    svg_text,
    tick_label,
    tick_steps,
    time_axis,
    tooltip,
    y_axis,
    y_axis_title,
)

__all__ = [
    "SEVERITIES",
    "ettr_chart",
    "fleet_mtbf_chart",
    "incidents_over_time_chart",
    "mttf_by_size_chart",
    "rf_by_size_chart",
    "rf_over_time_chart",
    "xid_mix_chart",
]

#: Incident severities, most severe first: the stacking order and the known badge colours.
SEVERITIES = ("critical", "warn", "info")

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999933", "#882255")
_SEVERITY_COLOURS = {"critical": "#C0392B", "warn": "#E69F00", "info": "#5B8DB8"}
_PAPER_DASHES = ("6 4", "2 3")


def _reference_lines(frame: Frame, paper: dict[str, float], top: float) -> list[str]:
    """The paper's fleet rates as dashed horizontal lines on a linear r_f axis."""
    out = []
    for (name, rate), dash in zip(paper.items(), _PAPER_DASHES, strict=False):
        if rate > top:
            continue
        y = frame.y0 - frame.plot_height * rate / top
        tip = tooltip(f"{name}: {rate} failures per 1000 node-days")
        out.append(svg_line("ref", frame.x0, frame.x1, y, y, tip, **{"stroke-dasharray": dash}))
        out.append(svg_text("ref-label", frame.x1 + 4, y + 4, f"{name.split(' ')[0]} {rate:g}"))
    return out


def _bucket_label(bucket: str) -> str:
    return "all jobs" if bucket == "all" else f"{bucket} GPUs"


def _bucket_colours(buckets: Sequence[str]) -> dict[str, str]:
    others = [b for b in buckets if b != "all"]
    colours = {b: _PALETTE[i % len(_PALETTE)] for i, b in enumerate(others)}
    colours["all"] = "#222222"
    return colours


def incidents_over_time_chart(report: dict[str, Any]) -> str:
    """Incidents by the bin of their first evidence, stacked by severity.

    Parameters
    ----------
    report
        The report data (:func:`stream.reports.text.build_report`); reads ``incidents_over_time``.

    Returns
    -------
    str
        The ``incidents-over-time`` figure, or a sentence if there are no incidents.
    """
    name, title = "incidents-over-time", "Incidents over time by severity"
    data = report.get("incidents_over_time") or {}
    bins = data.get("bins") or []
    if not any(b[s] for b in bins for s in SEVERITIES):
        return empty_chart_figure(name, title, "No incidents in the store.")
    width = data["bin_seconds"]
    frame = Frame(250)
    top = nice_ceiling(max(sum(b[s] for s in SEVERITIES) for b in bins))
    body = y_axis(frame, top, "incidents", integer=True)
    step = frame.plot_width / len(bins)
    bar = max(step * 0.8, 1.0)
    for i, b in enumerate(bins):
        x = frame.x0 + step * i + (step - bar) / 2
        base = 0.0
        for severity in SEVERITIES:
            if count := b[severity]:
                h = frame.plot_height * count / top
                y = frame.y0 - frame.plot_height * base / top - h
                tip = f"{short_time(b['start'])}: {count} {severity}"
                body.append(svg_rect(f"mark sev-{severity}", x, y, bar, h, _SEVERITY_COLOURS[severity], tip))
                base += count
    body += time_axis(frame, [b["start"] for b in bins], width)
    keys = legend([(_SEVERITY_COLOURS[s], s, "bar") for s in SEVERITIES])
    caption = f"Incidents by the {window_label(width)} of their first evidence."
    return chart_figure(name, title, svg_root(frame, title, body), keys, caption)


def xid_mix_chart(report: dict[str, Any], limit: int = 16) -> str:
    """XID events by code (horizontal bars), coloured by the code's category.

    Parameters
    ----------
    report
        The report data; reads ``xid_mix`` (codes, most events first).
    limit
        Codes drawn one by one; the rest share one bar.

    Returns
    -------
    str
        The ``xid-mix`` figure, or a sentence if there are no XID events.
    """
    name, title = "xid-mix", "XID mix by code"
    rows = report.get("xid_mix") or []
    if not rows:
        return empty_chart_figure(name, title, "No XID events in the store.")
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["category"]] = totals.get(row["category"], 0) + row["events"]
    ordered = sorted(totals, key=lambda c: (-totals[c], c))
    colours = {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(ordered)}
    entries = [
        (
            f"XID {r['xid']} · {r['name'] or 'unknown'}",
            r["events"],
            colours[r["category"]],
            f"XID {r['xid']} {r['name']}: {r['events']:,} events on {r['nodes']:,} nodes "
            f"({r['category']}, {r['severity']})",
        )
        for r in rows[:limit]
    ]
    if rest := rows[limit:]:
        events = sum(r["events"] for r in rest)
        codes = ", ".join(str(r["xid"]) for r in rest)
        entries.append((f"{len(rest)} other codes", events, "#777777", f"XIDs {codes}: {events:,} events"))
    row_height = 22
    frame = Frame(MARGIN_TOP + row_height * len(entries) + 30, left=260, right=70, bottom=30)
    top = nice_ceiling(max(events for _, events, _, _ in entries))
    steps = tick_steps(top, integer=True)
    body = []
    for i in range(steps + 1):
        x = frame.x0 + frame.plot_width * i / steps
        body.append(svg_line("grid", x, x, frame.y1, frame.y0))
        body.append(svg_text("tick", x, frame.y0 + 16, tick_label(top * i / steps), "middle"))
    for i, (label, events, colour, tip) in enumerate(entries):
        y = frame.y1 + row_height * i + 3
        w = max(frame.plot_width * events / top, 2.0)
        body.append(
            svg_text("label", frame.x0 - 6, y + 12, label if len(label) <= 38 else label[:37] + "…", "end")
        )
        body.append(svg_rect("mark", frame.x0, y, w, row_height - 7, colour, tip))
        body.append(svg_text("value", frame.x0 + w + 4, y + 12, f"{events:,}"))
    keys = legend([(colours[c], f"{c} ({totals[c]:,})", "bar") for c in ordered])
    return chart_figure(
        name, title, svg_root(frame, title, body), keys, "Bar colour: the XID's category (events)."
    )


def rf_over_time_chart(window: dict[str, Any], paper: dict[str, float]) -> str:
    """r_f of each window (bars, all job sizes) and the cumulative r_f per job-size bucket (lines).

    Parameters
    ----------
    window
        One entry of the report's ``mttf`` list: one window length, its buckets and its series.
    paper
        The paper's fleet rates by name (``paper_rf_per_1000_node_days``), drawn as dashed lines.

    Returns
    -------
    str
        The ``rf-over-time-<seconds>`` figure, or a sentence if there are no windows of this length.
    """
    seconds = window["window_seconds"]
    name = f"rf-over-time-{seconds}"
    title = f"Failure rate r_f over time, {window_label(seconds)} windows"
    series = window.get("series") or {}
    points = series.get("points") or []
    if not points:
        return empty_chart_figure(name, title, "No MTTF windows of this length.")
    width = series["bin_seconds"]
    starts = sorted({p["start"] for p in points})
    index = {start: i for i, start in enumerate(starts)}
    buckets = [b["size_bucket"] for b in window["buckets"]]
    by_bucket: dict[str, list[tuple[float, int]]] = {b: [(0.0, 0)] * len(starts) for b in buckets}
    for p in points:
        if p["size_bucket"] in by_bucket:
            by_bucket[p["size_bucket"]][index[p["start"]]] = (p["node_hours"], p["failures"])
    cumulative: dict[str, list[float | None]] = {}
    for bucket, values in by_bucket.items():
        node_days, failures, line = 0.0, 0, []
        for node_hours, n in values:
            node_days += node_hours / 24
            failures += n
            line.append(1000 * failures / node_days if node_days else None)
        cumulative[bucket] = line
    finals = [line[-1] for line in cumulative.values() if line and line[-1] is not None]
    top = nice_ceiling(max([*finals, *paper.values(), 0.0]) * 2.2)
    frame = Frame(270)
    clip = f"clip-{seconds}"
    plot = {
        "x": float(frame.x0),
        "y": float(frame.y1),
        "width": frame.plot_width,
        "height": frame.plot_height,
    }
    body = [f"<defs>{element('clipPath', {'id': clip}, element('rect', plot))}</defs>"]
    body += y_axis(frame, top, "failures / 1000 node-days")
    step = frame.plot_width / len(starts)
    bar = max(step * 0.8, 1.0)
    for i, (node_hours, failures) in enumerate(by_bucket.get("all", [])):
        if not failures or not node_hours:
            continue
        rate = 1000 * failures / (node_hours / 24)
        h = min(frame.plot_height * rate / top, frame.plot_height)
        x = frame.x0 + step * i + (step - bar) / 2
        tip = f"{short_time(starts[i])}: {failures} failures, r_f {rate:,.1f}"
        body.append(svg_rect("mark window-bar", x, frame.y0 - h, bar, h, None, tip))
        if rate > top:  # cut at the top: a small triangle says so
            cx, y = x + bar / 2, frame.y1
            body.append(
                svg_path("mark clipped", [(cx - 4, y + 7), (cx + 4, y + 7), (cx, y)], tip, close=True)
            )
    colours = _bucket_colours(buckets)
    for bucket in buckets:
        coords = [
            (frame.x0 + step * (i + 0.5), max(frame.y0 - frame.plot_height * value / top, frame.y1 - 50))
            for i, value in enumerate(cumulative[bucket])
            if value is not None
        ]
        if coords:
            css = "mark cumulative all" if bucket == "all" else "mark cumulative"
            tip = f"{_bucket_label(bucket)}: cumulative r_f {format_number(cumulative[bucket][-1])}"
            extra = {"clip-path": f"url(#{clip})", "stroke": colours[bucket]}
            # close= named: a type checker cannot tell that ``extra`` holds no ``close`` key
            body.append(svg_path(css, coords, tip, close=False, **extra))
    body += _reference_lines(frame, paper, top)
    body += time_axis(frame, starts, width)
    keys = legend(
        [("#BBBBBB", "r_f per window, all sizes", "bar")]
        + [(colours[b], f"cumulative, {_bucket_label(b)}", "line") for b in buckets]
        + [("#333333", ref, "dash") for ref in paper]
    )
    caption = (
        f"Bars: r_f of each {window_label(width)}, all job sizes (a triangle marks a bar cut at the top; "
        "hover for its value). Lines: r_f from the first window up to each point, per job-size bucket. "
        "Dashed: the paper's fleet rates."
    )
    return chart_figure(name, title, svg_root(frame, title, body), keys, caption)


def _vertical_bars(
    frame: Frame,
    bars: Sequence[tuple[str, float | None, str, str, str]],
    y_of: Callable[[float], float],
) -> list[str]:
    """One bar per ``(label, value, value text, hover text, colour)``; no value draws no bar."""
    out = []
    step = frame.plot_width / len(bars)
    width = min(step * 0.6, 80)
    for i, (label, value, value_text, tip, colour) in enumerate(bars):
        x = frame.x0 + step * i + (step - width) / 2
        cx = x + width / 2
        if value is not None:
            y = y_of(value)
            out.append(svg_rect("mark", x, y, width, frame.y0 - y, colour, tip))
            out.append(svg_text("value", cx, y - 4, value_text, "middle"))
        else:
            out.append(svg_text("value muted", cx, frame.y0 - 6, value_text, "middle"))
        out.append(svg_text("tick", cx, frame.y0 + 17, label, "middle"))
    out.append(svg_line("axis", frame.x0, frame.x1, frame.y0, frame.y0))
    return out


def _overall_buckets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Job-size buckets of the longest window length: sums over the span, the same for every length."""
    windows = report.get("mttf") or []
    return list(windows[-1]["buckets"]) if windows else []


def rf_by_size_chart(report: dict[str, Any]) -> str:
    """r_f per job-size bucket over the whole span, with the paper's rates.

    Parameters
    ----------
    report
        The report data; reads ``mttf`` and ``paper_rf_per_1000_node_days``.

    Returns
    -------
    str
        The ``rf-by-size`` figure, or a sentence if no bucket has exposure yet.
    """
    name, title = "rf-by-size", "Failure rate r_f by job size"
    buckets = [b for b in _overall_buckets(report) if b["rf_per_1000_node_days"] is not None]
    if not buckets:
        return empty_chart_figure(name, title, "No MTTF windows with exposure yet.")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    top = nice_ceiling(max([*(b["rf_per_1000_node_days"] for b in buckets), *paper.values()]) * 1.15)
    frame = Frame(260, width=HALF_WIDTH, right=70)
    colours = _bucket_colours([b["size_bucket"] for b in buckets])
    body = y_axis(frame, top, "failures / 1000 node-days")
    body += _vertical_bars(
        frame,
        [
            (
                _bucket_label(b["size_bucket"]),
                b["rf_per_1000_node_days"],
                format_number(b["rf_per_1000_node_days"]),
                f"{_bucket_label(b['size_bucket'])}: {b['failures']:,} hardware failures in "
                f"{b['node_hours'] / 24:,.1f} node-days",
                colours[b["size_bucket"]],
            )
            for b in buckets
        ],
        lambda v: frame.y0 - frame.plot_height * v / top,
    )
    body += _reference_lines(frame, paper, top)
    keys = legend([("#0072B2", "measured r_f", "bar")] + [("#333333", ref, "dash") for ref in paper])
    caption = "Hardware-attributed job failures per 1000 node-days of exposure, over the whole span."
    return chart_figure(name, title, svg_root(frame, title, body), keys, caption)


def mttf_by_size_chart(report: dict[str, Any]) -> str:
    """MTTF per job-size bucket (log scale), with the MTTF its average job would have at the paper's rates.

    Parameters
    ----------
    report
        The report data; reads ``mttf`` and ``paper_rf_per_1000_node_days``.

    Returns
    -------
    str
        The ``mttf-by-size`` figure, or a sentence if no bucket has exposure yet.
    """
    name, title = "mttf-by-size", "MTTF by job size"
    buckets = [b for b in _overall_buckets(report) if b["mean_job_nodes"]]
    if not buckets:
        return empty_chart_figure(name, title, "No MTTF windows with exposure yet.")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    references = {ref: [24000 / (b["mean_job_nodes"] * rate) for b in buckets] for ref, rate in paper.items()}
    known = [b["mttf_hours"] for b in buckets if b["mttf_hours"]]
    known += [v for line in references.values() for v in line]
    low = 10 ** math.floor(math.log10(min(known)))
    high = max(10 ** math.ceil(math.log10(max(known))), low * 10)
    frame = Frame(260, width=HALF_WIDTH, right=50)

    def y_of(value: float) -> float:
        fraction = math.log10(value / low) / math.log10(high / low)
        return frame.y0 - frame.plot_height * fraction

    body = []
    decade = low
    while decade <= high * 1.0001:
        body.append(svg_line("grid", frame.x0, frame.x1, y_of(decade), y_of(decade)))
        body.append(svg_text("tick", frame.x0 - 6, y_of(decade) + 4, tick_label(decade), "end"))
        decade *= 10
    body.append(y_axis_title(frame, "hours (log scale)"))
    colours = _bucket_colours([b["size_bucket"] for b in buckets])
    body += _vertical_bars(
        frame,
        [
            (
                _bucket_label(b["size_bucket"]),
                b["mttf_hours"] or None,
                f"{format_number(b['mttf_hours'], 1)} h" if b["mttf_hours"] else "no failure",
                f"{_bucket_label(b['size_bucket'])}: MTTF {format_number(b['mttf_hours'], 1)} h "
                f"({b['failures']:,} failures in {b['job_hours']:,.0f} job-hours; average job "
                f"{b['mean_job_nodes']:,.1f} nodes)",
                colours[b["size_bucket"]],
            )
            for b in buckets
        ],
        y_of,
    )
    step = frame.plot_width / len(buckets)
    for (ref, line), dash in zip(references.items(), _PAPER_DASHES, strict=False):
        coords = [(frame.x0 + step * (i + 0.5), y_of(v)) for i, v in enumerate(line)]
        body.append(svg_path("mark ref-line", coords, ref, close=False, **{"stroke-dasharray": dash}))
        for (x, y), b, v in zip(coords, buckets, line, strict=True):
            tip = f"{ref}: a {b['mean_job_nodes']:,.1f}-node job fails every {v:,.1f} h"
            body.append(
                element("circle", {"class": "mark ref-point", "cx": x, "cy": y, "r": 3.5}, tooltip(tip))
            )
        body.append(svg_text("ref-label", frame.x1 + 4, coords[-1][1] + 4, ref.split(" ")[0]))
    keys = legend(
        [("#0072B2", "measured MTTF", "bar")] + [("#333333", f"at the {ref} rate", "dash") for ref in paper]
    )
    caption = (
        "Measured: job-hours per hardware-attributed failure in each bucket. Dashed: the MTTF the bucket's "
        "average job (node-hours / job-hours nodes) would have at the paper's fleet rates, "
        "MTTF = 1 / (nodes · r_f)."
    )
    return chart_figure(name, title, svg_root(frame, title, body), keys, caption)


def ettr_chart(report: dict[str, Any]) -> str:
    """Expected ETTR at the best checkpoint interval, per reference job size.

    Parameters
    ----------
    report
        The report data; reads ``ettr_guidance``.

    Returns
    -------
    str
        The ``ettr`` figure, or a sentence if r_f is not defined yet. A negative expected ETTR
        (the job never finishes) is drawn as 0.
    """
    name, title = "ettr", "Expected ETTR at the best checkpoint interval"
    guidance = report.get("ettr_guidance") or []
    if not guidance:
        return empty_chart_figure(
            name, title, "No hardware-attributed failures yet: r_f, and so ETTR, are not defined."
        )
    frame = Frame(240, width=HALF_WIDTH, right=20)
    body = y_axis(frame, 1.0, "expected ETTR")
    body += _vertical_bars(
        frame,
        [
            (
                f"{g['gpus']:,} GPUs",
                max(g["expected_ettr"], 0.0),
                format_number(max(g["expected_ettr"], 0.0), 3),
                f"{g['gpus']:,} GPUs: checkpoint every {format_number(g['optimal_checkpoint_minutes'], 1)} "
                f"min, projected MTTF {format_number(g['projected_mttf_hours'])} h",
                "#009E73",
            )
            for g in guidance
        ],
        lambda v: frame.y0 - frame.plot_height * v,
    )
    caption = "Share of wall-clock time that is useful training, from the measured r_f (SPEC 3)."
    return chart_figure(name, title, svg_root(frame, title, body), "", caption)


def fleet_mtbf_chart(report: dict[str, Any], limit: int = 40) -> str:
    """The fleet's MTBF per calendar window (the newest ``limit`` windows), from critical hardware
    incidents over the fleet's nodes: no job records needed.

    Parameters
    ----------
    report
        The report data; reads ``fleet``.

    Returns
    -------
    str
        The ``fleet-mtbf`` figure, or a sentence if no window had a failure.
    """
    name, title = "fleet-mtbf", "Fleet MTBF per window"
    fleet = report.get("fleet") or {}
    windows = (fleet.get("windows") or [])[-limit:]
    known = [w["mtbf_hours"] for w in windows if w["mtbf_hours"]]
    if not known:
        return empty_chart_figure(name, title, "No hardware failure yet: the MTBF is not known.")
    top = nice_ceiling(max(known) * 1.15)
    frame = Frame(260, right=40)
    body = y_axis(frame, top, "hours per failure")
    body += _vertical_bars(
        frame,
        [
            (
                w["start"][:10] if fleet.get("window") != "quarter" else w["start"][:7],
                w["mtbf_hours"],
                format_number(w["mtbf_hours"], 1) if w["mtbf_hours"] else "none",
                f"{w['start'][:10]}: {w['hardware_failures']:,} hardware failures over {w['nodes']:,} nodes "
                f"({format_number(w['node_days'], 1)} node-days)",
                "#0072B2",
            )
            for w in windows
        ],
        lambda v: frame.y0 - frame.plot_height * v / top,
    )
    caption = (
        f"Hours of each {fleet.get('window', 'window')} per critical hardware failure (system MTBF); "
        f"no bar: no failure. {fleet.get('note', '')}."
    )
    return chart_figure(name, title, svg_root(frame, title, body), legend([]), caption)
