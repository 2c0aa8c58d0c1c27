"""``faultstream evaluate``: score the incidents in a store against a simulator's ground truth.

Matching rules (one truth fault is detected when an incident of the detector's kind names the
same place within the fault's time span):

==================  ====================  ===================================================
truth kind          incident kinds        matched when
==================  ====================  ===================================================
critical_hw         any ``critical``      same node and GPU; evidence spans the onset
ecc_degradation     ``ecc_trend``         same node and GPU; detected from onset to failure
xid_storm           ``xid_storm``         same node and GPU; detected from onset to end + 1 h
job_xid_storm       ``job_xid_storm``     the incident names the storm's job; its evidence
                                          overlaps the storm (up to end + 1 h)
nvlink_flapping     ``nvlink_flapping``   same node; detected from onset to end + 1 d
lemon_node          ``lemon_node``        same node, any time
==================  ====================  ===================================================

``xid_storm`` faults are faulty GPUs' storms; ``job_xid_storm`` faults are a job's own application
XIDs (its crash loop, no fault): a ``xid_storm`` incident on one of them matches no GPU storm, so
it is a false positive of the storm detector (a node verdict on a job's errors).

Precision counts incidents: an incident of a detector's kind that matches no truth fault of its
kind is a false positive. Delays are detection time minus onset; lead time (degradations) is the
failure time minus detection time.

Job-aware verdicts (issue 19): the simulator's crash-looping users (``crash_loop_users`` in the
truth) and job storms are no node's fault. :func:`score_job_aware` counts the lemon verdicts on
nodes that are not lemons in the truth (false lemon verdicts per 1,000 node-days of the fleet,
how many of them are on nodes where a crash-looping user's jobs failed, and on the nodes pinned
crash-looping users run every job on), the storm verdicts on GPUs whose storm was a job's, and
the incidents addressed to owners (``job_app_errors``, ``job_xid_storm``): how many went to the
right owner (a crash-looping user; the user of the storm's job), how many to anyone else.

A trace's faults that no input shows (``unobservable`` in the truth: a NIC, a fan, a PCIe link
trained narrow; :mod:`stream.simulator.trace`) are no detector's to find: they are counted apart
(``unobservable`` in the result: per level and class), never in a recall.

Censoring: a fault that began too close to the end of the simulated span to be observable as
what it is (a degradation with less than a day of samples, a flapping link that logged one burst
only, a lemon with less than two days of history), a storm cut short by its job's end to fewer
lines than the scenario's smallest storm,
or a lemon that had at most one critical fault in the span (no rule can tell it from a healthy
node's bad luck), is counted as *censored*: shown, but out of the recall. An incident that
matches a censored fault is not a false positive.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from schemas.outputs import IncidentKind
from schemas.timeutil import DAY_MS, HOUR_MS, parse_ts
from stream.settings import Settings
from stream.simulator.planted.flapping import FLAP_MIN_GAP_MS
from stream.simulator.trace import FAULT_KIND_UNOBSERVABLE
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
    by_job: bool = False  # matched by the job the incident names (an owner's incident), not the place


RULES = (
    _Rule("critical hardware (rules)", "critical_hw", None, "critical", True, 0),
    _Rule("ECC trend (River)", "ecc_degradation", frozenset({IncidentKind.ECC_TREND}), None, True, 0, DAY_MS),
    _Rule("XID storm (River)", "xid_storm", frozenset({IncidentKind.XID_STORM}), None, True, HOUR_MS),
    _Rule("job XID storm (owner)", "job_xid_storm", frozenset({IncidentKind.JOB_XID_STORM}), None, False,
          HOUR_MS, by_job=True),
    _Rule("NVLink flapping (River)", "nvlink_flapping", frozenset({IncidentKind.NVLINK_FLAPPING}), None,
          False, DAY_MS),
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
    #: Each detected fault's delay (hours), in truth order: pooled over cells by the matrix.
    delays_h: tuple[float, ...] = ()

    @property
    def max_delay_h(self) -> float | None:
        """The longest delay of a detected fault."""
        return max(self.delays_h) if self.delays_h else None

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


def _censored(rule: _Rule, fault: FaultTruth, truth: Truth) -> bool:
    if truth.span_end_ms - fault.onset_ms < rule.observable_after_ms:
        return True
    lines = fault.details.get("lines")
    if (
        fault.kind in ("xid_storm", "job_xid_storm")
        and isinstance(lines, int)
        and lines < truth.config.xid_storm_lines_min
    ):
        return True  # cut short by its job's end: fewer lines than any storm the scenario plants
    flapping = fault.kind == "nvlink_flapping"
    if flapping and (fault.end_ms or truth.span_end_ms) - fault.onset_ms < FLAP_MIN_GAP_MS:
        return True  # one burst before the span ended: no recurrence yet
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


def _job_hit(fault: FaultTruth, incident: Mapping[str, Any], end_ms: int) -> bool:
    """An owner's incident names the fault's job and its evidence overlaps the fault's span."""
    return (
        fault.job_id is not None
        and fault.job_id in (incident.get("jobs") or ())
        and incident["first_ms"] <= end_ms
        and incident["last_ms"] >= fault.onset_ms
    )


