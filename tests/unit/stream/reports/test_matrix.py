"""The matrix table and the baseline rules' alert logic (pure parts)."""

from __future__ import annotations

from stream.reports.evaluation import _episodes, _sliding_hits, score_alerts
from stream.reports.matrix import pool_rows, render_matrix
from stream.simulator import SimulationConfig
from stream.simulator.truth import FaultTruth, Truth

H = 3_600_000
T0 = 1_704_067_200_000


def truth(*faults):
    return Truth(
        config=SimulationConfig(nodes=10, days=2),
        span_start_ms=T0,
        span_end_ms=T0 + 48 * H,
        true_rf_per_1000_node_days=0.0,
        exposure_node_days=1.0,
        hardware_failures=0,
        jobs=0,
        jobs_failed=0,
        utilization=0.0,
        faults=tuple(faults),
        job_failures=(),
        xid_counts={},
    )


def test_sliding_hits_fire_when_a_window_reaches_the_count_and_episodes_dedup():
    events = [("n1", "g", T0 + k * 60_000, 1) for k in range(12)]  # 12 in 12 minutes
    events += [("n2", "g", T0 + k * 2 * H, 1) for k in range(12)]  # 12 spread over a day
    hits = _sliding_hits(events, H, 10)
    assert {node for node, _, _ in hits} == {"n1"}
    assert [row["detected_ms"] for row in _episodes(hits)] == [T0 + 9 * 60_000]


def test_a_baseline_alert_scores_like_a_detector():
    fault = FaultTruth(fault_id="hw-1", kind="critical_hw", node="n1", onset_ms=T0 + H, gpu=0,
                       pci_bus_id="0000:07:00")  # fmt: skip
    alerts = [
        {"node": "n1", "gpu": "0000:07:00", "first_ms": T0 + H, "last_ms": T0 + H, "detected_ms": T0 + H},
        {
            "node": "n2",
            "gpu": "0000:07:00",
            "first_ms": T0,
            "last_ms": T0,
            "detected_ms": T0,
        },  # nothing there
    ]
    score = score_alerts(truth(fault), "critical_hw", alerts, per_gpu=True, name="XID > 0")
    assert (score.truth, score.detected, score.false_positives) == (1, 1, 1)


def test_pooled_rows_and_the_table():
    def row(rule, detector, truth, detected, incidents, fp, lead):
        return {"kind": "ecc_degradation", "rule": rule, "detector": detector, "truth": truth, "detected": detected,
                "incidents": incidents, "false_positives": fp, "median_lead_time_hours": lead,
                "median_delay_hours": 1.0, "missed": []}  # fmt: skip

    results = [
        {"cell": "a", "seed": 1, "family": "ecc_degradation", "node_days": 500.0,
         "lemon_nodes": {"healthy_flagged_share": 0.0},
         "comparison": [row("detector", "trend", 4, 4, 4, 0, 50.0), row("baseline", "fixed", 4, 2, 3, 1, 10.0)]},
        {"cell": "b", "seed": 1, "family": "ecc_degradation", "node_days": 500.0,
         "lemon_nodes": {"healthy_flagged_share": 0.0},
         "comparison": [row("detector", "trend", 6, 5, 5, 0, 30.0), row("baseline", "fixed", 6, 6, 7, 1, 20.0)]},
    ]  # fmt: skip
    # The baseline at two more thresholds: at 1 it finds all ten (8 false alarms), at 5 eight.
    results[0]["comparison"][1]["sweep"] = [sweep(1, 4, 4, 8, 4, 1.0), sweep(5, 4, 2, 3, 1)]
    results[1]["comparison"][1]["sweep"] = [sweep(1, 6, 6, 10, 4, 3.0), sweep(5, 6, 6, 7, 1)]
    pooled = {r["detector"]: r for r in pool_rows(results)}
    assert pooled["trend"]["recall"] == 0.9 and pooled["trend"]["precision"] == 1.0
    assert pooled["trend"]["median_lead_hours"] == 40.0
    assert pooled["fixed"]["false_alarms_per_1000_node_days"] == 2.0
    # Precision at the detector's recall (0.9): threshold 5 reaches 0.8 only, 1 reaches 1.0.
    assert (
        pooled["fixed"]["precision_at_detector_recall"],
        pooled["fixed"]["threshold_at_detector_recall"],
    ) == (
        10 / 18,
        1,
    )
    assert pooled["trend"]["precision_at_detector_recall"] is None
    table = render_matrix(results, (1,))
    assert "| ecc_degradation | detector | trend | 2 | 10 | 9 | 9 | 1.00 | 0.90 |  | 40.0 |" in table
    assert (
        "| ecc_degradation | baseline | fixed | 2 | 10 | 8 | 10 | 0.80 | 0.80 | 0.56 (>= 1, delay 2.00 h) | 15.0 |"
        in table
    )


