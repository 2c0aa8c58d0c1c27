"""``faultstream report --html``: the report as one self-contained HTML page.

The page is drawn from the plain data of :func:`stream.reports.text.build_report` (what ``--json``
prints): inline CSS, inline SVG charts computed here, no script, no web font, no link to anything
outside the file — a Content-Security-Policy in the page forbids fetching anything at all. Every
text that comes from the store is escaped (``html.escape``) before it goes into the page.

Charts (each an ``<figure class="chart" data-chart=NAME>`` holding one ``<svg>``; data marks carry
the class ``mark``):

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
    expected ETTR at the optimal checkpoint interval per reference job size.

A chart without data is replaced by a sentence saying so.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["check_writable", "render_html", "write_html"]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999933", "#882255")
_SEVERITIES = ("critical", "warn", "info")
_SEVERITY_COLOURS = {"critical": "#C0392B", "warn": "#E69F00", "info": "#5B8DB8"}
_PAPER_DASHES = ("6 4", "2 3")
_WIDTH, _HALF_WIDTH = 1000, 540  # full-width and side-by-side charts
_TOP, _RIGHT, _BOTTOM, _LEFT = 14, 92, 42, 58


def _e(value: Any) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _window_label(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S")


def _short_time(text: str | None) -> str:
    return "-" if not text else str(text)[:19].replace("T", " ")


#: Axis tops (times a power of ten) and how many equal steps divide each into round numbers.
_NICE_TOPS = ((1, 5), (1.5, 3), (2, 4), (2.5, 5), (3, 3), (4, 4), (5, 5), (6, 3), (8, 4), (10, 5))


def _nice_ceiling(value: float) -> float:
    """The smallest round axis top at or above ``value`` (1 for nothing).

    >>> _nice_ceiling(538), _nice_ceiling(14.7), _nice_ceiling(0)
    (600.0, 15.0, 1.0)
    """
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for mantissa, _ in _NICE_TOPS:
        if value <= mantissa * power * (1 + 1e-9):
            return float(mantissa * power)
    return float(10 * power)


def _tick_steps(top: float, *, integer: bool = False) -> int:
    """How many grid steps split ``top`` (a :func:`_nice_ceiling` value) into round numbers."""
    if integer and top < 5:
        return max(int(top), 1)
    mantissa = top / 10 ** math.floor(math.log10(top))
    return min(_NICE_TOPS, key=lambda pair: abs(pair[0] - mantissa))[1]


def _tick_label(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


class _Frame:
    """A chart's plot area in SVG coordinates; y grows upwards in data terms."""

    def __init__(
        self,
        height: int,
        *,
        width: int = _WIDTH,
        left: int = _LEFT,
        right: int = _RIGHT,
        bottom: int = _BOTTOM,
    ) -> None:
        self.width = width
        self.height = height
        self.x0 = left
        self.x1 = width - right
        self.y0 = height - bottom  # the baseline
        self.y1 = _TOP

    @property
    def plot_width(self) -> float:
        return self.x1 - self.x0

    @property
    def plot_height(self) -> float:
        return self.y0 - self.y1


def _el(tag: str, attrs: dict[str, Any], content: str = "") -> str:
    """One element; attribute values are escaped, floats rounded to 0.1, ``content`` is HTML already."""
    text = " ".join(
        f'{name}="{value:.1f}"' if isinstance(value, float) else f'{name}="{_e(value)}"'
        for name, value in attrs.items()
    )
    return f"<{tag} {text}>{content}</{tag}>"


def _tip(text: str) -> str:
    """A hover text (SVG ``<title>``)."""
    return f"<title>{_e(text)}</title>"


def _svg(frame: _Frame, label: str, body: Iterable[str]) -> str:
    attrs = {
        "viewBox": f"0 0 {frame.width} {frame.height}",
        "width": frame.width,
        "height": frame.height,
        "role": "img",
        "aria-label": label,
        "xmlns": "http://www.w3.org/2000/svg",
    }
    return _el("svg", attrs, _tip(label) + "".join(body))


def _figure(name: str, title: str, svg: str, legend: str = "", caption: str = "") -> str:
    content = f"<h3>{_e(title)}</h3>{legend}{svg}"
    if caption:
        content += f"<figcaption>{_e(caption)}</figcaption>"
    return _el("figure", {"class": "chart", "data-chart": name}, content)


def _no_data(name: str, title: str, reason: str) -> str:
    content = f'<h3>{_e(title)}</h3><p class="empty">{_e(reason)}</p>'
    return _el("figure", {"class": "chart empty", "data-chart": name}, content)


def _legend(items: Sequence[tuple[str, str, str]]) -> str:
    """``(colour, label, style)`` items; style ``bar``, ``line`` or ``dash``."""
    keys = "".join(
        _el(
            "span",
            {"class": "key"},
            _el("span", {"class": f"swatch {style}", "style": f"--c:{colour}"}) + _e(label),
        )
        for colour, label, style in items
    )
    return f'<div class="legend">{keys}</div>'