def _detected_ms(rule: _Rule, fault: FaultTruth, incident: Mapping[str, Any]) -> int:
    """When an incident detected the fault: its detection time; for an owner's incident (one per
    owner, several of their jobs), its first evidence if that falls within the fault, else the
    fault's onset (a later job's storm joined an incident already open)."""
    if rule.by_job:
        return max(int(incident["first_ms"]), fault.onset_ms)
    return int(incident["detected_ms"])


def score_detectors(truth: Truth, incidents: Iterable[Mapping[str, Any]]) -> list[DetectorScore]:
    """Score each detector of :data:`RULES` (pure: truth and incident rows in, table out).

    Incident rows need ``kind``, ``severity``, ``node``, ``gpu``, ``first_ms``, ``last_ms`` and
    ``detected_ms``.
    """
    rows = list(incidents)
    scores = []
    for rule in RULES:
        faults = [f for f in truth.faults if f.kind == rule.truth_kind]
        censored = [f for f in faults if _censored(rule, f, truth)]
        candidates = [i for i in rows if _matches(rule, i)]
        used: set[int] = set()
        delays: list[float] = []
        leads: list[float] = []
        missed: list[str] = []
        for fault in faults:
            start, end = _window(fault, truth.span_end_ms, rule.slack_ms)
            found = None
            for index, incident in enumerate(candidates):
                if rule.by_job:
                    hit = _job_hit(fault, incident, end)
                elif incident["node"] != fault.node or (
                    rule.per_gpu and fault.pci_bus_id and incident["gpu"] != fault.pci_bus_id
                ):
                    continue
                elif rule.truth_kind == "critical_hw":
                    hit = incident["first_ms"] <= start <= incident["last_ms"]
                else:
                    hit = start <= incident["detected_ms"] <= end
                if hit and (
                    found is None
                    or _detected_ms(rule, fault, incident) < _detected_ms(rule, fault, candidates[found])
                ):
                    found = index
            if fault in censored:
                if found is not None:
                    used.add(found)
                continue
            if found is None:
                missed.append(fault.fault_id)
                continue
            used.add(found)
            detected = _detected_ms(rule, fault, candidates[found])
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
                delays_h=tuple(delays),
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
    threshold
        The count the rule fires at, for a rule with one (a placeholder ``{}`` in ``name``).
    sweep
        Other counts it is also scored at: the matrix reports its precision at the detector's
        recall from them (the rule at its best threshold for that recall, not at ours).
    """

    name: str
    truth_kind: str
    per_gpu: bool
    threshold: int | None = None
    sweep: tuple[int, ...] = ()

    def named(self, threshold: int | None = None) -> str:
        """The rule's name at ``threshold`` (default: its own)."""
        return self.name.format(self.threshold if threshold is None else threshold)


