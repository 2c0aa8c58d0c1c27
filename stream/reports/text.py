"""``faultstream report``: incidents, MTTF, failure rate and ETTR guidance, read from any store."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from detectors.mttf import ettr, optimal_checkpoint_interval_hours, projected_mttf_hours
from schemas.outputs import IncidentKind
from stream.reports.fleet import choose_fleet_window, fleet_lines, fleet_reliability
from stream.settings import Settings
from stream.sinks.store import query_rows, redact_dsn

__all__ = [
    "LEMON_KIND",
    "PAPER_RF",
    "REPORT_STEPS",
    "build_report",
    "choose_mttf_windows",
    "render_text",
    "window_label",
]

#: The paper's measured rates (failures per 1000 node-days), shown for comparison.
PAPER_RF = {"RSC-1 (16k A100)": 6.50, "RSC-2 (8k A100)": 2.34}

#: The incident kind of a lemon-node verdict (``detectors.core``, ``_evaluate_lemons``).
LEMON_KIND = IncidentKind.LEMON_NODE

#: What ``build_report`` reads, in order; its ``progress`` callback gets each name as it starts.
REPORT_STEPS = (
    "row counts",
    "time span",
    "fleet reliability",
    "incidents",
    "incidents over time",
    "lemon nodes",
    "XID mix",
    "dead letters",
    "remediations",
    "job attribution",
    "MTTF windows",
)

#: At most this many points per MTTF time series: longer histories are summed into coarser bins.
MAX_SERIES_POINTS = 400

_SEVERITY_ORDER = "multiIf(severity = 'critical', 0, severity = 'warn', 1, 2)"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _ts(epoch_seconds: int | None) -> str | None:
    """Epoch seconds as the report's time format (``str`` of a UTC datetime, like the other fields)."""
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _incident_bin_seconds(span_seconds: int) -> int:
    """Bin width of the incidents-over-time histogram: hours, days or weeks by the span shown."""
    if span_seconds <= 3 * 86400:
        return 3600
    if span_seconds <= 180 * 86400:
        return 86400
    return 7 * 86400


def _incidents_over_time(client: Client, db: str, span: dict[str, Any]) -> dict[str, Any]:
    """Incidents counted by the bin of their first evidence and by severity, every bin listed."""
    rows = query_rows(
        client,
        f"""SELECT toUnixTimestamp(minOrNull(first_evidence)) AS lo,
               toUnixTimestamp(maxOrNull(first_evidence)) AS hi
        FROM {db}.incidents FINAL""",
    )
    lo = min((v for v in (rows[0]["lo"], span["first_epoch"]) if v is not None), default=None)
    hi = max((v for v in (rows[0]["hi"], span["last_epoch"]) if v is not None), default=None)
    if lo is None or hi is None:
        return {"bin_seconds": None, "bins": []}
    width = _incident_bin_seconds(hi - lo)
    counts: dict[int, dict[str, int]] = {}
    for row in query_rows(
        client,
        f"""SELECT toUnixTimestamp(toStartOfInterval(first_evidence, toIntervalSecond({width}))) AS start,
               severity, count() AS n
        FROM {db}.incidents FINAL GROUP BY start, severity""",
    ):
        counts.setdefault(row["start"], {})[row["severity"]] = row["n"]
    first = lo - lo % width
    bins = []
    for start in range(first, max([hi, *counts]) + 1, width):
        by_severity = counts.get(start, {})
        bins.append(
            {
                "start": _ts(start),
                "critical": by_severity.get("critical", 0),
                "warn": by_severity.get("warn", 0),
                "info": by_severity.get("info", 0),
            }
        )
    return {"bin_seconds": width, "bins": bins}


