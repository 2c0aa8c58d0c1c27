"""``faultstream report --html``: the page assembly, and writing it to its file.

The page is drawn from the plain data of :func:`stream.reports.text.build_report` (what ``--json``
prints): inline CSS, inline SVG charts (:mod:`stream.reports.html.charts`), no script, no web font,
no link to anything outside the file — a Content-Security-Policy in the page forbids fetching
anything at all. Every text that comes from the store is escaped (``html.escape``) before it goes
into the page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stream.reports.html.markup import escape, short_time
from stream.reports.html.sections import (
    dead_letter_section,
    ettr_section,
    incidents_section,
    lemon_section,
    mttf_section,
    summary_section,
    xid_section,
)

__all__ = ["check_writable", "render_html", "write_html"]

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
    """The report as a self-contained HTML page (a string).

    Parameters
    ----------
    report
        The plain data of :func:`stream.reports.text.build_report`; it is not changed.

    Returns
    -------
    str
        The whole document, from ``<!DOCTYPE html>`` to a final newline.
    """
    span = report.get("time_span") or {}
    subtitle = (
        f"Store {report.get('store') or report['database']} (database {report['database']}) · "
        f"{short_time(span.get('first'))} to {short_time(span.get('last'))} UTC"
    )
    sections = [
        summary_section(report),
        incidents_section(report),
        mttf_section(report),
        ettr_section(report),
        lemon_section(report),
        xid_section(report),
        dead_letter_section(report),
    ]
    nav = "".join(
        f'<a href="#{anchor}">{escape(label)}</a>'
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
        f"<title>faultstream report · {escape(report['database'])}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>faultstream reliability report</h1><p>{escape(subtitle)}</p><nav>{nav}</nav></header>"
        f"<main>{''.join(sections)}</main>"
        f"<footer>Generated {escape(report.get('generated', ''))} UTC by faultstream report --html. "
        "Reference rates: Kokolis et al., “Revisiting Reliability in Large-Scale Machine Learning "
        "Research Clusters” (HPCA 2025).</footer></body></html>\n"
    )


def check_writable(path: Path) -> None:
    """Raise ``ValueError`` saying why ``path`` cannot be written (checked before the queries run).

    Parameters
    ----------
    path
        The page's file (``--html``): not a folder, in a folder that exists and is writable.

    Raises
    ------
    ValueError
        With the reason, worded for the ``--html`` option.
    """
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

    Parameters
    ----------
    report
        The plain data of :func:`stream.reports.text.build_report`.
    path
        The file to write (replaced whole if it exists).

    Returns
    -------
    int
        The page's size in bytes.

    Raises
    ------
    ValueError
        If ``path`` cannot be written (see :func:`check_writable`) or the write fails.
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