def _line(css: str, x1: float, x2: float, y1: float, y2: float, content: str = "", **extra: str) -> str:
    attrs = {"class": css, "x1": float(x1), "x2": float(x2), "y1": float(y1), "y2": float(y2)}
    return _el("line", {**attrs, **extra}, content)


def _text(css: str, x: float, y: float, text: str, anchor: str = "start") -> str:
    return _el("text", {"class": css, "x": float(x), "y": float(y), "text-anchor": anchor}, _e(text))


def _rect(css: str, x: float, y: float, width: float, height: float, fill: str | None, tip: str) -> str:
    attrs: dict[str, Any] = {"class": css, "x": float(x), "y": float(y), "width": float(width)}
    attrs["height"] = float(max(height, 0.0))
    if fill:
        attrs["fill"] = fill
    return _el("rect", attrs, _tip(tip))


def _path(
    css: str, points: Sequence[tuple[float, float]], tip: str, *, close: bool = False, **extra: str
) -> str:
    d = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f} {y:.1f}" for i, (x, y) in enumerate(points))
    return _el("path", {"class": css, "d": d + (" Z" if close else ""), **extra}, _tip(tip))


def _y_axis(frame: _Frame, top: float, label: str, *, integer: bool = False) -> list[str]:
    """Grid lines and labels of a linear y axis from 0 to ``top``."""
    ticks = _tick_steps(top, integer=integer)
    out = []
    for i in range(ticks + 1):
        y = frame.y0 - frame.plot_height * i / ticks
        out.append(_line("grid", frame.x0, frame.x1, y, y))
        out.append(_text("tick", frame.x0 - 6, y + 4, _tick_label(top * i / ticks), "end"))
    out.append(_y_title(frame, label))
    return out


def _y_title(frame: _Frame, label: str) -> str:
    y = (frame.y0 + frame.y1) / 2
    attrs = {
        "class": "axis-title",
        "transform": f"translate(14 {y:.1f}) rotate(-90)",
        "text-anchor": "middle",
    }
    return _el("text", attrs, _e(label))


def _time_axis(frame: _Frame, starts: Sequence[str], bin_seconds: int) -> list[str]:
    """Tick labels under evenly spaced bins (about seven of them)."""
    n = len(starts)
    every = max(1, math.ceil(n / 7))
    fmt = "%b %d" if bin_seconds >= 86400 else "%b %d %H:%M"
    out = [_line("axis", frame.x0, frame.x1, frame.y0, frame.y0)]
    for i in range(0, n, every):
        x = frame.x0 + frame.plot_width * (i + 0.5) / n
        out.append(_line("axis", x, x, frame.y0, frame.y0 + 4))
        out.append(_text("tick", x, frame.y0 + 17, _parse_time(starts[i]).strftime(fmt), "middle"))
    return out


def _reference_lines(frame: _Frame, paper: dict[str, float], top: float) -> list[str]:
    """The paper's fleet rates as dashed horizontal lines on a linear r_f axis."""
    out = []
    for (name, rate), dash in zip(paper.items(), _PAPER_DASHES, strict=False):
        if rate > top:
            continue
        y = frame.y0 - frame.plot_height * rate / top
        tip = _tip(f"{name}: {rate} failures per 1000 node-days")
        out.append(_line("ref", frame.x0, frame.x1, y, y, tip, **{"stroke-dasharray": dash}))
        out.append(_text("ref-label", frame.x1 + 4, y + 4, f"{name.split(' ')[0]} {rate:g}"))
    return out


def _bucket_label(bucket: str) -> str:
    return "all jobs" if bucket == "all" else f"{bucket} GPUs"


def _bucket_colours(buckets: Sequence[str]) -> dict[str, str]:
    others = [b for b in buckets if b != "all"]
    colours = {b: _PALETTE[i % len(_PALETTE)] for i, b in enumerate(others)}
    colours["all"] = "#222222"
    return colours


# -- charts ---------------------------------------------------------------------------------------


def _incidents_over_time_chart(report: dict[str, Any]) -> str:
    name, title = "incidents-over-time", "Incidents over time by severity"
    data = report.get("incidents_over_time") or {}
    bins = data.get("bins") or []
    if not any(b[s] for b in bins for s in _SEVERITIES):
        return _no_data(name, title, "No incidents in the store.")
    width = data["bin_seconds"]
    frame = _Frame(250)
    top = _nice_ceiling(max(sum(b[s] for s in _SEVERITIES) for b in bins))
    body = _y_axis(frame, top, "incidents", integer=True)
    step = frame.plot_width / len(bins)
    bar = max(step * 0.8, 1.0)
    for i, b in enumerate(bins):
        x = frame.x0 + step * i + (step - bar) / 2
        base = 0.0
        for severity in _SEVERITIES:
            if count := b[severity]:
                h = frame.plot_height * count / top
                y = frame.y0 - frame.plot_height * base / top - h
                tip = f"{_short_time(b['start'])}: {count} {severity}"
                body.append(_rect(f"mark sev-{severity}", x, y, bar, h, _SEVERITY_COLOURS[severity], tip))
                base += count
    body += _time_axis(frame, [b["start"] for b in bins], width)
    legend = _legend([(_SEVERITY_COLOURS[s], s, "bar") for s in _SEVERITIES])
    caption = f"Incidents by the {_window_label(width)} of their first evidence."
    return _figure(name, title, _svg(frame, title, body), legend, caption)


