"""The page's sections: summary cards, incidents, MTTF and r_f, ETTR, lemon nodes, XID mix, dead letters.

Each section is a function from the report data to one ``<section id=...>`` (HTML text); the
charts come from :mod:`stream.reports.html.charts`. Table cells are escaped here, one by one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from stream.reports.html.charts import (
    SEVERITIES,
    ettr_chart,
    fleet_mtbf_chart,
    incidents_over_time_chart,
    mttf_by_size_chart,
    rf_by_size_chart,
    rf_over_time_chart,
    xid_mix_chart,
)
from stream.reports.html.markup import (
    element,
    escape,
    format_count,
    format_number,
    parse_time,
    short_time,
    window_label,
)

__all__ = [
    "dead_letter_section",
    "ettr_section",
    "incidents_section",
    "lemon_section",
    "mttf_section",
    "summary_section",
    "xid_section",
]


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Iterable[int] = (), css: str = ""
) -> str:
    """A table whose cells are already HTML (escape them first); the ``numeric`` columns align right."""
    right = set(numeric)

    def cell(tag: str, i: int, content: str) -> str:
        return f'<{tag} class="num">{content}</{tag}>' if i in right else f"<{tag}>{content}</{tag}>"

    head = "".join(cell("th", i, escape(h)) for i, h in enumerate(headers))
    body = ["<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows]
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="empty">none</td></tr>')
    css_attr = f' class="{escape(css)}"' if css else ""
    return f"<table{css_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _severity_badge(severity: str) -> str:
    css = severity if severity in SEVERITIES else "other"
    return f'<span class="badge sev-{css}">{escape(severity)}</span>'


def _status_badge(status: str) -> str:
    css = "open" if status != "resolved" else "resolved"
    return f'<span class="status {css}">{escape(status)}</span>'


def _time_cell(text: str | None) -> str:
    """A timestamp as date over time of day."""
    short = short_time(text)
    day, _, clock = short.partition(" ")
    return f'<span class="nowrap">{escape(day)}</span>' + (
        f'<div class="muted">{escape(clock)}</div>' if clock else ""
    )


def _without_action(summary: str) -> str:
    """An incident summary without its trailing ``Action: ...`` (the table shows the action)."""
    return summary.split(" Action: ", 1)[0]


def _span_text(span: dict[str, Any]) -> str:
    first, last = span.get("first"), span.get("last")
    if not first or not last:
        return "-"
    days = (parse_time(last) - parse_time(first)).total_seconds() / 86400
    return f"{days:,.1f} days"


def summary_section(report: dict[str, Any]) -> str:
    """The summary cards: span, row counts, incidents, hardware failures, r_f, lemons, dead letters.

    Parameters
    ----------
    report
        The report data (:func:`stream.reports.text.build_report`).

    Returns
    -------
    str
        ``<section id="summary">``.
    """
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
            f"{short_time(span.get('first'))} → {short_time(span.get('last'))} UTC (event time)",
        ),
        ("XID events", format_count(rows["xid_events"]), f"{len(report.get('xid_mix', []))} distinct codes"),
        (
            "Job events",
            format_count(rows["job_events"]),
            f"{format_count(rows['ecc_samples'])} ECC samples (downsampled)",
        ),
        (
            "Incidents",
            format_count(rows["incidents"]),
            f"{open_incidents:,} open, {open_critical:,} open critical",
        ),
        (
            "Hardware job failures",
            format_count(hardware["jobs"]),
            f"{hardware['gpu_hours']:,.0f} GPU-hours lost; {other['jobs']:,} other failures",
        ),
        ("r_f per 1000 node-days", format_number(rf), f"paper: {paper}"),
        (
            "Lemon nodes",
            format_count(len(lemons)),
            ", ".join(n["node"] for n in lemons[:6]) or "none flagged",
        ),
        ("Dead letters", format_count(rows["dead_letters"]), "records that could not be used"),
    ]
    items = "".join(
        f'<div class="card"><div class="card-title">{escape(t)}</div>'
        f'<div class="card-value">{escape(v)}</div><div class="card-note">{escape(n)}</div></div>'
        for t, v, n in cards
    )
    return f'<section id="summary"><h2>Summary</h2><div class="cards">{items}</div></section>'


def incidents_section(report: dict[str, Any]) -> str:
    """Incidents: the chart over time, the counts by kind and severity, and the incident list.

    Parameters
    ----------
    report
        The report data; reads ``incidents``, ``incident_list`` and ``incidents_over_time``.

    Returns
    -------
    str
        ``<section id="incidents">``; the list says whether it is all the incidents or the first ones.
    """
    listed = report.get("incident_list", [])
    total = report["rows"]["incidents"]
    by_kind = _table(
        ["kind", "severity", "incidents", "open", "evidence"],
        (
            [
                escape(r["kind"]),
                _severity_badge(r["severity"]),
                format_count(r["incidents"]),
                format_count(r["open"]),
                format_count(r["evidence"]),
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
            escape(r["kind"]),
            escape(r["node"])
            + (f'<div class="muted nowrap">GPU {escape(r["gpu"])}</div>' if r["gpu"] else ""),
            _time_cell(r["first_evidence"]),
            _time_cell(r["last_evidence"]),
            format_count(r["evidence_count"]),
            element("div", {"class": "action"}, escape(r["action"]))
            + element("div", {"class": "muted summary"}, escape(_without_action(r["summary"]))),
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
        f'<section id="incidents"><h2>Incidents</h2>{incidents_over_time_chart(report)}'
        f'<div class="side-by-side"><div><h3>By kind and severity</h3>{by_kind}</div></div>'
        f'<h3>Incident list</h3><p class="note">{escape(note)}</p>{table}</section>'
    )


def mttf_section(report: dict[str, Any]) -> str:
    """MTTF and failure rate: attribution, r_f and MTTF by size, then each window length's chart and table.

    Parameters
    ----------
    report
        The report data; reads ``attribution``, ``mttf`` and ``paper_rf_per_1000_node_days``.

    Returns
    -------
    str
        ``<section id="mttf">``.
    """
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
    parts.append(fleet_mtbf_chart(report))
    parts.append('<div class="grid-2">')
    parts.append(rf_by_size_chart(report))
    parts.append(mttf_by_size_chart(report))
    parts.append("</div>")
    paper = report.get("paper_rf_per_1000_node_days") or {}
    for window in report.get("mttf", []):
        label = window_label(window["window_seconds"])
        parts.append(rf_over_time_chart(window, paper))
        parts.append(
            f"<h3>Windows of {escape(label)}: {window['windows']:,} windows from "
            f"{escape(short_time(window['first']))} to {escape(short_time(window['last']))}</h3>"
        )
        parts.append(
            _table(
                ["job size (GPUs)", "node-days", "GPU-hours", "jobs", "failed", "hw failures",
                 "r_f / 1000 nd", "median window r_f", "MTTF h"],
                (
                    [
                        escape(b["size_bucket"]), format_number(b["node_hours"] / 24, 1),
                        format_number(b["gpu_hours"], 0), format_count(b["jobs_ended"]),
                        format_count(b["jobs_failed"]), format_count(b["failures"]),
                        format_number(b["rf_per_1000_node_days"]), format_number(b["median_window_rf"]),
                        format_number(b["mttf_hours"], 1),
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


def ettr_section(report: dict[str, Any]) -> str:
    """ETTR guidance: the formula with the assumptions, then the table and chart per reference job size.

    Parameters
    ----------
    report
        The report data; reads ``rf_per_1000_node_days``, ``ettr_assumptions`` and ``ettr_guidance``.

    Returns
    -------
    str
        ``<section id="ettr">``; without a measured r_f, a sentence saying ETTR is not defined.
    """
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
            f"{escape(assumptions.get('checkpoint_write_minutes'))} min and a restart cost of "
            f"{escape(assumptions.get('restart_overhead_minutes'))} min: E[ETTR] ≈ (1 - N·r_f·(u0 + Δt/2)) / "
            "(1 + w/Δt) at the interval Δt* = √(2w / (N·r_f)) that maximises it (Kokolis et al.).</p>"
        )
        parts.append('<div class="grid-2">')
        parts.append(
            "<div>"
            + _table(
                ["job GPUs", "projected MTTF h", "best checkpoint every (min)", "expected ETTR"],
                (
                    [
                        format_count(g["gpus"]),
                        format_number(g["projected_mttf_hours"]),
                        format_number(g["optimal_checkpoint_minutes"], 1),
                        format_number(g["expected_ettr"], 3),
                    ]
                    for g in report["ettr_guidance"]
                ),
                numeric=range(4),
            )
            + "</div>"
        )
        parts.append(ettr_chart(report))
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)


def lemon_section(report: dict[str, Any]) -> str:
    """Lemon nodes: one row per flagged node with its signals, the jobs it hurt and the action.

    Parameters
    ----------
    report
        The report data; reads ``lemon_nodes``.

    Returns
    -------
    str
        ``<section id="lemons">``.
    """
    lemons = report.get("lemon_nodes", [])
    rows = (
        [
            escape(n["node"])
            + (f'<div class="muted">{escape(n["cluster"])}</div>' if n.get("cluster") else ""),
            _status_badge(n["status"]),
            _time_cell(n["first_evidence"]),
            _time_cell(n["last_evidence"]),
            format_count(n["verdicts"]),
            format_number(n["score"], 1),
            (", ".join(f"{escape(k)} {escape(v)}" for k, v in sorted(n["signals"].items())) or "-")
            + (
                f'<div class="muted">as of {escape(short_time(n["signals_at"]))}</div>'
                if n.get("signals_at")
                else ""
            ),
            format_count(len(n["jobs_hurt"])),
            escape(n["action"]),
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


def xid_section(report: dict[str, Any]) -> str:
    """The XID mix: the chart by code and a table of every code.

    Parameters
    ----------
    report
        The report data; reads ``xid_mix``.

    Returns
    -------
    str
        ``<section id="xids">``.
    """
    rows = report.get("xid_mix", [])
    table = _table(
        ["XID", "name", "category", "severity", "hardware", "events", "nodes"],
        (
            [
                escape(r["xid"]), escape(r["name"]), escape(r["category"]), _severity_badge(r["severity"]),
                "yes" if r["hardware"] else "no", format_count(r["events"]), format_count(r["nodes"]),
            ]
            for r in rows
        ),
        numeric=(0, 5, 6),
    )  # fmt: skip
    return f'<section id="xids"><h2>XID mix</h2>{xid_mix_chart(report)}{table}</section>'


def dead_letter_section(report: dict[str, Any]) -> str:
    """Dead letters by reason, or nothing if there are none.

    Parameters
    ----------
    report
        The report data; reads ``dead_letter_reasons``.

    Returns
    -------
    str
        ``<section id="dead-letters">``, or the empty text.
    """
    reasons = report.get("dead_letter_reasons", [])
    if not reasons:
        return ""
    table = _table(
        ["reason", "records"],
        ([escape(r["reason_class"]), format_count(r["n"])] for r in reasons),
        numeric=(1,),
    )
    return f'<section id="dead-letters"><h2>Dead letters</h2>{table}</section>'