def sweep(threshold, truth, detected, incidents, fp, delay=None):
    return {"threshold": threshold, "truth": truth, "detected": detected, "incidents": incidents,
            "false_positives": fp, "median_delay_hours": delay, "median_lead_time_hours": None}  # fmt: skip


def test_the_critical_delays_lemon_share_and_job_aware_figures_pool_over_cells():
    from stream.reports.matrix import pool_job_aware

    def critical(delays):
        return {"kind": "critical_hw", "rule": "detector", "detector": "rules", "truth": len(delays),
                "detected": len(delays), "incidents": len(delays), "false_positives": 0,
                "median_lead_time_hours": None, "median_delay_hours": 0.0, "missed": [],
                "delays_hours": delays}  # fmt: skip

    aware = {"node_days": 1000.0, "false_lemon_verdicts": 1, "false_lemon_verdicts_on_crash_loop_nodes": 1,
             "false_lemon_verdicts_on_pinned_nodes": 0, "pinned_nodes": 1, "crash_loop_users": 1,
             "crash_loop_users_told": 1, "app_incidents": 3, "app_incidents_to_owners": 2, "job_storms": 4,
             "job_storms_to_owners": 3, "node_storm_verdicts_on_job_storms": 1}  # fmt: skip
    results = [
        {"cell": "a", "seed": 1, "family": "lemon_node", "kinds": ["lemon_node"], "node_days": 1000.0,
         "lemon_nodes": {"healthy_flagged_share": 0.01, "healthy": 100, "healthy_flagged": 1},
         "job_aware": aware, "comparison": [critical([0.0] * 19 + [2.0])]},
        {"cell": "b", "seed": 1, "family": "job_aware", "kinds": [], "node_days": 3000.0,
         "lemon_nodes": {"healthy_flagged_share": 0.5, "healthy": 300, "healthy_flagged": 150},
         "job_aware": {**aware, "node_days": 3000.0}, "comparison": [critical([0.0, 5.0])]},
    ]  # fmt: skip
    [row] = pool_rows(results)
    assert (row["truth"], row["p95_delay_hours"], row["max_delay_hours"]) == (22, 2.0, 5.0)
    pooled = pool_job_aware(results)
    assert pooled["false_lemon_verdicts_per_1000_node_days"] == 0.5  # 2 in 4,000 node-days
    assert (pooled["job_storms_to_owners"], pooled["job_storms"]) == (6, 8)
    # The healthy share pools the lemon cells only (the job-aware cell's own lemons are not scored).
    assert pooled["lemon_cells_healthy_flagged_share"] == 0.01
    table = render_matrix(results, (1,))
    assert "detection delay p95 2.00 h, max 5.00 h" in table
    assert "healthy nodes flagged 1 of 100 (1.00%)" in table
    assert "false lemon verdicts 2 (0.500 per 1,000 node-days" in table
    assert "job storms told to their owners 6 of 8" in table
    assert "| a | 1 | 1 | 1 | 0 | 1 of 1 | 2 of 3 | - |" in table  # per cell: no lemon detector row here


def test_the_html_page_has_the_chart_and_the_table(tmp_path):
    from stream.reports.matrix import write_matrix_html

    row = {"kind": "lemon_node", "rule": "detector", "detector": "lemons", "truth": 2, "detected": 2,
           "incidents": 2, "false_positives": 0, "median_lead_time_hours": None, "median_delay_hours": 5.0,
           "missed": []}  # fmt: skip
    results = [{"cell": "c", "seed": 1001, "family": "lemon_node", "node_days": 224.0,
                "lemon_nodes": {"healthy_flagged_share": 0.0}, "comparison": [row]}]  # fmt: skip
    page = tmp_path / "matrix.html"
    write_matrix_html(results, (1001,), page)
    text = page.read_text()
    assert 'data-chart="matrix-precision-recall"' in text and "<svg" in text
    assert "lemon_node: lemons precision 1.00" in text and "| lemon_node | detector | lemons |" in text