def _lemon_nodes(client: Client, db: str) -> list[dict[str, Any]]:
    """Lemon-node incidents, current first, with the signals of their latest recorded verdict."""
    lemons = []
    for row in query_rows(
        client,
        f"""SELECT incident_id, cluster, node, status, first_evidence, last_evidence, score,
               evidence_count, evidence, action
        FROM {db}.incidents FINAL WHERE kind = '{LEMON_KIND}'
        ORDER BY status = 'resolved', last_evidence DESC, incident_id""",
    ):
        try:
            evidence = orjson.loads(row.pop("evidence") or "{}")
        except orjson.JSONDecodeError:
            evidence = {}
        samples = [s for s in evidence.get("samples", []) if isinstance(s, dict)]
        latest = samples[-1] if samples else {}
        verdicts = row.pop("evidence_count")
        lemons.append(
            {
                **row,
                "first_evidence": str(row["first_evidence"]),
                "last_evidence": str(row["last_evidence"]),
                "verdicts": verdicts,
                "signals": latest.get("counter_deltas", {}),
                "signals_at": latest.get("ts"),
                "jobs_hurt": evidence.get("jobs", []),
            }
        )
    return lemons


def _mttf_series(client: Client, db: str, window_seconds: int, windows: int) -> dict[str, Any]:
    """Exposure and failures per window (or per bin of several windows) and size bucket, in time order."""
    width = window_seconds * max(1, math.ceil(windows / MAX_SERIES_POINTS))
    points = query_rows(
        client,
        f"""SELECT toUnixTimestamp(toStartOfInterval(window_start, toIntervalSecond({width}))) AS start,
               size_bucket, sum(node_hours) AS node_hours, sum(failures) AS failures
        FROM {db}.mttf_windows WHERE window_seconds = {int(window_seconds)}
        GROUP BY start, size_bucket ORDER BY start, size_bucket""",
    )
    for point in points:
        point["start"] = _ts(point["start"])
    return {"bin_seconds": width, "points": points}


def _ettr_note(
    expected: float, mttf_hours: float | None, checkpoint_minutes: float, restart_minutes: float
) -> str | None:
    """Why a job size makes little or no progress, in words (``None`` when it trains normally).

    >>> _ettr_note(0.0, 0.1, 4.9, 10.0)
    'no progress: a failure every 6 min, a restart takes 10 min'
    """
    if mttf_hours is None or expected >= 0.5:
        return None
    every = f"a failure every {_duration(mttf_hours * 60)}"
    if expected <= 0:
        if mttf_hours * 60 <= restart_minutes:
            return f"no progress: {every}, a restart takes {_duration(restart_minutes)}"
        lost = _duration(restart_minutes + checkpoint_minutes / 2)
        return f"no progress: {every}, each costs {lost} (restart + half a checkpoint interval)"
    return f"under half the time trains: {every}"


def _duration(minutes: float) -> str:
    """Minutes as a short duration: ``45 s``, ``6 min``, ``2.5 h``."""
    if minutes < 1:
        return f"{minutes * 60:.0f} s"
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h"