def _xid_mix_chart(report: dict[str, Any], limit: int = 16) -> str:
    name, title = "xid-mix", "XID mix by code"
    rows = report.get("xid_mix") or []
    if not rows:
        return _no_data(name, title, "No XID events in the store.")
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
    frame = _Frame(_TOP + row_height * len(entries) + 30, left=260, right=70, bottom=30)
    top = _nice_ceiling(max(events for _, events, _, _ in entries))
    steps = _tick_steps(top, integer=True)
    body = []
    for i in range(steps + 1):
        x = frame.x0 + frame.plot_width * i / steps
        body.append(_line("grid", x, x, frame.y1, frame.y0))
        body.append(_text("tick", x, frame.y0 + 16, _tick_label(top * i / steps), "middle"))
    for i, (label, events, colour, tip) in enumerate(entries):
        y = frame.y1 + row_height * i + 3
        w = max(frame.plot_width * events / top, 2.0)
        body.append(
            _text("label", frame.x0 - 6, y + 12, label if len(label) <= 38 else label[:37] + "…", "end")
        )
        body.append(_rect("mark", frame.x0, y, w, row_height - 7, colour, tip))
        body.append(_text("value", frame.x0 + w + 4, y + 12, f"{events:,}"))
    legend = _legend([(colours[c], f"{c} ({totals[c]:,})", "bar") for c in ordered])
    return _figure(name, title, _svg(frame, title, body), legend, "Bar colour: the XID's category (events).")


def _rf_over_time_chart(window: dict[str, Any], paper: dict[str, float]) -> str:
    seconds = window["window_seconds"]
    name = f"rf-over-time-{seconds}"
    title = f"Failure rate r_f over time, {_window_label(seconds)} windows"
    series = window.get("series") or {}
    points = series.get("points") or []
    if not points:
        return _no_data(name, title, "No MTTF windows of this length.")
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
    top = _nice_ceiling(max([*finals, *paper.values(), 0.0]) * 2.2)
    frame = _Frame(270)
    clip = f"clip-{seconds}"
    plot = {
        "x": float(frame.x0),
        "y": float(frame.y1),
        "width": frame.plot_width,
        "height": frame.plot_height,
    }
    body = [f"<defs>{_el('clipPath', {'id': clip}, _el('rect', plot))}</defs>"]
    body += _y_axis(frame, top, "failures / 1000 node-days")
    step = frame.plot_width / len(starts)
    bar = max(step * 0.8, 1.0)
    for i, (node_hours, failures) in enumerate(by_bucket.get("all", [])):
        if not failures or not node_hours:
            continue
        rate = 1000 * failures / (node_hours / 24)
        h = min(frame.plot_height * rate / top, frame.plot_height)
        x = frame.x0 + step * i + (step - bar) / 2
        tip = f"{_short_time(starts[i])}: {failures} failures, r_f {rate:,.1f}"
        body.append(_rect("mark window-bar", x, frame.y0 - h, bar, h, None, tip))
        if rate > top:  # cut at the top: a small triangle says so
            cx, y = x + bar / 2, frame.y1
            body.append(_path("mark clipped", [(cx - 4, y + 7), (cx + 4, y + 7), (cx, y)], tip, close=True))
    colours = _bucket_colours(buckets)
    for bucket in buckets:
        coords = [
            (frame.x0 + step * (i + 0.5), max(frame.y0 - frame.plot_height * value / top, frame.y1 - 50))
            for i, value in enumerate(cumulative[bucket])
            if value is not None
        ]
        if coords:
            css = "mark cumulative all" if bucket == "all" else "mark cumulative"
            tip = f"{_bucket_label(bucket)}: cumulative r_f {_num(cumulative[bucket][-1])}"
            extra = {"clip-path": f"url(#{clip})", "stroke": colours[bucket]}
            body.append(_path(css, coords, tip, **extra))
    body += _reference_lines(frame, paper, top)
    body += _time_axis(frame, starts, width)
    legend = _legend(
        [("#BBBBBB", "r_f per window, all sizes", "bar")]
        + [(colours[b], f"cumulative, {_bucket_label(b)}", "line") for b in buckets]
        + [("#333333", ref, "dash") for ref in paper]
    )
    caption = (
        f"Bars: r_f of each {_window_label(width)}, all job sizes (a triangle marks a bar cut at the top; "
        "hover for its value). Lines: r_f from the first window up to each point, per job-size bucket. "
        "Dashed: the paper's fleet rates."
    )
    return _figure(name, title, _svg(frame, title, body), legend, caption)


