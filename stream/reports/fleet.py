"""Fleet reliability without job records: hardware failures per window over the whole fleet.

The question a reliability engineer asks first of a fleet's failure history is its MTBF per
quarter, and that needs no job records: the nodes (from the inventory, ``replay --inventory`` /
``FAULTSTREAM_INVENTORY_FILE``; without one, every node any input named, which the report says),
and the hardware failures: failure episodes of a GPU, its critical hardware incidents each within
``episode_gap_s`` (the critical incidents' quiet period) of the one before counted once — repeats of
a kind are one incident already, and a double-bit error that takes its GPU off the bus minutes later
is two incidents (``gpu_memory``, ``gpu_bus``) and one failure. Per calendar window (UTC day, ISO
week from Monday, month, quarter), clipped to the data's span:

* ``nodes``, ``node_days`` (nodes x the window's days),
* ``hardware_failures`` (failure episodes whose first evidence falls in the window),
* ``failures_per_1000_node_days`` and ``mtbf_hours`` (the system MTBF: the window's hours over its
  failures, None without a failure),

and the same per GPU model where the inventory names models. Jobs give r_f and MTTF as the paper
defines them (:mod:`stream.reports.text`'s MTTF tables); this view sits beside them.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from schemas.outputs import IncidentKind
from stream.sinks.store import query_rows

__all__ = [
    "EPISODE_GAP_S",
    "FLEET_WINDOWS",
    "HARDWARE_FAILURE_KINDS",
    "choose_fleet_window",
    "failure_episodes",
    "fleet_reliability",
    "window_starts",
]

#: The incident kinds that are a hardware failure when critical.
HARDWARE_FAILURE_KINDS: Final = (
    IncidentKind.GPU_MEMORY,
    IncidentKind.GPU_ROW_REMAP,
    IncidentKind.GPU_NVLINK,
    IncidentKind.GPU_BUS,
    IncidentKind.GPU_FIRMWARE,
    IncidentKind.GPU_ENGINE,
    IncidentKind.GPU_THERMAL_POWER,
    IncidentKind.GPU_RECOVERY,
    IncidentKind.NVSWITCH_FATAL,
)
FLEET_WINDOWS: Final = ("day", "week", "month", "quarter")
#: Critical incidents of a GPU this close (seconds) are one failure: the detectors' default quiet
#: period of critical incidents (``CoreConfig.quiet_period_ms``).
EPISODE_GAP_S: Final = 3_600
_DAY_S: Final = 86_400


def choose_fleet_window(choice: str, span_days: float | None) -> str:
    """The window length: the one asked, or for ``auto`` about a dozen windows over the span.

    >>> choose_fleet_window("auto", 3), choose_fleet_window("auto", 60), choose_fleet_window("auto", 2000)
    ('day', 'week', 'quarter')
    """
    if choice != "auto":
        if choice not in FLEET_WINDOWS:
            raise ValueError(
                f"fleet window must be auto or one of {', '.join(FLEET_WINDOWS)}, got {choice!r}"
            )
        return choice
    days = span_days or 0
    return "day" if days <= 21 else "week" if days <= 120 else "month" if days <= 730 else "quarter"


def _window_start(moment: datetime, window: str) -> datetime:
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        return day
    if window == "week":
        return day - timedelta(days=day.weekday())
    if window == "month":
        return day.replace(day=1)
    return day.replace(month=3 * ((day.month - 1) // 3) + 1, day=1)


def _next_start(start: datetime, window: str) -> datetime:
    if window == "day":
        return start + timedelta(days=1)
    if window == "week":
        return start + timedelta(days=7)
    months = 1 if window == "month" else 3
    month = start.month - 1 + months
    return start.replace(year=start.year + month // 12, month=month % 12 + 1)


def window_starts(first_s: int, last_s: int, window: str) -> list[tuple[datetime, datetime]]:
    """The calendar windows (UTC) that hold ``[first_s, last_s]``, as ``(start, end)``.

    >>> windows = window_starts(1704067200, 1714000000, "quarter")
    >>> [(start.date().isoformat(), end.date().isoformat()) for start, end in windows]
    [('2024-01-01', '2024-04-01'), ('2024-04-01', '2024-07-01')]
    """
    start = _window_start(datetime.fromtimestamp(first_s, tz=UTC), window)
    last = datetime.fromtimestamp(last_s, tz=UTC)
    out = []
    while start <= last:
        end = _next_start(start, window)
        out.append((start, end))
        start = end
    return out


def fleet_reliability(
    client: Client,
    db: str,
    window: str,
    first_s: int | None,
    last_s: int | None,
    episode_gap_s: int = EPISODE_GAP_S,
) -> dict[str, Any]:
    """The fleet view of the store: its nodes, and per window their hardware failures and MTBF."""
    inventory = query_rows(client, f"SELECT node, model FROM {db}.fleet_inventory FINAL")
    if inventory:
        models = {row["node"]: row["model"] for row in inventory}
        assumed = False
    else:
        seen = query_rows(
            client,
            f"""SELECT DISTINCT node FROM (
                SELECT node FROM {db}.xid_events UNION ALL SELECT node FROM {db}.ecc_samples
                UNION ALL SELECT arrayJoin(nodes) AS node FROM {db}.job_events)""",
        )
        models = {row["node"]: "" for row in seen}
        assumed = True
    kinds = ", ".join(f"'{kind.value}'" for kind in HARDWARE_FAILURE_KINDS)
    incidents = query_rows(
        client,
        f"""SELECT node, gpu, toUnixTimestamp(first_evidence) AS at, toUnixTimestamp(last_evidence) AS last
        FROM {db}.incidents FINAL WHERE severity = 'critical' AND kind IN ({kinds})
        ORDER BY node, gpu, at, last""",
    )
    failures = failure_episodes(incidents, episode_gap_s)
    result: dict[str, Any] = {
        "window": window,
        "inventory": not assumed,
        "nodes": len(models),
        "note": (
            f"no inventory: the fleet is taken as the {len(models):,} nodes the inputs name, each over the "
            "whole span (a failure history names only failing nodes: give replay --inventory)"
            if assumed
            else f"inventory of {len(models):,} nodes"
        ),
        "windows": [],
    }
    if first_s is None or last_s is None or not models:
        return result
    by_window: dict[datetime, Counter[str]] = {}
    spans = window_starts(first_s, last_s, window)
    for row in failures:
        at = datetime.fromtimestamp(row["at"], tz=UTC)
        start = _window_start(at, window)
        by_window.setdefault(start, Counter())[models.get(row["node"], "")] += 1
    fleet_models = Counter(models.values())
    for start, end in spans:
        covered_s = min(end.timestamp(), last_s) - max(start.timestamp(), first_s)
        if covered_s <= 0:  # the span ends on the window's first instant
            continue
        days = covered_s / _DAY_S
        counts = by_window.get(start, Counter())
        entry = _figures(len(models), days, sum(counts.values()))
        entry = {
            "start": start.isoformat().replace("+00:00", "Z"),
            "end": end.isoformat().replace("+00:00", "Z"),
            **entry,
        }
        if len(fleet_models) > 1 or "" not in fleet_models:
            entry["by_model"] = {
                model or "unknown": _figures(nodes, days, counts.get(model, 0))
                for model, nodes in sorted(fleet_models.items())
            }
        result["windows"].append(entry)
    return result


def failure_episodes(incidents: list[dict[str, Any]], gap_s: int) -> list[dict[str, Any]]:
    """The failure episodes of critical incidents sorted by node, GPU and first evidence: an incident
    starting within ``gap_s`` of the latest evidence of the GPU's episode so far is part of it.

    >>> rows = [{"node": "n1", "gpu": "0000:3b:00", "at": 0, "last": 60},
    ...         {"node": "n1", "gpu": "0000:3b:00", "at": 200, "last": 200},    # off the bus after its DBE
    ...         {"node": "n1", "gpu": "0000:3b:00", "at": 9000, "last": 9000}]  # hours later: a new failure
    >>> [episode["at"] for episode in failure_episodes(rows, 3600)]
    [0, 9000]
    """
    episodes: list[dict[str, Any]] = []
    place: tuple[str, str] | None = None
    latest = 0
    for row in incidents:
        here = (row["node"], row["gpu"])
        if here != place or row["at"] > latest + gap_s:
            episodes.append(row)
            place, latest = here, row["last"]
        else:
            latest = max(latest, row["last"])
    return episodes


def _figures(nodes: int, days: float, failures: int) -> dict[str, Any]:
    node_days = nodes * days
    return {
        "nodes": nodes,
        "node_days": round(node_days, 3),
        "hardware_failures": failures,
        "failures_per_1000_node_days": round(1000 * failures / node_days, 4) if node_days else None,
        "mtbf_hours": round(days * 24 / failures, 3) if failures else None,
    }


#: At most this many windows in the text report (the newest; ``--json`` has them all).
_TEXT_WINDOWS: Final = 12


def fleet_lines(fleet: dict[str, Any] | None, *, compact: bool = False) -> list[str]:
    """The text report's fleet table: per window, nodes, node-days, hardware failures, their rate
    and the MTBF (nothing without windows). ``compact`` (the report has job-based MTTF tables too):
    one line over the whole span instead."""
    if not fleet or not fleet["windows"]:
        return []
    if compact:
        failures = sum(window["hardware_failures"] for window in fleet["windows"])
        node_days = sum(window["node_days"] for window in fleet["windows"])
        days = node_days / fleet["nodes"] if fleet["nodes"] else 0.0
        mtbf = f"MTBF {days * 24 / failures:,.1f} h, " if failures else "no MTBF yet, "
        rate = 1000 * failures / node_days if node_days else 0.0
        return [
            "",
            f"Fleet (no jobs needed): {failures:,} critical hardware failures over {fleet['nodes']:,} nodes "
            f"in {days:,.1f} days: {mtbf}{rate:.2f} per 1000 node-days "
            f"(per {fleet['window']}: --json, --html)",
        ]
    out = [
        "",
        f"Fleet reliability per {fleet['window']} (critical hardware incidents; {fleet['note']}):",
        f"  {'window':<12} {'nodes':>8} {'node-days':>12} {'failures':>9} {'per 1000 nd':>12} {'MTBF h':>9}",
    ]
    for window in fleet["windows"][-_TEXT_WINDOWS:]:
        rate = window["failures_per_1000_node_days"]
        mtbf = window["mtbf_hours"]
        out.append(
            f"  {window['start'][:10]:<12} {window['nodes']:>8,} {window['node_days']:>12,.1f} "
            f"{window['hardware_failures']:>9,} {'-' if rate is None else f'{rate:.2f}':>12} "
            f"{'-' if mtbf is None else f'{mtbf:,.1f}':>9}"
        )
    if len(fleet["windows"]) > _TEXT_WINDOWS:
        out.append(f"  ({len(fleet['windows']) - _TEXT_WINDOWS} earlier windows: --json)")
    return out