def build_report(
    client: Client,
    settings: Settings,
    top: int = 20,
    *,
    incident_limit: int = 200,
    progress: Callable[[str], None] | None = None,
    fleet_window: str = "auto",
) -> dict[str, Any]:
    """Query the store and return the report as plain data (what ``--json`` prints).

    ``top`` open critical incidents are listed in ``open_critical`` (the text report), and up to
    ``incident_limit`` incidents of every kind in ``incident_list`` (open critical first). ``progress``
    is called with each name of ``REPORT_STEPS`` as that step starts.
    """
    step = progress or (lambda _name: None)
    db = settings.database
    step("row counts")
    counts = {
        table: query_rows(client, f"SELECT count() AS n FROM {db}.{table} FINAL")[0]["n"]
        for table in (
            "xid_events",
            "job_events",
            "ecc_samples",
            "incidents",
            "job_attributions",
            "dead_letters",
        )
    }
    step("time span")
    [span_row] = query_rows(
        client,
        f"""SELECT toUnixTimestamp(minOrNull(ts)) AS first_epoch, toUnixTimestamp(maxOrNull(ts)) AS last_epoch
        FROM (SELECT ts FROM {db}.xid_events UNION ALL SELECT ts FROM {db}.job_events
              UNION ALL SELECT ts FROM {db}.ecc_samples)""",
    )
    span = {
        "first": _ts(span_row["first_epoch"]),
        "last": _ts(span_row["last_epoch"]),
        **span_row,
    }
    step("fleet reliability")
    first_s, last_s = span_row["first_epoch"], span_row["last_epoch"]
    span_days = (last_s - first_s) / 86_400 if first_s is not None and last_s is not None else None
    calendar = choose_fleet_window(fleet_window, span_days)
    fleet = fleet_reliability(client, db, calendar, first_s, last_s, settings.quiet_period_seconds)
    step("incidents")
    incidents = query_rows(
        client,
        f"""SELECT kind, severity, count() AS incidents, countIf(status != 'resolved') AS open,
               sum(evidence_count) AS evidence
        FROM {db}.incidents FINAL GROUP BY kind, severity
        ORDER BY multiIf(severity = 'critical', 0, severity = 'warn', 1, 2), incidents DESC, kind""",
    )
    open_critical = query_rows(
        client,
        f"""SELECT incident_id, kind, node, gpu, first_evidence, evidence_count, summary
        FROM {db}.incidents FINAL WHERE severity = 'critical' AND status != 'resolved'
        ORDER BY first_evidence DESC, incident_id LIMIT {int(top)}""",
    )
    for row in open_critical:
        row["first_evidence"] = str(row["first_evidence"])
    incident_list = query_rows(
        client,
        f"""SELECT incident_id, kind, severity, status, cluster, node, gpu, first_evidence, last_evidence,
               detector, score, evidence_count, action, summary
        FROM {db}.incidents FINAL
        ORDER BY status = 'resolved', {_SEVERITY_ORDER}, last_evidence DESC, incident_id
        LIMIT {int(incident_limit)}""",
    )
    for row in incident_list:
        row["first_evidence"] = str(row["first_evidence"])
        row["last_evidence"] = str(row["last_evidence"])
    step("incidents over time")
    over_time = _incidents_over_time(client, db, span)
    step("lemon nodes")
    lemons = _lemon_nodes(client, db)
    step("XID mix")
    xid_mix = query_rows(
        client,
        f"""SELECT xid, any(xid_name) AS name, any(category) AS category, any(severity) AS severity,
               max(hardware) AS hardware, count() AS events, uniqExact(node) AS nodes
        FROM {db}.xid_events FINAL GROUP BY xid ORDER BY events DESC, xid""",
    )
    step("dead letters")
    dead_letters = query_rows(
        client,
        f"""SELECT substring(splitByString(' (', reason)[1], 1, 100) AS reason_class, count() AS n
        FROM {db}.dead_letters FINAL GROUP BY reason_class ORDER BY n DESC LIMIT 10""",
    )
    step("remediations")
    remediations = {
        "outcomes": query_rows(
            client,
            f"SELECT outcome, count() AS n FROM {db}.remediations GROUP BY outcome ORDER BY n DESC, outcome",
        ),
        "recent": query_rows(
            client,
            f"""SELECT toString(decided) AS decided, node, kind, incident_id, outcome, reason
            FROM {db}.remediations WHERE outcome != 'skipped' ORDER BY decided DESC LIMIT 10""",
        ),
    }
    step("job attribution")
    attribution = query_rows(
        client,
        f"""SELECT hardware, count() AS jobs, sum(gpu_hours) AS gpu_hours
        FROM {db}.job_attributions FINAL GROUP BY hardware ORDER BY hardware""",
    )
    step("MTTF windows")
    windows = []
    for window in query_rows(
        client,
        f"""SELECT window_seconds, uniqExact(window_start) AS windows, min(window_start) AS first,
               max(window_end) AS last
        FROM {db}.mttf_windows WHERE size_bucket = 'all' GROUP BY window_seconds ORDER BY window_seconds""",
    ):
        seconds = window["window_seconds"]
        buckets = query_rows(
            client,
            f"""SELECT size_bucket, min(size_bucket_min_gpus) AS min_gpus, sum(node_hours) AS node_hours,
                   sum(gpu_hours) AS gpu_hours, sum(job_hours) AS job_hours, sum(jobs_ended) AS jobs_ended,
                   sum(jobs_failed) AS jobs_failed, sum(failures) AS failures,
                   quantileExact(0.5)(rf_per_1000_node_days) AS median_window_rf
            FROM {db}.mttf_windows WHERE window_seconds = {int(seconds)}
            GROUP BY size_bucket ORDER BY size_bucket = 'all', min_gpus""",
        )
        for bucket in buckets:
            node_days = bucket["node_hours"] / 24
            failures = bucket["failures"]
            bucket["rf_per_1000_node_days"] = 1000 * failures / node_days if node_days else None
            bucket["mttf_hours"] = bucket["job_hours"] / failures if failures else None
            median = bucket.pop("median_window_rf")
            bucket["median_window_rf"] = median if median is not None and math.isfinite(median) else None
            # job_hours / failures is the MTTF of this bucket's average job of this many nodes
            job_hours = bucket["job_hours"]
            bucket["mean_job_nodes"] = bucket["node_hours"] / job_hours if job_hours else None
        windows.append(
            {
                "window_seconds": seconds,
                "windows": window["windows"],
                "first": str(window["first"]),
                "last": str(window["last"]),
                "buckets": buckets,
                "series": _mttf_series(client, db, seconds, window["windows"]),
            }
        )
    overall = next((b for w in windows[-1:] for b in w["buckets"] if b["size_bucket"] == "all"), None)
    rf_per_1000 = overall["rf_per_1000_node_days"] if overall else None
    guidance = []
    if rf_per_1000:
        rf_per_day = rf_per_1000 / 1000
        w_cp = settings.checkpoint_write_minutes / 60
        u0 = settings.restart_overhead_minutes / 60
        for gpus in settings.reference_sizes:
            interval = optimal_checkpoint_interval_hours(gpus, rf_per_day, w_cp, settings.gpus_per_node)
            mttf = _finite(projected_mttf_hours(gpus, rf_per_day, settings.gpus_per_node))
            expected = ettr(gpus, rf_per_day, interval, w_cp, u0, settings.gpus_per_node)
            guidance.append(
                {
                    "gpus": gpus,
                    "projected_mttf_hours": mttf,
                    "optimal_checkpoint_minutes": _finite(interval * 60),
                    "expected_ettr": expected,
                    "note": _ettr_note(expected, mttf, interval * 60, settings.restart_overhead_minutes),
                }
            )
    return {
        "database": db,
        "store": redact_dsn(settings.dsn),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "time_span": {"first": span["first"], "last": span["last"]},
        "rows": counts,
        "incidents": incidents,
        "open_critical": open_critical,
        "incident_list": incident_list,
        "incidents_over_time": over_time,
        "lemon_nodes": lemons,
        "xid_mix": xid_mix,
        "dead_letter_reasons": dead_letters,
        "remediations": remediations,
        "fleet": fleet,
        "attribution": attribution,
        "mttf": windows,
        "rf_per_1000_node_days": rf_per_1000,
        "paper_rf_per_1000_node_days": PAPER_RF,
        "ettr_guidance": guidance,
        "ettr_assumptions": {
            "checkpoint_write_minutes": settings.checkpoint_write_minutes,
            "restart_overhead_minutes": settings.restart_overhead_minutes,
        },
    }


