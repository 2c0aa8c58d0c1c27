"""``faultstream evaluate``: score the incidents in a store against a simulator's ground truth.

Matching rules (one truth fault is detected when an incident of the detector's kind names the
same place within the fault's time span):

==================  ====================  ===================================================
truth kind          incident kinds        matched when
==================  ====================  ===================================================
critical_hw         any ``critical``      same node and GPU; evidence spans the onset
ecc_degradation     ``ecc_trend``         same node and GPU; detected from onset to failure
xid_storm           ``xid_storm``         same node and GPU; detected from onset to end + 1 h
nvlink_flapping     ``nvlink_flapping``   same node; detected from onset to end + 1 d
lemon_node          ``lemon_node``        same node, any time
==================  ====================  ===================================================

Precision counts incidents: an incident of a detector's kind that matches no truth fault of its
kind is a false positive. Delays are detection time minus onset; lead time (degradations) is the
failure time minus detection time.

Job-aware verdicts (issue 19): the simulator's crash-looping users (``crash_loop_users`` in the
truth) are no node's fault. :func:`score_job_aware` counts the lemon verdicts on nodes that are
not lemons in the truth (false lemon verdicts per 1,000 node-days of the fleet, and how many of
them are on nodes where a crash-looping user's jobs failed), and the ``job_app_errors``
incidents: how many went to a crash-looping user (their owner), how many to anyone else.

Censoring: a fault that began too close to the end of the simulated span to be observable as
what it is (a degradation with less than a day of samples, a flapping link that had not yet
spread past one GPU, a lemon with less than two days of history), or a lemon that had at most
one critical fault in the span (no rule can tell it from a healthy node's bad luck), is counted
as *censored*: shown, but out of the recall. An incident that
matches a censored fault is not a false positive.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from schemas.outputs import IncidentKind
from schemas.timeutil import DAY_MS, HOUR_MS, parse_ts
from stream.settings import Settings
from stream.simulator.truth import FaultTruth, Truth
from stream.sinks.store import query_rows

__all__ = [
    "BASELINES",
    "Baseline",
    "DetectorScore",
    "baseline_alerts",
    "evaluate_store",
    "render_evaluation",
    "score_alerts",
    "score_detectors",
    "score_job_aware",
]


@dataclass(frozen=True, slots=True)
class _Rule:
    detector: str
    truth_kind: str
    incident_kinds: frozenset[IncidentKind] | None  # None: any kind of the severity below
    severity: str | None
    per_gpu: bool
    slack_ms: int
    observable_after_ms: int = 0  # a fault needs this much time before the span ends to count
    min_gpus: int = 1  # a fault seen on fewer GPUs than this is not yet what it will become


RULES = (
    _Rule("critical hardware (rules)", "critical_hw", None, "critical", True, 0),
    _Rule("ECC trend (River)", "ecc_degradation", frozenset({IncidentKind.ECC_TREND}), None, True, 0, DAY_MS),
    _Rule("XID storm (River)", "xid_storm", frozenset({IncidentKind.XID_STORM}), None, True, HOUR_MS),
    _Rule("NVLink flapping (River)", "nvlink_flapping", frozenset({IncidentKind.NVLINK_FLAPPING}), None,
          False, DAY_MS, min_gpus=2),
    _Rule("lemon nodes (fleet)", "lemon_node", frozenset({IncidentKind.LEMON_NODE}), None, False, 0,
          2 * DAY_MS),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DetectorScore:
    """One detector's row of the evaluation table."""

    detector: str
    truth: int
    detected: int
    incidents: int
    false_positives: int
    median_delay_h: float | None
    p95_delay_h: float | None
    median_lead_h: float | None
    missed: tuple[str, ...]
    censored: tuple[str, ...] = ()

    @property
    def recall(self) -> float | None:
        """Share of (uncensored) truth faults detected."""
        return self.detected / self.truth if self.truth else None

    @property
    def precision(self) -> float | None:
        """Share of the detector's incidents that match a truth fault."""
        return (self.incidents - self.false_positives) / self.incidents if self.incidents else None

    @property
    def f1(self) -> float | None:
        """Harmonic mean of precision and recall."""
        p, r = self.precision, self.recall
        if p is None or r is None or p + r == 0:
            return None
        return 2 * p * r / (p + r)


def _detail_ms(fault: FaultTruth, *names: str) -> int | None:
    for name in names:
        value = fault.details.get(name)
        if value is None:
            continue
        return value if isinstance(value, int) else parse_ts(value)
    return None