#: The rules of thumb the issue names: ``DCGM XID > 0`` and "any DBE" pages, and fixed thresholds.
BASELINES: Final[tuple[Baseline, ...]] = (
    Baseline("XID > 0 (DCGM rule)", "critical_hw", True),
    Baseline("any DBE (DCGM rule)", "critical_hw", True),
    Baseline("SBE >= {} in 24 h (fixed)", "ecc_degradation", True, 100, (1, 3, 10, 30, 50, 100, 200, 500)),
    Baseline(">= {} XIDs in 1 h (fixed)", "xid_storm", True, 10, (2, 3, 5, 7, 10, 15, 20, 30, 50, 100)),
    Baseline(">= {} XID 144 on a node in 1 d (fixed)", "nvlink_flapping", False, 5, (1, 2, 3, 5, 8, 12, 20)),
    Baseline(">= {} hardware job failures (fixed)", "lemon_node", False, 2, (1, 2, 3, 4, 5, 6)),
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


@dataclass(frozen=True, slots=True)
class BaselineInputs:
    """The stored raw events the baseline rules read (:func:`baseline_inputs`)."""

    #: GPU XIDs: (node, PCI bus id, ts, code).
    xids: list[tuple[str, str, int, int]]
    #: ECC samples with an error delta: node, pci_bus_id, ts_ms, sbe_delta, dbe_delta.
    ecc: list[dict[str, Any]]
    #: Hardware-attributed failures per evidence node: node, ts_ms.
    failures: list[dict[str, Any]]
    lemon_window_ms: int


def baseline_inputs(client: Client, settings: Settings) -> BaselineInputs:
    """Read what the baseline rules need from the store."""
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
    return BaselineInputs(xids, ecc, failures, settings.core_config().lemon.window_ms)


def rule_alerts(
    inputs: BaselineInputs, baseline: Baseline, threshold: int | None = None
) -> list[dict[str, Any]]:
    """The alerts ``baseline`` raises on ``inputs`` (at ``threshold``, default its own): rows with
    ``node``, ``gpu`` (PCI bus id, or "" for a node), ``first_ms``, ``last_ms`` and
    ``detected_ms``, like incident rows."""
    at = baseline.threshold if threshold is None else threshold
    index = BASELINES.index(baseline)
    xids, ecc = inputs.xids, inputs.ecc
    if index == 0:
        return _episodes((node, gpu, ts) for node, gpu, ts, _ in xids)
    if index == 1:
        return _episodes((r["node"], r["pci_bus_id"], r["ts_ms"]) for r in ecc if r["dbe_delta"])
    assert at is not None
    if index == 2:
        sbe = ((r["node"], r["pci_bus_id"], r["ts_ms"], r["sbe_delta"]) for r in ecc if r["sbe_delta"])
        return _episodes(_sliding_hits(sbe, DAY_MS, at))
    if index == 3:
        return _episodes(_sliding_hits(((node, gpu, ts, 1) for node, gpu, ts, _ in xids), HOUR_MS, at))
    if index == 4:
        nvlink = ((node, "", ts, 1) for node, _, ts, xid in xids if xid == 144)
        return _episodes(_sliding_hits(nvlink, DAY_MS, at))
    failed = ((r["node"], "", r["ts_ms"], 1) for r in inputs.failures)
    return _episodes(_sliding_hits(failed, inputs.lemon_window_ms, at))


def baseline_alerts(client: Client, settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """The alerts each of :data:`BASELINES` raises on the store's raw events, by baseline name."""
    inputs = baseline_inputs(client, settings)
    return {baseline.named(): rule_alerts(inputs, baseline) for baseline in BASELINES}


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
    censored = [f for f in faults if _censored(rule, f, truth)]
    for fault in faults:
        if truth_kind == "critical_hw":
            start, end = fault.onset_ms, fault.onset_ms + 6 * HOUR_MS
        else:
            start, end = _window(fault, truth.span_end_ms, rule.slack_ms)
        if rule.by_job:
            hits = [index for index, row in enumerate(rows) if _job_hit(fault, row, end)]
        else:
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
        detected = min(_detected_ms(rule, fault, rows[index]) for index in hits)
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
        delays_h=tuple(delays),
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
        "max_delay_hours": score.max_delay_h,
        "delays_hours": [round(delay, 4) for delay in score.delays_h],
        "median_lead_time_hours": score.median_lead_h,
        "false_alarms_per_1000_node_days": 1000.0 * score.false_positives / node_days if node_days else None,
        "missed": list(score.missed),
        "censored": list(score.censored),
    }


def compare_with_baselines(
    truth: Truth,
    incidents: Sequence[Mapping[str, Any]],
    alerts: Mapping[str, Sequence[Mapping[str, Any]]],
    inputs: BaselineInputs | None = None,
) -> list[dict[str, Any]]:
    """Each detector and its baseline rules, scored alike: rows with ``kind`` and ``rule``
    (``detector`` or ``baseline``), so that a table shows them side by side. With ``inputs``, a
    baseline row also has ``sweep``: the rule at each of its sweep thresholds (``threshold``,
    ``truth``, ``detected``, ``incidents``, ``false_positives``, ``median_delay_hours``,
    ``median_lead_time_hours``)."""
    node_days = truth.config.nodes * (truth.span_end_ms - truth.span_start_ms) / DAY_MS
    out = []
    for rule in RULES:
        mine = [row for row in incidents if _matches(rule, row)]
        score = score_alerts(truth, rule.truth_kind, mine, rule.per_gpu, rule.detector)
        out.append({"kind": rule.truth_kind, "rule": "detector", **_score_row(score, node_days)})
        for baseline in BASELINES:
            if baseline.truth_kind != rule.truth_kind:
                continue
            name = baseline.named()
            score = score_alerts(truth, rule.truth_kind, alerts.get(name, ()), baseline.per_gpu, name)
            row: dict[str, Any] = {"kind": rule.truth_kind, "rule": "baseline"}
            row.update(_score_row(score, node_days))
            if inputs is not None and baseline.sweep:
                row["sweep"] = []
                for threshold in baseline.sweep:
                    tried = score_alerts(
                        truth,
                        rule.truth_kind,
                        rule_alerts(inputs, baseline, threshold),
                        baseline.per_gpu,
                        baseline.named(threshold),
                    )
                    row["sweep"].append(
                        {
                            "threshold": threshold,
                            "truth": tried.truth,
                            "detected": tried.detected,
                            "incidents": tried.incidents,
                            "false_positives": tried.false_positives,
                            "median_delay_hours": tried.median_delay_h,
                            "median_lead_time_hours": tried.median_lead_h,
                        }
                    )
            out.append(row)
    return out


def score_job_aware(
    truth: Truth, incidents: Iterable[Mapping[str, Any]], crash_loop_nodes: Iterable[str]
) -> dict[str, Any]:
    """False node verdicts on application-class evidence, and the incidents routed to job owners
    (pure).

    Parameters
    ----------
    truth
        The simulator's truth (lemon nodes, crash-looping users and their pinned nodes, job
        storms, span and fleet size).
    incidents
        Incident rows with ``incident_id``, ``kind``, ``node``, ``owner`` (the addressee of an
        owner's incident, ``job_app_errors`` or ``job_xid_storm``, empty for the other kinds) and,
        to score storms, ``gpu``, ``first_ms``, ``last_ms``, ``detected_ms`` and ``jobs``.
    crash_loop_nodes
        Nodes where a crash-looping user's jobs failed.
    """
    rows = list(incidents)
    lemons = set(truth.lemon_nodes)
    crash_nodes = set(crash_loop_nodes)
    pinned = set(truth.crash_loop_nodes.values())
    false_lemons = {(i["incident_id"], i["node"]) for i in rows if i["kind"] == IncidentKind.LEMON_NODE}
    false_lemons = {(iid, node) for iid, node in false_lemons if node not in lemons}
    node_days = truth.config.nodes * (truth.span_end_ms - truth.span_start_ms) / DAY_MS
    users = set(truth.crash_loop_users)
    # Job storms: the job's own application XIDs. Told to its owner, or judged a GPU's storm.
    every_storm = [f for f in truth.faults if f.kind == "job_xid_storm"]
    storm_jobs = {f.job_id: f.details.get("user", "") for f in every_storm if f.job_id is not None}
    # Scored as the detectors' rows are: a storm its job's end cut short is censored.
    smallest = truth.config.xid_storm_lines_min
    job_storms = [f for f in every_storm if f.details.get("lines", smallest) >= smallest]
    node_storms = [i for i in rows if i["kind"] == IncidentKind.XID_STORM]
    owned = [i for i in rows if i["kind"] == IncidentKind.JOB_XID_STORM]
    judged = routed = 0
    for fault in job_storms:
        end = (fault.end_ms or truth.span_end_ms) + HOUR_MS
        place = (fault.node, fault.pci_bus_id)
        judged += any(
            (i["node"], i["gpu"]) == place and fault.onset_ms <= i["detected_ms"] <= end for i in node_storms
        )
        routed += any(_job_hit(fault, i, end) and i.get("owner") == fault.details.get("user") for i in owned)
    # Every incident addressed to an owner, and whether it went to the right one.
    right: dict[str, bool] = {}
    for i in rows:
        if i["kind"] == IncidentKind.JOB_APP_ERRORS:
            right[i["incident_id"]] = i.get("owner", "") in users
        elif i["kind"] == IncidentKind.JOB_XID_STORM:
            named = [storm_jobs[job] for job in i.get("jobs") or () if job in storm_jobs]
            right[i["incident_id"]] = bool(i.get("owner")) and i.get("owner") in named
    told = {i.get("owner", "") for i in rows if i["kind"] == IncidentKind.JOB_APP_ERRORS}
    per_1000 = 1000 * len(false_lemons) / node_days if node_days else None
    return {
        "node_days": node_days,
        "false_lemon_verdicts": len(false_lemons),
        "false_lemon_verdicts_per_1000_node_days": per_1000,
        "false_lemon_verdicts_on_crash_loop_nodes": sum(1 for _, node in false_lemons if node in crash_nodes),
        "false_lemon_verdicts_on_pinned_nodes": sum(1 for _, node in false_lemons if node in pinned),
        "crash_loop_nodes": len(crash_nodes),
        "crash_loop_nodes_that_are_lemons": len(crash_nodes & lemons),
        "pinned_nodes": len(pinned),
        "crash_loop_users": len(users),
        "app_incidents": len(right),
        "app_incidents_to_owners": sum(right.values()),
        "crash_loop_users_told": len(users & told),
        "job_storms": len(job_storms),
        "job_storms_to_owners": routed,
        "node_storm_verdicts_on_job_storms": judged,
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
               JSONExtractString(evidence, 'owner') AS owner,
               JSONExtract(evidence, 'jobs', 'Array(String)') AS jobs
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
    comparison = None
    if baselines:
        inputs = baseline_inputs(client, settings)
        alerts = {baseline.named(): rule_alerts(inputs, baseline) for baseline in BASELINES}
        comparison = compare_with_baselines(truth, incidents, alerts, inputs)
    unobservable = [f for f in truth.faults if f.kind == FAULT_KIND_UNOBSERVABLE]
    return {
        **({"comparison": comparison} if comparison is not None else {}),
        **({"unobservable": _unobservable(unobservable)} if unobservable else {}),
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
                "max_delay_hours": s.max_delay_h,
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
            "healthy": len(healthy),
            "healthy_flagged": len(flagged & healthy),
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


def _unobservable(faults: Sequence[FaultTruth]) -> dict[str, Any]:
    """A trace's faults no input shows: how many, per level and per class (most first)."""
    levels = Counter(str(f.details.get("trace_level")) for f in faults)
    classes = Counter(str(f.details.get("trace_class")) for f in faults)
    return {
        "faults": len(faults),
        "by_level": dict(levels.most_common()),
        "by_class": dict(classes.most_common()),
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
            f"{aware['crash_loop_users_told']} of {aware['crash_loop_users']}); job storms told to "
            f"their owners {aware.get('job_storms_to_owners', 0)} of {aware.get('job_storms', 0)}, judged "
            f"node storms {aware.get('node_storm_verdicts_on_job_storms', 0)}; false lemon verdicts on "
            f"the {aware.get('pinned_nodes', 0)} nodes a crash-looping user is pinned to: "
            f"{aware.get('false_lemon_verdicts_on_pinned_nodes', 0)}"
        )
    hidden = result.get("unobservable")
    if hidden is not None:
        shares = ", ".join(f"{name} {count}" for name, count in hidden["by_class"].items())
        lines.append(
            f"undetectable by design (the trace's faults no XID or ECC counter shows, not scored): "
            f"{hidden['faults']} ({shares})"
        )
    rate = result["failure_rate"]
    lines.append(
        f"failure rate r_f: measured {_fmt(rate['measured_rf_per_1000_node_days'])} vs true "
        f"{_fmt(rate['true_rf_per_1000_node_days'])} per 1000 node-days "
        f"(error {_fmt(rate['relative_error'], '{:+.2%}')}); exposure {rate['measured_node_days']:,.1f} vs "
        f"{rate['true_node_days']:,.1f} node-days"
    )
    return "\n".join(lines)