def _num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _table(
    headers: list[str], rows: list[list[str]], left: frozenset[int] | set[int] = frozenset({0})
) -> list[str]:
    """Columns padded to their widest cell: the ``left`` ones left-aligned, the others (numbers) right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(headers), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


#: The MTTF windows the text report shows by default: the longest window that still cuts the span
#: into at least this many (1 d windows for weeks of data, 1 h windows for a day or two).
MIN_WINDOWS_SHOWN = 7

#: Open incidents listed by name in the text report (the rest: ``--json``, ``--html``).
OPEN_INCIDENTS_SHOWN = 5


def window_label(seconds: int) -> str:
    """A window length as the report and ``--mttf-window`` spell it.

    >>> window_label(86400), window_label(3600), window_label(90)
    ('1d', '1h', '90s')
    """
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def choose_mttf_windows(windows: list[dict[str, Any]], choice: str = "auto") -> list[dict[str, Any]]:
    """The MTTF windows to print: ``auto`` (one, fitting the span), ``all``, or one length (``1h``).

    Every window length sums the same exposure and failures; they differ in how finely the time
    series and the per-window median cut the span, so one table is enough for a first look.
    """
    if choice == "all" or not windows:
        return windows
    if choice == "auto":
        fitting = [w for w in windows if w["windows"] >= MIN_WINDOWS_SHOWN]
        return [max(fitting, key=lambda w: w["window_seconds"]) if fitting else windows[0]]
    chosen = [w for w in windows if window_label(w["window_seconds"]) == choice]
    if not chosen:
        known = ", ".join(window_label(w["window_seconds"]) for w in windows)
        raise ValueError(f"--mttf-window {choice}: the store has MTTF windows of {known} (or auto, all)")
    return chosen


def _span_days(report: dict[str, Any]) -> float | None:
    span = report["time_span"]
    if not span.get("first") or not span.get("last"):
        return None
    first, last = (datetime.fromisoformat(span[k]) for k in ("first", "last"))
    return (last - first).total_seconds() / 86400


def _health(report: dict[str, Any]) -> list[str]:
    """Is the cluster healthy: its failure rate beside the paper's, and what failures cost."""
    out = []
    rate = report["rf_per_1000_node_days"]
    if rate is not None:
        paper = report["paper_rf_per_1000_node_days"]
        worst = max(paper.values())
        verdict = (
            f"{rate / worst:.1f}x the paper's worst cluster" if rate > worst else "within the paper's range"
        )
        out.append(
            f"Failure rate r_f = {rate:.2f} per 1000 node-days, {verdict} "
            f"({', '.join(f'{name} {value:.2f}' for name, value in paper.items())})"
        )
    else:
        out.append("No hardware-attributed job failures yet: r_f and MTTF are not defined.")
    attribution = {bool(r["hardware"]): r for r in report["attribution"]}
    if attribution:
        hw = attribution.get(True, {"jobs": 0, "gpu_hours": 0.0})
        other = attribution.get(False, {"jobs": 0, "gpu_hours": 0.0})
        out.append(
            f"Job failures (FAILED/NODE_FAIL): {hw['jobs']:,} of {hw['jobs'] + other['jobs']:,} attributed "
            f"to hardware, {hw['gpu_hours']:,.0f} GPU-hours lost"
        )
    return out