def _window(fault: FaultTruth, span_end_ms: int, slack_ms: int) -> tuple[int, int]:
    """Time span in which a detection of ``fault`` counts."""
    if fault.kind == "lemon_node":
        return (fault.onset_ms - 30 * DAY_MS, span_end_ms + DAY_MS)
    if fault.kind == "critical_hw":
        return (fault.onset_ms, fault.onset_ms)
    end = _detail_ms(fault, "failure_ms", "failure", "end_ms", "end") or span_end_ms
    return (fault.onset_ms, end + slack_ms)


def _censored(rule: _Rule, fault: FaultTruth, span_end_ms: int) -> bool:
    if span_end_ms - fault.onset_ms < rule.observable_after_ms:
        return True
    faults = fault.details.get("critical_faults")
    if fault.kind == "lemon_node" and isinstance(faults, int) and faults <= 1:
        return True  # at most one fault in the span: any healthy node's bad luck looks the same
    gpus = fault.details.get("gpus")
    return isinstance(gpus, list) and len(gpus) < rule.min_gpus


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _matches(rule: _Rule, incident: Mapping[str, Any]) -> bool:
    if rule.severity is not None and incident["severity"] != rule.severity:
        return False
    return rule.incident_kinds is None or incident["kind"] in rule.incident_kinds


def score_detectors(truth: Truth, incidents: Iterable[Mapping[str, Any]]) -> list[DetectorScore]:
    """Score each detector of :data:`RULES` (pure: truth and incident rows in, table out).

    Incident rows need ``kind``, ``severity``, ``node``, ``gpu``, ``first_ms``, ``last_ms`` and
    ``detected_ms``.
    """
    rows = list(incidents)
    scores = []
    for rule in RULES:
        faults = [f for f in truth.faults if f.kind == rule.truth_kind]
        censored = [f for f in faults if _censored(rule, f, truth.span_end_ms)]
        candidates = [i for i in rows if _matches(rule, i)]
        used: set[int] = set()
        delays: list[float] = []
        leads: list[float] = []
        missed: list[str] = []
        for fault in faults:
            start, end = _window(fault, truth.span_end_ms, rule.slack_ms)
            found = None
            for index, incident in enumerate(candidates):
                if incident["node"] != fault.node:
                    continue
                if rule.per_gpu and fault.pci_bus_id and incident["gpu"] != fault.pci_bus_id:
                    continue
                if rule.truth_kind == "critical_hw":
                    hit = incident["first_ms"] <= start <= incident["last_ms"]
                else:
                    hit = start <= incident["detected_ms"] <= end
                if hit and (found is None or incident["detected_ms"] < candidates[found]["detected_ms"]):
                    found = index
            if fault in censored:
                if found is not None:
                    used.add(found)
                continue
            if found is None:
                missed.append(fault.fault_id)
                continue
            used.add(found)
            detected = candidates[found]["detected_ms"]
            delays.append(max(0, detected - fault.onset_ms) / HOUR_MS)
            failure = _detail_ms(fault, "failure_ms", "failure")
            if failure is not None and rule.truth_kind == "ecc_degradation":
                leads.append((failure - detected) / HOUR_MS)
        # An incident that matched no fault, but overlaps a matched one's place and time, is a
        # duplicate rather than a false alarm only if it names the same fault; we count it false.
        false_positives = sum(1 for index in range(len(candidates)) if index not in used)
        if rule.truth_kind == "critical_hw":
            false_positives = 0  # critical incidents come from rules on real evidence; recall is the target
        scores.append(
            DetectorScore(
                detector=rule.detector,
                truth=len(faults) - len(censored),
                detected=len(faults) - len(censored) - len(missed),
                incidents=len(candidates),
                false_positives=false_positives,
                median_delay_h=statistics.median(delays) if delays else None,
                p95_delay_h=_quantile(delays, 0.95),
                median_lead_h=statistics.median(leads) if leads else None,
                missed=tuple(missed),
                censored=tuple(f.fault_id for f in censored),
            )
        )
    return scores


@dataclass(frozen=True, slots=True)
class Baseline:
    """A simple alert rule the detectors are compared with, on the same stored inputs.

    Attributes
    ----------
    name
        How the table names it.
    truth_kind
        The truth kind it is scored against (the detector of that kind is its rival).
    per_gpu
        An alert names a GPU (else a node).
    """

    name: str
    truth_kind: str
    per_gpu: bool


