"""``faultstream explain``: what an XID code or a pasted kernel-log line means, for triage.

``faultstream explain 79``, ``faultstream explain 'Jun 12 10:00:01 host kernel: NVRM: Xid (PCI:…): 48, …'``
or lines on standard input (``dmesg | faultstream explain``): for each, what it parses to (with the
kernel-log parser the replay uses), the category, severity, meaning, NVIDIA's action, ours, whether
and why it is a hardware fault, and any deviation from NVIDIA's catalog with its reason. Lines of
one paste are read in order with the same per-GPU context as the detection core (an XID 63 right
after a 48 on the same GPU is part of the 48).

With a store (``--clickhouse`` or ``--data-dir``), each pasted line also shows its job context
(job-aware verdicts, issue 19): the jobs the stored scheduler records place on that node at that
moment (id, user, name, size, how they ended), and whether an incident addressed to one of their
owners covers it (``job_app_errors``: the user's jobs crash wherever they run; ``job_xid_storm``: a
storm of one job's own application XIDs). An application-class line is then the job's, not the
node's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from detectors.sxid_catalog import classify_sxid
from detectors.xid_catalog import CONTEXT_WINDOW_MS, XidCategory, XidInfo, classify_xid
from schemas.records import InvalidRecord, XidEvent
from schemas.timeutil import format_ts
from stream.cli.common import (
    Commands,
    add_command,
    add_store_arguments,
    parse_time_argument,
    print_json,
    settings_from_args,
)
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.options import ParseOptions

__all__ = ["add_explain_parser", "explain_items", "run_explain"]

_NO_NODE = "-"


def add_explain_parser(commands: Commands) -> None:
    """Add ``explain`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    explain = add_command(
        commands,
        "explain",
        help="explain an XID code or kernel-log lines (arguments, or standard input)",
        example="faultstream explain 79 'Jun 12 10:00:01 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, DBE'",
        description="Explain XID codes or pasted kernel-log lines: what each parses to, its category, "
        "severity, meaning, NVIDIA's action and ours, whether it is a hardware fault, and any deviation "
        "from NVIDIA's catalog. With no argument, reads lines from standard input.",
    )
    explain.add_argument("items", nargs="*", help="XID codes (79) or whole kernel-log lines, quoted")
    explain.add_argument("--sxid", action="store_true", help="numbers are NVSwitch SXid codes, not XIDs")
    explain.add_argument(
        "--year", type=int, help="year of syslog time stamps, which have none (default: the current year)"
    )
    explain.add_argument(
        "--boot-time", type=parse_time_argument, help="boot time (ISO) for plain dmesg lines (default: epoch)"
    )
    explain.add_argument("--timezone", default="UTC", help="zone of dmesg -T times (default UTC)")
    explain.add_argument("--json", action="store_true", help="print a JSON list, one object per item")
    add_store_arguments(explain)
    explain.set_defaults(handler=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    """Explain each item of the command line, or each non-empty line of standard input.

    Returns
    -------
    int
        0 when every item was explained, 1 when some line did not parse (each says why).
    """
    if not args.items and sys.stdin.isatty():
        raise ValueError("explain what? give an XID code or a quoted kernel-log line, or pipe lines in")
    items: Iterable[str] = args.items or (line.rstrip("\r\n") for line in sys.stdin)
    options = ParseOptions(
        node=_NO_NODE,
        year=args.year or datetime.now(UTC).year,
        boot_time_ms=args.boot_time if args.boot_time is not None else 0,
        timezone=args.timezone,
    )
    results = explain_items([item for item in items if item.strip()], options, sxid=args.sxid)
    if args.clickhouse or args.data_dir:  # only with a store named: explain works offline too
        from stream.sinks.store import connect

        settings = settings_from_args(args)
        add_job_context(results, connect(settings), settings.database)
    if args.json:
        print_json(results)
    else:
        sys.stdout.write("\n\n".join(_text(result) for result in results) + "\n")
    return 0 if all(result["parsed"] for result in results) else 1


def explain_items(items: list[str], options: ParseOptions, sxid: bool = False) -> list[dict[str, Any]]:
    """Explain codes and kernel-log lines, in order, with the per-GPU context of the lines before.

    Parameters
    ----------
    items
        Codes (``"79"``) or kernel-log lines.
    options
        Parse options for the lines (year, boot time, zone).
    sxid
        Bare numbers are SXid codes.

    Returns
    -------
    list of dict
        One JSON-ready dict per item: ``input``, ``parsed`` and, when parsed, the event's fields
        and the classification (``explain_items`` never raises on bad input).
    """
    recent: dict[tuple[str, str], list[tuple[int, int]]] = {}
    results = []
    for item in items:
        text = item.strip()
        if text.isdigit():
            code = int(text)
            results.append(
                {"input": text, "parsed": True, **(_sxid(code, "") if sxid else _xid(code, "", ()))}
            )
            continue
        records = list(parse_kernel_log([text.encode("utf-8", "surrogateescape")], options, "explain"))
        events = [r for r in records if isinstance(r, XidEvent)]
        if not events:
            reasons = [r.reason for r in records if isinstance(r, InvalidRecord)]
            why = reasons[0] if reasons else "no 'NVRM: Xid', 'SXid' or fallen-off-the-bus message in it"
            results.append({"input": text, "parsed": False, "error": f"this line does not parse: {why}"})
            continue
        for event in events:
            parsed = {
                "input": text,
                "parsed": True,
                "device": event.device,
                "time": format_ts(event.ts_ms),
                "ts_ms": event.ts_ms,
                "node": "" if event.node == _NO_NODE else event.node,
                "pci_bus_id": event.pci_bus_id,
                "pid": event.pid,
                "process": event.process,
                "message": event.message,
            }
            if event.device == "nvswitch":
                results.append({**parsed, **_sxid(event.xid, event.message)})
                continue
            key = (event.node, event.gpu_key)
            seen = [
                (ts, c)
                for ts, c in recent.get(key, [])
                if event.ts_ms - CONTEXT_WINDOW_MS <= ts <= event.ts_ms
            ]
            context = tuple(c for _, c in seen)
            recent[key] = [*seen, (event.ts_ms, event.xid)]
            results.append({**parsed, **_xid(event.xid, event.message, context)})
    return results


def add_job_context(results: list[dict[str, Any]], client: Any, database: str) -> None:
    """Add ``jobs`` (the stored job context of each parsed line's node and moment) and
    ``owner_incidents`` (``job_app_errors`` and ``job_xid_storm`` incidents of those jobs' owners
    covering the moment, each with its ``kind``)."""
    from stream.sinks.store import query_rows

    for result in results:
        if not result.get("node") or "ts_ms" not in result:
            continue
        parameters = {"node": result["node"], "t": result["ts_ms"]}
        jobs = query_rows(
            client,
            f"""SELECT job_id, any(user) AS user, any(name) AS name, max(partition) AS partition,
                   max(num_nodes) AS num_nodes,
                   max(gpus) AS gpus, min(toUnixTimestamp64Milli(coalesce(start, ts))) AS start_ms,
                   maxIf(toUnixTimestamp64Milli(coalesce(end, ts)), state != 'RUNNING') AS end_ms,
                   countIf(state != 'RUNNING') AS ended, argMax(state, ts) AS last_state
            FROM {database}.job_events FINAL
            WHERE has(nodes, {{node:String}})
            GROUP BY job_id
            HAVING start_ms <= {{t:Int64}} AND (ended = 0 OR end_ms + 300000 >= {{t:Int64}})
            ORDER BY start_ms, job_id""",
            parameters,
        )
        result["jobs"] = [
            {
                "job_id": job["job_id"],
                "user": job["user"],
                "name": job["name"],
                "partition": job["partition"],
                "num_nodes": int(job["num_nodes"]),
                "gpus": int(job["gpus"]),
                "start": format_ts(int(job["start_ms"])),
                "state": job["last_state"],
                "end": format_ts(int(job["end_ms"])) if job["ended"] else None,
            }
            for job in jobs
        ]
        users = sorted({job["user"] for job in jobs if job["user"]})
        result["owner_incidents"] = (
            [
                {
                    "incident_id": row["incident_id"],
                    "kind": row["kind"],
                    "owner": row["owner"],
                    "summary": row["summary"],
                }
                for row in query_rows(
                    client,
                    f"""SELECT incident_id, kind, JSONExtractString(evidence, 'owner') AS owner, summary
                    FROM {database}.incidents FINAL
                    WHERE kind IN ('job_app_errors', 'job_xid_storm') AND has({{users:Array(String)}}, owner)
                      AND toUnixTimestamp64Milli(first_evidence) - 86400000 <= {{t:Int64}}
                      AND toUnixTimestamp64Milli(last_evidence) + 86400000 >= {{t:Int64}}
                    ORDER BY incident_id""",
                    {"users": users, "t": result["ts_ms"]},
                )
            ]
            if users
            else []
        )


def _xid(code: int, message: str, context: tuple[int, ...]) -> dict[str, Any]:
    info = classify_xid(code, message, context)
    deviation = info.deviation
    return {
        "kind": "xid",
        "code": code,
        "known": info.known,
        "meaning": info.name,
        "mnemonic": info.mnemonic,
        "applies_to": list(info.applies_to),
        "category": info.category.value,
        "incident_kind": info.category.incident_kind.value,
        "severity": info.severity.value,
        "hardware": info.hardware,
        "hardware_why": _hardware_why(info),
        "nvidia_action": info.nvidia_action,
        "nvidia_investigatory": info.nvidia_investigatory,
        "action": info.action,
        "basis": info.basis,
        "context": list(context),
        "deviation": None
        if deviation is None
        else {
            "nvidia": deviation.nvidia,
            "ours": deviation.ours,
            "reason": deviation.reason,
            "source": deviation.source,
        },
    }


def _hardware_why(info: XidInfo) -> str:
    if info.category is XidCategory.UNKNOWN:
        return "unknown: the code is not in NVIDIA's catalog"
    if info.hardware:
        return f"yes: it needs attention to the GPU, board or fabric ({info.basis})"
    return f"no: the program or the software, not the GPU ({info.basis})"


def _sxid(code: int, message: str) -> dict[str, Any]:
    info = classify_sxid(code, message)
    return {
        "kind": "sxid",
        "code": code,
        "known": info.known,
        "meaning": info.name,
        "category": f"nvswitch ({info.fm_class.value if info.fm_class else 'not in the guide'})",
        "incident_kind": info.incident_kind.value,
        "severity": info.severity.value,
        "hardware": info.hardware,
        "hardware_why": ("yes: " if info.hardware else "no: ") + info.basis,
        "nvidia_action": f"{info.fm_class.value} SXid (Fabric Manager user guide)" if info.fm_class else "",
        "action": info.action,
        "basis": info.basis,
        "deviation": None,
    }


_PAGES = {
    "critical": "critical: pages",
    "warn": "warn: an incident, no page",
    "info": "info: stored, no incident",
}


def _text(result: dict[str, Any]) -> str:
    lines = [result["input"]]
    if not result["parsed"]:
        return "\n".join([*lines, f"  {result['error']}"])
    label = "SXid" if result["kind"] == "sxid" else "XID"

    def row(name: str, value: str) -> None:
        lines.append(f"  {name + ':' if name else '':<14}{value}")

    if "device" in result:
        where = [f"{label} {result['code']}"]
        if result["node"]:
            where.append(f"on {result['node']}")
        if result["pci_bus_id"]:
            where.append(f"{'switch' if result['device'] == 'nvswitch' else 'GPU'} {result['pci_bus_id']}")
        where.append(f"at {result['time']}")
        if result["pid"] is not None or result["process"]:
            where.append(f"pid {result['pid']} ({result['process'] or '?'})")
        row("parsed", ", ".join(where))
        if result["message"]:
            row("message", result["message"])
    meaning = result["meaning"]
    if result.get("mnemonic") and result["mnemonic"] != meaning:
        meaning += f" ({result['mnemonic']})"
    row("meaning", f"{label} {result['code']}: {meaning}")
    if result.get("applies_to"):
        row("applies to", ", ".join(result["applies_to"]))
    row("category", f"{result['category']} (incident kind {result['incident_kind']})")
    row("severity", _PAGES[result["severity"]])
    row("hardware", result["hardware_why"])
    nvidia = result["nvidia_action"] or "none given"
    if result.get("nvidia_investigatory"):
        nvidia += f"; investigate: {result['nvidia_investigatory']}"
    row("NVIDIA", nvidia)
    row("suggested", result["action"])
    if result.get("context"):
        row("context", "XIDs before it on this GPU: " + ", ".join(map(str, result["context"])))
    if "jobs" in result:
        if not result["jobs"]:
            row("jobs", "the store has no job on this node at this moment")
        for index, job in enumerate(result["jobs"]):
            ended = f", ended {job['state']} at {job['end']}" if job["end"] else ", running"
            row(
                "jobs" if index == 0 else "",
                f"{job['job_id']} of {job['user'] or '?'} ({job['name'] or '?'}, "
                f"{f'partition {partition}, ' if (partition := job.get('partition')) else ''}"
                f"{job['num_nodes']} node(s), "
                f"{job['gpus']} GPUs, from {job['start']}{ended})",
            )
        if result["category"] == XidCategory.APPLICATION.value and result["jobs"]:
            incidents = result.get("owner_incidents", ())
            owners = sorted(
                {i["owner"] for i in incidents if i.get("kind", "job_app_errors") == "job_app_errors"}
            )
            storms = sorted({i["owner"] for i in incidents if i.get("kind") == "job_xid_storm"})
            if owners:
                verdict = f"application-class, and the errors follow user {', '.join(owners)}: not the node's"
            elif storms:
                verdict = (
                    f"application-class, a storm of user {', '.join(storms)}'s job: the job's, not the node's"
                )
            else:
                verdict = "application-class: the job's; the node's unless its owner's errors follow them"
            row("verdict", verdict)
        for incident in result.get("owner_incidents", ()):
            row("owner", f"{incident['incident_id']} to user {incident['owner']}: {incident['summary']}")
    deviation = result["deviation"]
    if deviation is not None:
        row("deviation", f"NVIDIA: {deviation['nvidia']}")
        row("", f"ours: {deviation['ours']}")
        row("", f"why: {deviation['reason']}")
        row("", f"source: {deviation['source']}")
    return "\n".join(lines)