def _what_broke(report: dict[str, Any]) -> list[str]:
    """Incidents by kind and severity, and the nodes with the most critical ones."""
    rows = report["rows"]
    out = [f"Incidents ({rows['incidents']:,})"]
    out.extend(
        "  " + line
        for line in _table(
            ["kind", "severity", "incidents", "open", "evidence"],
            [
                [r["kind"], r["severity"], f"{r['incidents']:,}", f"{r['open']:,}", f"{r['evidence']:,}"]
                for r in report["incidents"]
            ],
        )
    )
    critical: dict[str, int] = {}
    for incident in report["incident_list"]:
        if incident["severity"] == "critical":
            critical[incident["node"]] = critical.get(incident["node"], 0) + 1
    if critical:
        top = sorted(critical.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{node} ({n})" for node, n in top[:6])
        more = f", {len(top) - 6} more" if len(top) > 6 else ""
        out.append(f"  Critical incidents by node: {shown}{more}")
    return out


def _what_to_do(report: dict[str, Any]) -> list[str]:
    """Open incidents, most severe first, each with its suggested action."""
    open_now = [i for i in report["incident_list"] if i["status"] != "resolved" and i["severity"] != "info"]
    if not open_now:
        return ["Nothing to do: no critical or warn incident is open."]
    out = [f"Open incidents: what to do ({len(open_now):,}, most severe first)"]
    for incident in open_now[:OPEN_INCIDENTS_SHOWN]:
        gpu = incident["gpu"]
        where = f"{incident['node']}{f'/{gpu}' if gpu else ''}"
        out.append(
            f"  {incident['severity']} {incident['kind']} on {where}, {incident['status']}, "
            f"since {incident['first_evidence'][:16]}"
        )
        out.append(f"    -> {incident['action'] or '-'}")
    if len(open_now) > OPEN_INCIDENTS_SHOWN:
        out.append(
            f"  ... {len(open_now) - OPEN_INCIDENTS_SHOWN:,} more: faultstream report --json or --html"
        )
    return out


def _mttf_table(window: dict[str, Any], others: list[str]) -> list[str]:
    """One MTTF table; the per-window median r_f only when most windows saw a failure (else it is 0)."""
    label = window_label(window["window_seconds"])
    other = f" (other lengths: --mttf-window {', '.join(others)})" if others else ""
    out = [
        f"MTTF by job size, {label} windows: {window['windows']:,} from {window['first']} "
        f"to {window['last']}{other}"
    ]
    median = any(b["median_window_rf"] for b in window["buckets"])
    headers = ["job size (GPUs)", "node-days", "GPU-hours", "jobs", "failed", "hw failures", "r_f/1000 nd"]
    headers += ["median window r_f"] * median + ["MTTF h"]
    rows = []
    for b in window["buckets"]:
        row = [
            b["size_bucket"], _num(b["node_hours"] / 24, 1), _num(b["gpu_hours"], 0), f"{b['jobs_ended']:,}",
            f"{b['jobs_failed']:,}", f"{b['failures']:,}", _num(b["rf_per_1000_node_days"]),
        ]  # fmt: skip
        rows.append(row + [_num(b["median_window_rf"])] * median + [_num(b["mttf_hours"], 1)])
    out.extend("  " + line for line in _table(headers, rows))
    return out


def _ettr_table(report: dict[str, Any]) -> list[str]:
    """Checkpoint interval and expected ETTR per job size; a row that cannot progress says why."""
    assumptions = report["ettr_assumptions"]
    out = [
        f"ETTR guidance from r_f (checkpoint write {assumptions['checkpoint_write_minutes']:g} min, restart "
        f"{assumptions['restart_overhead_minutes']:g} min)"
    ]
    guidance = report["ettr_guidance"]
    notes = any(g.get("note") for g in guidance)
    headers = ["job GPUs", "projected MTTF h", "checkpoint every (min)", "expected ETTR"] + ["why"] * notes
    rows = [
        [f"{g['gpus']:,}", _num(g["projected_mttf_hours"]), _num(g["optimal_checkpoint_minutes"], 1),
         _num(g["expected_ettr"], 3)] + [g.get("note") or ""] * notes
        for g in guidance
    ]  # fmt: skip
    # the words of the last column read left to right
    out.extend("  " + line.rstrip() for line in _table(headers, rows, left={0, 4}))
    return out


def _remediations(report: dict[str, Any]) -> list[str]:
    """What ``faultstream remediate`` did (nothing when it never ran against this store)."""
    done = report.get("remediations") or {}
    if not done.get("outcomes"):
        return []
    out = [
        "",
        "Remediation (faultstream remediate): "
        + ", ".join(f"{r['n']:,} {r['outcome']}" for r in done["outcomes"]),
    ]
    for row in done["recent"]:
        out.append(
            f"  {row['decided'][:19]}  {row['outcome']:<15} {row['node'] or '-':<14} "
            f"{row['kind'] or '-':<18} {row['reason']}"
        )
    return out


def render_text(report: dict[str, Any], mttf_window: str = "auto") -> str:
    """Render the report for a terminal, in about one screen.

    It answers, in order: is the cluster healthy (failure rate against the paper's clusters, job
    failures attributed to hardware), what broke (incidents by kind, nodes with critical ones), what
    to do (open incidents and their actions), what a job of each size can expect (MTTF, ETTR).
    ``mttf_window`` picks the MTTF table (:func:`choose_mttf_windows`); ``--json`` has everything.
    """
    rows = report["rows"]
    days = _span_days(report)
    span = report["time_span"]
    out = [
        f"Store {report['database']}: {rows['xid_events']:,} XID events, {rows['job_events']:,} job events, "
        f"{rows['ecc_samples']:,} ECC samples (downsampled), {rows['dead_letters']:,} dead letters",
        f"  {days:,.1f} days of data, {span['first']} to {span['last']}"
        if days is not None
        else "  no data yet",
        "",
        *_health(report),
        "",
        *_what_broke(report),
        "",
        *_what_to_do(report),
    ]
    chosen = choose_mttf_windows(report["mttf"], mttf_window)
    others = [window_label(w["window_seconds"]) for w in report["mttf"] if w not in chosen]
    for window in chosen:
        out += ["", *_mttf_table(window, others)]
    if report["ettr_guidance"]:
        out += ["", *_ettr_table(report)]
    out += fleet_lines(report.get("fleet"), compact=bool(report["mttf"]))
    out += _remediations(report)
    if report["dead_letter_reasons"]:
        out.append("")
        out.append(
            "Dead letters by reason: "
            + ", ".join(f"{r['reason_class']} ({r['n']:,})" for r in report["dead_letter_reasons"])
        )
    out += ["", "More: faultstream report --html report.html (charts, every incident), --json (all of it)"]
    return "\n".join(out)