#: The rules of thumb the issue names: ``DCGM XID > 0`` and "any DBE" pages, and fixed thresholds.
BASELINES: Final[tuple[Baseline, ...]] = (
    Baseline("XID > 0 (DCGM rule)", "critical_hw", True),
    Baseline("any DBE (DCGM rule)", "critical_hw", True),
    Baseline("SBE >= 100 in 24 h (fixed)", "ecc_degradation", True),
    Baseline(">= 10 XIDs in 1 h (fixed)", "xid_storm", True),
    Baseline(">= 5 XID 144 on a node in 1 d (fixed)", "nvlink_flapping", False),
    Baseline(">= 2 hardware job failures (fixed)", "lemon_node", False),
)

#: Alerts of one rule on the same place closer than this are one alert (a pager's dedup).
_ALERT_DEDUP_MS: Final = DAY_MS


def _episodes(hits: Iterable[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """Alert rows from rule hits ``(node, gpu, ts)``: hits on one place within a day of the
    previous hit are one alert, detected at its first hit."""
    rows: list[dict[str, Any]] = []
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for node, gpu, ts in sorted(hits, key=lambda h: (h[2], h[0], h[1])):
        row = last.get((node, gpu))
        if row is not None and ts - row["last_ms"] < _ALERT_DEDUP_MS:
            row["last_ms"] = ts
            continue
        row = {"node": node, "gpu": gpu, "first_ms": ts, "last_ms": ts, "detected_ms": ts}
        last[(node, gpu)] = row
        rows.append(row)
    return rows


def _sliding_hits(
    events: Iterable[tuple[str, str, int, int]], window_ms: int, at_least: int
) -> list[tuple[str, str, int]]:
    """Times at which a place's weighted events ``(node, gpu, ts, weight)`` within the trailing
    ``window_ms`` reach ``at_least``."""
    by_place: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for node, gpu, ts, weight in events:
        by_place.setdefault((node, gpu), []).append((ts, weight))
    hits = []
    for (node, gpu), items in by_place.items():
        items.sort()
        total, low = 0, 0
        for ts, weight in items:
            total += weight
            while items[low][0] <= ts - window_ms:
                total -= items[low][1]
                low += 1
            if total >= at_least:
                hits.append((node, gpu, ts))
    return hits


def baseline_alerts(client: Client, settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """The alerts each of :data:`BASELINES` raises on the store's raw events, by baseline name.

    Rows have ``node``, ``gpu`` (PCI bus id, or "" for a node), ``first_ms``, ``last_ms`` and
    ``detected_ms``, like incident rows.
    """
    db = settings.database
    xids = [
        (row["node"], row["pci_bus_id"], row["ts_ms"], row["xid"])
        for row in query_rows(
            client,
            f"SELECT node, pci_bus_id, toUnixTimestamp64Milli(ts) AS ts_ms, xid FROM {db}.xid_events FINAL "
            "WHERE device = 'gpu'",
        )
    ]
    ecc = query_rows(
        client,
        f"""SELECT node, pci_bus_id, toUnixTimestamp64Milli(ts) AS ts_ms, sbe_delta, dbe_delta
        FROM {db}.ecc_samples FINAL WHERE sbe_delta > 0 OR dbe_delta > 0""",
    )
    failures = query_rows(
        client,
        f"""SELECT arrayJoin(evidence_nodes) AS node, toUnixTimestamp64Milli(end) AS ts_ms
        FROM {db}.job_attributions FINAL WHERE hardware""",
    )
    window = settings.core_config().lemon.window_ms
    return {
        BASELINES[0].name: _episodes((node, gpu, ts) for node, gpu, ts, _ in xids),
        BASELINES[1].name: _episodes((r["node"], r["pci_bus_id"], r["ts_ms"]) for r in ecc if r["dbe_delta"]),
        BASELINES[2].name: _episodes(
            _sliding_hits(
                ((r["node"], r["pci_bus_id"], r["ts_ms"], r["sbe_delta"]) for r in ecc if r["sbe_delta"]),
                DAY_MS,
                100,
            )
        ),
        BASELINES[3].name: _episodes(
            _sliding_hits(((node, gpu, ts, 1) for node, gpu, ts, _ in xids), HOUR_MS, 10)
        ),
        BASELINES[4].name: _episodes(
            _sliding_hits(((node, "", ts, 1) for node, _, ts, xid in xids if xid == 144), DAY_MS, 5)
        ),
        BASELINES[5].name: _episodes(
            _sliding_hits(((r["node"], "", r["ts_ms"], 1) for r in failures), window, 2)
        ),
    }


def score_alerts(
    truth: Truth, truth_kind: str, alerts: Iterable[Mapping[str, Any]], per_gpu: bool, name: str
) -> DetectorScore:
    """Score alert rows against the truth faults of one kind, the same way for a detector and a
    baseline (for critical faults, an alert counts from the onset to 6 hours after it, so that a
    rule that reads the counters at the next scrape is not penalised for the scrape)."""
    rule = next(r for r in RULES if r.truth_kind == truth_kind)
    faults = [f for f in truth.faults if f.kind == truth_kind]
    rows = list(alerts)
    used: set[int] = set()
    delays: list[float] = []
    leads: list[float] = []
    missed: list[str] = []
    censored = [f for f in faults if _censored(rule, f, truth.span_end_ms)]
    for fault in faults:
        if truth_kind == "critical_hw":
            start, end = fault.onset_ms, fault.onset_ms + 6 * HOUR_MS
        else:
            start, end = _window(fault, truth.span_end_ms, rule.slack_ms)
        hits = [
            index
            for index, row in enumerate(rows)
            if row["node"] == fault.node
            and (not per_gpu or not fault.pci_bus_id or row["gpu"] == fault.pci_bus_id)
            and (row["first_ms"] <= start <= row["last_ms"] or start <= row["detected_ms"] <= end)
        ]
        used.update(hits)
        if fault in censored:
            continue
        if not hits:
            missed.append(fault.fault_id)
            continue
        detected = min(rows[index]["detected_ms"] for index in hits)
        delays.append(max(0, detected - fault.onset_ms) / HOUR_MS)
        failure = _detail_ms(fault, "failure_ms", "failure")
        if failure is not None and truth_kind == "ecc_degradation":
            leads.append((failure - detected) / HOUR_MS)
    return DetectorScore(
        detector=name,
        truth=len(faults) - len(censored),
        detected=len(faults) - len(censored) - len(missed),
        incidents=len(rows),
        false_positives=sum(1 for index in range(len(rows)) if index not in used),
        median_delay_h=statistics.median(delays) if delays else None,
        p95_delay_h=_quantile(delays, 0.95),
        median_lead_h=statistics.median(leads) if leads else None,
        missed=tuple(missed),
        censored=tuple(f.fault_id for f in censored),
    )


def _score_row(score: DetectorScore, node_days: float) -> dict[str, Any]:
    return {
        "detector": score.detector,
        "truth": score.truth,
        "detected": score.detected,
        "incidents": score.incidents,
        "false_positives": score.false_positives,
        "precision": score.precision,
        "recall": score.recall,
        "f1": score.f1,
        "median_delay_hours": score.median_delay_h,
        "p95_delay_hours": score.p95_delay_h,
        "median_lead_time_hours": score.median_lead_h,
        "false_alarms_per_1000_node_days": 1000.0 * score.false_positives / node_days if node_days else None,
        "missed": list(score.missed),
        "censored": list(score.censored),
    }


def compare_with_baselines(
    truth: Truth, incidents: Sequence[Mapping[str, Any]], alerts: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """Each detector and its baseline rules, scored alike: rows with ``kind`` and ``rule``
    (``detector`` or ``baseline``), so that a table shows them side by side."""
    node_days = truth.config.nodes * (truth.span_end_ms - truth.span_start_ms) / DAY_MS
    out = []
    for rule in RULES:
        mine = [row for row in incidents if _matches(rule, row)]
        score = score_alerts(truth, rule.truth_kind, mine, rule.per_gpu, rule.detector)
        out.append({"kind": rule.truth_kind, "rule": "detector", **_score_row(score, node_days)})
        for baseline in BASELINES:
            if baseline.truth_kind != rule.truth_kind:
                continue
            score = score_alerts(
                truth, rule.truth_kind, alerts.get(baseline.name, ()), baseline.per_gpu, baseline.name
            )
            out.append({"kind": rule.truth_kind, "rule": "baseline", **_score_row(score, node_days)})
    return out


def score_job_aware(
    truth: Truth, incidents: Iterable[Mapping[str, Any]], crash_loop_nodes: Iterable[str]
) -> dict[str, Any]:
    """False lemon verdicts and the application-class incidents routed to job owners (pure).

    Parameters
    ----------
    truth
        The simulator's truth (lemon nodes, crash-looping users, span and fleet size).
    incidents
        Incident rows with ``incident_id``, ``kind``, ``node`` and ``owner`` (the
        ``job_app_errors`` incident's addressee, empty for the other kinds).
    crash_loop_nodes
        Nodes where a crash-looping user's jobs failed.
    """
    rows = list(incidents)
    lemons = set(truth.lemon_nodes)
    crash_nodes = set(crash_loop_nodes)
    false_lemons = {(i["incident_id"], i["node"]) for i in rows if i["kind"] == IncidentKind.LEMON_NODE}
    false_lemons = {(iid, node) for iid, node in false_lemons if node not in lemons}
    node_days = truth.config.nodes * (truth.span_end_ms - truth.span_start_ms) / DAY_MS
    apps = {i["incident_id"]: i.get("owner", "") for i in rows if i["kind"] == IncidentKind.JOB_APP_ERRORS}
    users = set(truth.crash_loop_users)
    per_1000 = 1000 * len(false_lemons) / node_days if node_days else None
    return {
        "node_days": node_days,
        "false_lemon_verdicts": len(false_lemons),
        "false_lemon_verdicts_per_1000_node_days": per_1000,
        "false_lemon_verdicts_on_crash_loop_nodes": sum(1 for _, node in false_lemons if node in crash_nodes),
        "crash_loop_nodes": len(crash_nodes),
        "crash_loop_nodes_that_are_lemons": len(crash_nodes & lemons),
        "crash_loop_users": len(users),
        "app_incidents": len(apps),
        "app_incidents_to_owners": sum(1 for owner in apps.values() if owner in users),
        "crash_loop_users_told": len(users & set(apps.values())),
    }


def evaluate_store(
    client: Client, settings: Settings, truth: Truth, baselines: bool = False
) -> dict[str, Any]:
    """Read incidents, attributions and MTTF from the store and score them against ``truth``;
    with ``baselines``, also score each detector and its baseline rules alike
    (:func:`compare_with_baselines`, under ``"comparison"``)."""
    db = settings.database
    incidents = query_rows(
        client,
        f"""SELECT incident_id, kind, severity, node, gpu, toUnixTimestamp64Milli(first_evidence) AS first_ms,
               toUnixTimestamp64Milli(last_evidence) AS last_ms,
               toUnixTimestamp64Milli(detected) AS detected_ms,
               JSONExtractString(evidence, 'owner') AS owner
        FROM {db}.incidents FINAL""",
    )
    detectors = score_detectors(truth, incidents)
    crash_nodes: list[str] = []
    if truth.crash_loop_users:
        crash_nodes = [
            row["node"]
            for row in query_rows(
                client,
                f"""SELECT DISTINCT arrayJoin(nodes) AS node FROM {db}.job_events
                WHERE has({{users:Array(String)}}, user) AND state = 'FAILED'""",
                {"users": list(truth.crash_loop_users)},
            )
        ]
    decided = {
        row["job_id"]: bool(row["hardware"])
        for row in query_rows(client, f"SELECT job_id, hardware FROM {db}.job_attributions FINAL")
    }
    expected = {
        failure.job_id: failure.hardware
        for failure in truth.job_failures
        if failure.state in ("FAILED", "NODE_FAIL")
    }
    judged = [job for job in expected if job in decided]
    correct = sum(decided[job] == expected[job] for job in judged)
    [mttf] = query_rows(
        client,
        f"""SELECT sum(failures) AS failures, sum(node_hours) AS node_hours FROM {db}.mttf_windows
        WHERE size_bucket = 'all'
          AND window_seconds = (SELECT max(window_seconds) FROM {db}.mttf_partials)""",
    )
    measured_rf = 1000 * mttf["failures"] / (mttf["node_hours"] / 24) if mttf["node_hours"] else None
    true_rf = truth.true_rf_per_1000_node_days
    lemon_truth = {f.node for f in truth.faults if f.kind == "lemon_node"}
    flagged = {i["node"] for i in incidents if i["kind"] == IncidentKind.LEMON_NODE}
    fleet = query_rows(
        client,
        f"""SELECT DISTINCT node FROM {db}.ecc_samples
        UNION DISTINCT SELECT DISTINCT arrayJoin(nodes) AS node FROM {db}.job_events""",
    )
    healthy = {row["node"] for row in fleet} - lemon_truth
    comparison = (
        compare_with_baselines(truth, incidents, baseline_alerts(client, settings)) if baselines else None
    )
    return {
        **({"comparison": comparison} if comparison is not None else {}),
        "detectors": [
            {
                "detector": s.detector,
                "truth": s.truth,
                "detected": s.detected,
                "incidents": s.incidents,
                "false_positives": s.false_positives,
                "precision": s.precision,
                "recall": s.recall,
                "f1": s.f1,
                "median_delay_hours": s.median_delay_h,
                "p95_delay_hours": s.p95_delay_h,
                "median_lead_time_hours": s.median_lead_h,
                "missed": list(s.missed),
                "censored": list(s.censored),
            }
            for s in detectors
        ],
        "attribution": {
            "failed_jobs": len(expected),
            "decided": len(judged),
            "accuracy": correct / len(expected) if expected else None,
            "hardware_true": sum(expected.values()),
            "hardware_decided": sum(decided.get(job, False) for job in expected),
        },
        "lemon_nodes": {
            "truth": len(lemon_truth),
            "flagged": len(flagged),
            "recall": len(flagged & lemon_truth) / len(lemon_truth) if lemon_truth else None,
            "healthy_flagged_share": len(flagged & healthy) / len(healthy) if healthy else None,
        },
        "job_aware": score_job_aware(truth, incidents, crash_nodes),
        "failure_rate": {
            "measured_rf_per_1000_node_days": measured_rf,
            "true_rf_per_1000_node_days": true_rf,
            "relative_error": (measured_rf - true_rf) / true_rf
            if measured_rf is not None and true_rf
            else None,
            "measured_node_days": mttf["node_hours"] / 24,
            "true_node_days": truth.exposure_node_days,
        },
    }


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def render_evaluation(result: Mapping[str, Any]) -> str:
    """The evaluation as a table for a terminal."""
    lines = [
        "truth = planted faults scored; cens. = censored (began too near the span's end to be observable)",
        f"{'detector':<26} {'truth':>5} {'cens.':>5} {'found':>5} {'incid.':>6} {'FP':>4} {'precision':>9} "
        f"{'recall':>7} {'F1':>6} {'med delay h':>11} {'p95 delay h':>11} {'med lead h':>10}",
    ]
    for row in result["detectors"]:
        lines.append(
            f"{row['detector']:<26} {row['truth']:>5} {len(row['censored']):>5} {row['detected']:>5} "
            f"{row['incidents']:>6} "
            f"{row['false_positives']:>4} {_fmt(row['precision']):>9} {_fmt(row['recall']):>7} "
            f"{_fmt(row['f1']):>6} "
            f"{_fmt(row['median_delay_hours'], '{:.2f}'):>11} {_fmt(row['p95_delay_hours'], '{:.2f}'):>11} "
            f"{_fmt(row['median_lead_time_hours'], '{:.1f}'):>10}"
        )
    attribution = result["attribution"]
    lines.append("")
    lines.append(
        f"job-failure attribution: accuracy {_fmt(attribution['accuracy'])} "
        f"over {attribution['failed_jobs']} "
        f"FAILED/NODE_FAIL jobs ({attribution['hardware_true']} hardware in truth, "
        f"{attribution['hardware_decided']} attributed)"
    )
    lemons = result["lemon_nodes"]
    lines.append(
        f"lemon nodes: {lemons['flagged']} flagged, {lemons['truth']} in truth; "
        f"recall {_fmt(lemons['recall'])}, "
        f"healthy nodes flagged {_fmt(lemons['healthy_flagged_share'], '{:.2%}')}"
    )
    aware = result.get("job_aware")
    if aware is not None:
        per_1000 = _fmt(aware["false_lemon_verdicts_per_1000_node_days"])
        on_crash = aware["false_lemon_verdicts_on_crash_loop_nodes"]
        lines.append(
            f"job-aware: false lemon verdicts {per_1000} per 1000 node-days "
            f"({aware['false_lemon_verdicts']}, {on_crash} on the {aware['crash_loop_nodes']} nodes "
            "where crash-looping users' jobs failed); app-class incidents to job owners "
            f"{aware['app_incidents_to_owners']} of {aware['app_incidents']} (crash-looping users told: "
            f"{aware['crash_loop_users_told']} of {aware['crash_loop_users']})"
        )
    rate = result["failure_rate"]
    lines.append(
        f"failure rate r_f: measured {_fmt(rate['measured_rf_per_1000_node_days'])} vs true "
        f"{_fmt(rate['true_rf_per_1000_node_days'])} per 1000 node-days "
        f"(error {_fmt(rate['relative_error'], '{:+.2%}')}); exposure {rate['measured_node_days']:,.1f} vs "
        f"{rate['true_node_days']:,.1f} node-days"
    )
    return "\n".join(lines)