def _vertical_bars(
    frame: _Frame,
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
            out.append(_rect("mark", x, y, width, frame.y0 - y, colour, tip))
            out.append(_text("value", cx, y - 4, value_text, "middle"))
        else:
            out.append(_text("value muted", cx, frame.y0 - 6, value_text, "middle"))
        out.append(_text("tick", cx, frame.y0 + 17, label, "middle"))
    out.append(_line("axis", frame.x0, frame.x1, frame.y0, frame.y0))
    return out


def _overall_buckets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Job-size buckets of the longest window length: sums over the span, the same for every length."""
    windows = report.get("mttf") or []
    return list(windows[-1]["buckets"]) if windows else []


def _rf_by_size_chart(report: dict[str, Any]) -> str:
    name, title = "rf-by-size", "Failure rate r_f by job size"
    buckets = [b for b in _overall_buckets(report) if b["rf_per_1000_node_days"] is not None]
    if not buckets:
        return _no_data(name, title, "No MTTF windows with exposure yet.")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    top = _nice_ceiling(max([*(b["rf_per_1000_node_days"] for b in buckets), *paper.values()]) * 1.15)
    frame = _Frame(260, width=_HALF_WIDTH, right=70)
    colours = _bucket_colours([b["size_bucket"] for b in buckets])
    body = _y_axis(frame, top, "failures / 1000 node-days")
    body += _vertical_bars(
        frame,
        [
            (
                _bucket_label(b["size_bucket"]),
                b["rf_per_1000_node_days"],
                _num(b["rf_per_1000_node_days"]),
                f"{_bucket_label(b['size_bucket'])}: {b['failures']:,} hardware failures in "
                f"{b['node_hours'] / 24:,.1f} node-days",
                colours[b["size_bucket"]],
            )
            for b in buckets
        ],
        lambda v: frame.y0 - frame.plot_height * v / top,
    )
    body += _reference_lines(frame, paper, top)
    legend = _legend([("#0072B2", "measured r_f", "bar")] + [("#333333", ref, "dash") for ref in paper])
    caption = "Hardware-attributed job failures per 1000 node-days of exposure, over the whole span."
    return _figure(name, title, _svg(frame, title, body), legend, caption)


def _mttf_by_size_chart(report: dict[str, Any]) -> str:
    name, title = "mttf-by-size", "MTTF by job size"
    buckets = [b for b in _overall_buckets(report) if b["mean_job_nodes"]]
    if not buckets:
        return _no_data(name, title, "No MTTF windows with exposure yet.")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    references = {ref: [24000 / (b["mean_job_nodes"] * rate) for b in buckets] for ref, rate in paper.items()}
    known = [b["mttf_hours"] for b in buckets if b["mttf_hours"]]
    known += [v for line in references.values() for v in line]
    low = 10 ** math.floor(math.log10(min(known)))
    high = max(10 ** math.ceil(math.log10(max(known))), low * 10)
    frame = _Frame(260, width=_HALF_WIDTH, right=50)

    def y_of(value: float) -> float:
        fraction = math.log10(value / low) / math.log10(high / low)
        return frame.y0 - frame.plot_height * fraction

    body = []
    decade = low
    while decade <= high * 1.0001:
        body.append(_line("grid", frame.x0, frame.x1, y_of(decade), y_of(decade)))
        body.append(_text("tick", frame.x0 - 6, y_of(decade) + 4, _tick_label(decade), "end"))
        decade *= 10
    body.append(_y_title(frame, "hours (log scale)"))
    colours = _bucket_colours([b["size_bucket"] for b in buckets])
    body += _vertical_bars(
        frame,
        [
            (
                _bucket_label(b["size_bucket"]),
                b["mttf_hours"] or None,
                f"{_num(b['mttf_hours'], 1)} h" if b["mttf_hours"] else "no failure",
                f"{_bucket_label(b['size_bucket'])}: MTTF {_num(b['mttf_hours'], 1)} h ({b['failures']:,} "
                f"failures in {b['job_hours']:,.0f} job-hours; average job {b['mean_job_nodes']:,.1f} nodes)",
                colours[b["size_bucket"]],
            )
            for b in buckets
        ],
        y_of,
    )
    step = frame.plot_width / len(buckets)
    for (ref, line), dash in zip(references.items(), _PAPER_DASHES, strict=False):
        coords = [(frame.x0 + step * (i + 0.5), y_of(v)) for i, v in enumerate(line)]
        body.append(_path("mark ref-line", coords, ref, **{"stroke-dasharray": dash}))
        for (x, y), b, v in zip(coords, buckets, line, strict=True):
            tip = f"{ref}: a {b['mean_job_nodes']:,.1f}-node job fails every {v:,.1f} h"
            body.append(_el("circle", {"class": "mark ref-point", "cx": x, "cy": y, "r": 3.5}, _tip(tip)))
        body.append(_text("ref-label", frame.x1 + 4, coords[-1][1] + 4, ref.split(" ")[0]))
    legend = _legend(
        [("#0072B2", "measured MTTF", "bar")] + [("#333333", f"at the {ref} rate", "dash") for ref in paper]
    )
    caption = (
        "Measured: job-hours per hardware-attributed failure in each bucket. Dashed: the MTTF the bucket's "
        "average job (node-hours / job-hours nodes) would have at the paper's fleet rates, "
        "MTTF = 1 / (nodes · r_f)."
    )
    return _figure(name, title, _svg(frame, title, body), legend, caption)


def _ettr_chart(report: dict[str, Any]) -> str:
    name, title = "ettr", "Expected ETTR at the best checkpoint interval"
    guidance = report.get("ettr_guidance") or []
    if not guidance:
        return _no_data(
            name, title, "No hardware-attributed failures yet: r_f, and so ETTR, are not defined."
        )
    frame = _Frame(240, width=_HALF_WIDTH, right=20)
    body = _y_axis(frame, 1.0, "expected ETTR")
    body += _vertical_bars(
        frame,
        [
            (
                f"{g['gpus']:,} GPUs",
                max(g["expected_ettr"], 0.0),
                _num(max(g["expected_ettr"], 0.0), 3),
                f"{g['gpus']:,} GPUs: checkpoint every {_num(g['optimal_checkpoint_minutes'], 1)} min, "
                f"projected MTTF {_num(g['projected_mttf_hours'])} h",
                "#009E73",
            )
            for g in guidance
        ],
        lambda v: frame.y0 - frame.plot_height * v,
    )
    caption = "Share of wall-clock time that is useful training, from the measured r_f (SPEC 3)."
    return _figure(name, title, _svg(frame, title, body), "", caption)


# -- tables and sections --------------------------------------------------------------------------


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Iterable[int] = (), css: str = ""
) -> str:
    """A table whose cells are already HTML (escape them first); the ``numeric`` columns align right."""
    right = set(numeric)

    def cell(tag: str, i: int, content: str) -> str:
        return f'<{tag} class="num">{content}</{tag}>' if i in right else f"<{tag}>{content}</{tag}>"

    head = "".join(cell("th", i, _e(h)) for i, h in enumerate(headers))
    body = ["<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows]
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="empty">none</td></tr>')
    css_attr = f' class="{_e(css)}"' if css else ""
    return f"<table{css_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _severity_badge(severity: str) -> str:
    css = severity if severity in _SEVERITIES else "other"
    return f'<span class="badge sev-{css}">{_e(severity)}</span>'


def _status_badge(status: str) -> str:
    css = "open" if status != "resolved" else "resolved"
    return f'<span class="status {css}">{_e(status)}</span>'


def _time_cell(text: str | None) -> str:
    """A timestamp as date over time of day."""
    short = _short_time(text)
    day, _, clock = short.partition(" ")
    return f'<span class="nowrap">{_e(day)}</span>' + (
        f'<div class="muted">{_e(clock)}</div>' if clock else ""
    )


def _without_action(summary: str) -> str:
    """An incident summary without its trailing ``Action: ...`` (the table shows the action)."""
    return summary.split(" Action: ", 1)[0]


def _span_text(span: dict[str, Any]) -> str:
    first, last = span.get("first"), span.get("last")
    if not first or not last:
        return "-"
    days = (_parse_time(last) - _parse_time(first)).total_seconds() / 86400
    return f"{days:,.1f} days"


def _summary_section(report: dict[str, Any]) -> str:
    rows = report["rows"]
    span = report.get("time_span") or {}
    open_incidents = sum(r["open"] for r in report["incidents"])
    open_critical = sum(r["open"] for r in report["incidents"] if r["severity"] == "critical")
    attribution = {bool(r["hardware"]): r for r in report.get("attribution", [])}
    hardware = attribution.get(True, {"jobs": 0, "gpu_hours": 0.0})
    other = attribution.get(False, {"jobs": 0, "gpu_hours": 0.0})
    rf = report.get("rf_per_1000_node_days")
    paper = ", ".join(f"{n} {r:g}" for n, r in (report.get("paper_rf_per_1000_node_days") or {}).items())
    lemons = [n for n in report.get("lemon_nodes", []) if n["status"] != "resolved"]
    cards = [
        (
            "Time span",
            _span_text(span),
            f"{_short_time(span.get('first'))} → {_short_time(span.get('last'))} UTC (event time)",
        ),
        ("XID events", _int(rows["xid_events"]), f"{len(report.get('xid_mix', []))} distinct codes"),
        ("Job events", _int(rows["job_events"]), f"{_int(rows['ecc_samples'])} ECC samples (downsampled)"),
        ("Incidents", _int(rows["incidents"]), f"{open_incidents:,} open, {open_critical:,} open critical"),
        (
            "Hardware job failures",
            _int(hardware["jobs"]),
            f"{hardware['gpu_hours']:,.0f} GPU-hours lost; {other['jobs']:,} other failures",
        ),
        ("r_f per 1000 node-days", _num(rf), f"paper: {paper}"),
        ("Lemon nodes", _int(len(lemons)), ", ".join(n["node"] for n in lemons[:6]) or "none flagged"),
        ("Dead letters", _int(rows["dead_letters"]), "records that could not be used"),
    ]
    items = "".join(
        f'<div class="card"><div class="card-title">{_e(t)}</div><div class="card-value">{_e(v)}</div>'
        f'<div class="card-note">{_e(n)}</div></div>'
        for t, v, n in cards
    )
    return f'<section id="summary"><h2>Summary</h2><div class="cards">{items}</div></section>'


def _incidents_section(report: dict[str, Any]) -> str:
    listed = report.get("incident_list", [])
    total = report["rows"]["incidents"]
    by_kind = _table(
        ["kind", "severity", "incidents", "open", "evidence"],
        (
            [
                _e(r["kind"]),
                _severity_badge(r["severity"]),
                _int(r["incidents"]),
                _int(r["open"]),
                _int(r["evidence"]),
            ]
            for r in report["incidents"]
        ),
        numeric=(2, 3, 4),
        css="compact",
    )
    rows = (
        [
            _severity_badge(r["severity"]),
            _status_badge(r["status"]),
            _e(r["kind"]),
            _e(r["node"]) + (f'<div class="muted nowrap">GPU {_e(r["gpu"])}</div>' if r["gpu"] else ""),
            _time_cell(r["first_evidence"]),
            _time_cell(r["last_evidence"]),
            _int(r["evidence_count"]),
            _el("div", {"class": "action"}, _e(r["action"]))
            + _el("div", {"class": "muted summary"}, _e(_without_action(r["summary"]))),
        ]
        for r in listed
    )
    table = _table(
        [
            "severity",
            "status",
            "kind",
            "where",
            "first evidence",
            "last evidence",
            "evidence",
            "suggested action",
        ],
        rows,
        numeric=(6,),
        css="incidents",
    )
    note = (
        f"All {total:,} incidents, open ones first, most severe first, newest first."
        if len(listed) >= total
        else f"The first {len(listed):,} of {total:,} incidents (open first, most severe first, newest "
        "first); the rest with `faultstream query`."
    )
    return (
        f'<section id="incidents"><h2>Incidents</h2>{_incidents_over_time_chart(report)}'
        f'<div class="side-by-side"><div><h3>By kind and severity</h3>{by_kind}</div></div>'
        f'<h3>Incident list</h3><p class="note">{_e(note)}</p>{table}</section>'
    )


def _mttf_section(report: dict[str, Any]) -> str:
    parts = ['<section id="mttf"><h2>MTTF and failure rate</h2>']
    attribution = {bool(r["hardware"]): r for r in report.get("attribution", [])}
    if attribution:
        hw = attribution.get(True, {"jobs": 0, "gpu_hours": 0.0})
        other = attribution.get(False, {"jobs": 0, "gpu_hours": 0.0})
        parts.append(
            f'<p class="note">Job failures (FAILED / NODE_FAIL): {hw["jobs"]:,} attributed to hardware '
            f"({hw['gpu_hours']:,.0f} GPU-hours lost), {other['jobs']:,} not. Only hardware-attributed "
            "failures count in r_f and MTTF.</p>"
        )
    parts.append('<div class="grid-2">')
    parts.append(_rf_by_size_chart(report))
    parts.append(_mttf_by_size_chart(report))
    parts.append("</div>")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    for window in report.get("mttf", []):
        label = _window_label(window["window_seconds"])
        parts.append(_rf_over_time_chart(window, paper))
        parts.append(
            f"<h3>Windows of {_e(label)}: {window['windows']:,} windows from "
            f"{_e(_short_time(window['first']))} to {_e(_short_time(window['last']))}</h3>"
        )
        parts.append(
            _table(
                ["job size (GPUs)", "node-days", "GPU-hours", "jobs", "failed", "hw failures",
                 "r_f / 1000 nd", "median window r_f", "MTTF h"],
                (
                    [
                        _e(b["size_bucket"]), _num(b["node_hours"] / 24, 1), _num(b["gpu_hours"], 0),
                        _int(b["jobs_ended"]), _int(b["jobs_failed"]), _int(b["failures"]),
                        _num(b["rf_per_1000_node_days"]), _num(b["median_window_rf"]),
                        _num(b["mttf_hours"], 1),
                    ]
                    for b in window["buckets"]
                ),
                numeric=range(1, 9),
            )
        )  # fmt: skip
    if not report.get("mttf"):
        parts.append('<p class="empty">No MTTF windows in the store.</p>')
    parts.append("</section>")
    return "".join(parts)


def _ettr_section(report: dict[str, Any]) -> str:
    assumptions = report.get("ettr_assumptions") or {}
    rf = report.get("rf_per_1000_node_days")
    parts = ['<section id="ettr"><h2>ETTR guidance</h2>']
    if rf is None:
        parts.append(
            '<p class="empty">No hardware-attributed failures yet: r_f and MTTF are not defined.</p>'
        )
    else:
        parts.append(
            f'<p class="note">From the measured r_f = {rf:,.2f} per 1000 node-days, a checkpoint write of '
            f"{_e(assumptions.get('checkpoint_write_minutes'))} min and a restart cost of "
            f"{_e(assumptions.get('restart_overhead_minutes'))} min: E[ETTR] ≈ (1 - N·r_f·(u0 + Δt/2)) / "
            "(1 + w/Δt) at the interval Δt* = √(2w / (N·r_f)) that maximises it (Kokolis et al.).</p>"
        )
        parts.append('<div class="grid-2">')
        parts.append(
            "<div>"
            + _table(
                ["job GPUs", "projected MTTF h", "best checkpoint every (min)", "expected ETTR"],
                (
                    [
                        _int(g["gpus"]),
                        _num(g["projected_mttf_hours"]),
                        _num(g["optimal_checkpoint_minutes"], 1),
                        _num(g["expected_ettr"], 3),
                    ]
                    for g in report["ettr_guidance"]
                ),
                numeric=range(4),
            )
            + "</div>"
        )
        parts.append(_ettr_chart(report))
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)


def _lemon_section(report: dict[str, Any]) -> str:
    lemons = report.get("lemon_nodes", [])
    rows = (
        [
            _e(n["node"]) + (f'<div class="muted">{_e(n["cluster"])}</div>' if n.get("cluster") else ""),
            _status_badge(n["status"]),
            _time_cell(n["first_evidence"]),
            _time_cell(n["last_evidence"]),
            _int(n["verdicts"]),
            _num(n["score"], 1),
            (", ".join(f"{_e(k)} {_e(v)}" for k, v in sorted(n["signals"].items())) or "-")
            + (
                f'<div class="muted">as of {_e(_short_time(n["signals_at"]))}</div>'
                if n.get("signals_at")
                else ""
            ),
            _int(len(n["jobs_hurt"])),
            _e(n["action"]),
        ]
        for n in lemons
    )
    table = _table(
        ["node", "status", "flagged since", "last verdict", "verdicts", "score",
         "signals (last recorded verdict, 28 d)", "failed jobs", "suggested action"],
        rows,
        numeric=(4, 5, 7),
    )  # fmt: skip
    return (
        '<section id="lemons"><h2>Lemon nodes</h2><p class="note">Nodes whose failure signals sit far above '
        "the fleet's over a sliding window (the paper's method: XID days, hardware incidents, "
        "hardware-attributed and NODE_FAIL job failures, failed jobs). The paper found 1.2% of nodes were "
        f"lemons, touching 13% of daily jobs.</p>{table}</section>"
    )


def _xid_section(report: dict[str, Any]) -> str:
    rows = report.get("xid_mix", [])
    table = _table(
        ["XID", "name", "category", "severity", "hardware", "events", "nodes"],
        (
            [
                _e(r["xid"]), _e(r["name"]), _e(r["category"]), _severity_badge(r["severity"]),
                "yes" if r["hardware"] else "no", _int(r["events"]), _int(r["nodes"]),
            ]
            for r in rows
        ),
        numeric=(0, 5, 6),
    )  # fmt: skip
    return f'<section id="xids"><h2>XID mix</h2>{_xid_mix_chart(report)}{table}</section>'


def _dead_letter_section(report: dict[str, Any]) -> str:
    reasons = report.get("dead_letter_reasons", [])
    if not reasons:
        return ""
    table = _table(
        ["reason", "records"], ([_e(r["reason_class"]), _int(r["n"])] for r in reasons), numeric=(1,)
    )
    return f'<section id="dead-letters"><h2>Dead letters</h2>{table}</section>'


_CSS = """
:root { --fg:#1d2330; --muted:#5d6675; --line:#d9dee6; --bg:#f6f7f9; --card:#fff; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header { background:#1d2330; color:#fff; padding:18px 28px; }
header h1 { margin:0; font-size:22px; }
header p { margin:4px 0 0; color:#c5cbd6; }
nav { margin-top:8px; }
nav a { color:#9cc3ff; margin-right:14px; text-decoration:none; }
main { max-width:1180px; margin:0 auto; padding:8px 28px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:6px 20px 18px;
  margin:18px 0; }
h2 { font-size:18px; margin:14px 0 8px; }
h3 { font-size:14px; margin:16px 0 6px; }
.cards { display:grid; grid-template-columns:repeat(auto-fill, minmax(250px, 1fr)); gap:12px; }
.card { border:1px solid var(--line); border-radius:6px; padding:10px 12px; }
.card-title { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.card-value { font-size:20px; font-weight:600; margin:2px 0; }
.card-note { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; width:100%; font-size:13px; margin:6px 0 10px; }
table.compact { width:auto; }
th, td { border-bottom:1px solid var(--line); padding:5px 8px; text-align:left; vertical-align:top; }
th { background:#eef1f5; font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.empty, p.empty { color:var(--muted); font-style:italic; }
.muted { color:var(--muted); }
.nowrap { white-space:nowrap; }
.summary { font-size:12px; margin-top:2px; }
.action { font-weight:500; }
table.incidents td:last-child { width:48%; }
.badge { display:inline-block; padding:1px 7px; border-radius:10px; font-size:12px; color:#fff;
  background:#777; }
.badge.sev-critical { background:#C0392B; }
.badge.sev-warn { background:#B7791F; }
.badge.sev-info { background:#4A78A3; }
.status { font-size:12px; }
.status.open { color:#C0392B; font-weight:600; }
.status.resolved { color:var(--muted); }
figure.chart { margin:10px 0 16px; }
figure.chart svg { display:block; width:100%; height:auto; }
figcaption, p.note { color:var(--muted); font-size:12px; }
.grid-2 { display:grid; grid-template-columns:repeat(auto-fit, minmax(460px, 1fr)); gap:8px 24px;
  align-items:start; }
.legend { display:flex; flex-wrap:wrap; gap:4px 14px; font-size:12px; margin:2px 0 4px; }
.key { display:inline-flex; align-items:center; gap:5px; }
.swatch { display:inline-block; width:14px; height:10px; background:var(--c); }
.swatch.line { height:3px; }
.swatch.dash { height:0; background:none; border-top:2px dashed var(--c); }
svg text { font:11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; fill:#333; }
svg .tick, svg .axis-title { fill:#5d6675; }
svg .value { fill:#1d2330; }
svg .muted { fill:#8a93a3; }
svg .grid { stroke:#e6e9ee; }
svg .axis { stroke:#8a93a3; }
svg .window-bar { fill:#BBBBBB; }
svg .clipped { fill:#777; }
svg .cumulative { fill:none; stroke-width:1.8; }
svg .cumulative.all { stroke-width:2.8; }
svg .ref, svg .ref-line { fill:none; stroke:#333; stroke-width:1.3; }
svg .ref-label { fill:#333; }
svg .ref-point { fill:#fff; stroke:#333; stroke-width:1.3; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:12px; }
@media print { body { background:#fff; } section { break-inside:avoid; border:none; } }
"""

#: Nothing may be fetched: no script, font, image or frame; only the inline styles.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


def render_html(report: dict[str, Any]) -> str:
    """The report as a self-contained HTML page (a string)."""
    span = report.get("time_span") or {}
    subtitle = (
        f"Store {report.get('store') or report['database']} (database {report['database']}) · "
        f"{_short_time(span.get('first'))} to {_short_time(span.get('last'))} UTC"
    )
    sections = [
        _summary_section(report),
        _incidents_section(report),
        _mttf_section(report),
        _ettr_section(report),
        _lemon_section(report),
        _xid_section(report),
        _dead_letter_section(report),
    ]
    nav = "".join(
        f'<a href="#{anchor}">{_e(label)}</a>'
        for anchor, label in (
            ("summary", "Summary"),
            ("incidents", "Incidents"),
            ("mttf", "MTTF / r_f"),
            ("ettr", "ETTR"),
            ("lemons", "Lemon nodes"),
            ("xids", "XID mix"),
        )
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>faultstream report · {_e(report['database'])}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>faultstream reliability report</h1><p>{_e(subtitle)}</p><nav>{nav}</nav></header>"
        f"<main>{''.join(sections)}</main>"
        f"<footer>Generated {_e(report.get('generated', ''))} UTC by faultstream report --html. "
        "Reference rates: Kokolis et al., “Revisiting Reliability in Large-Scale Machine Learning "
        "Research Clusters” (HPCA 2025).</footer></body></html>\n"
    )


def check_writable(path: Path) -> None:
    """Raise ``ValueError`` saying why ``path`` cannot be written (checked before the queries run)."""
    if path.is_dir():
        raise ValueError(f"--html {path}: is a folder; name the file to write")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"--html {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--html {path}: folder {folder} is not writable")


def write_html(report: dict[str, Any], path: Path) -> int:
    """Render ``report`` and write it to ``path`` atomically (a reader never sees half a page); the size.

    A write that fails raises ``ValueError`` with the reason, and leaves no partial file behind.
    """
    check_writable(path)
    data = render_html(report).encode()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ValueError(f"--html {path}: cannot write: {exc.strerror or exc}") from None
    return len(data)
