"""Scoring incidents against a ground truth: matching, precision, recall, delays, lead times."""

import pytest

from stream.reports.evaluation import score_detectors
from stream.simulator import SimulationConfig
from stream.simulator.truth import FaultTruth, Truth

H = 3_600_000
T0 = 1_704_067_200_000


def truth(*faults):
    return Truth(
        config=SimulationConfig(nodes=4, days=2),
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


def incident(kind, node, gpu, detected, first=None, last=None, severity="warn"):
    first = detected if first is None else first
    return {"kind": kind, "severity": severity, "node": node, "gpu": gpu, "first_ms": first,
            "last_ms": last if last is not None else detected, "detected_ms": detected}  # fmt: skip


def by_name(scores):
    return {s.detector.split(" (")[0]: s for s in scores}


def test_critical_faults_match_incidents_whose_evidence_spans_the_onset():
    faults = [
        FaultTruth("hw-1", "critical_hw", "n1", T0 + H, gpu=0, pci_bus_id="0000:07:00", xid=79),
        FaultTruth("hw-2", "critical_hw", "n2", T0 + 2 * H, gpu=1, pci_bus_id="0000:0f:00", xid=48),
    ]
    rows = [
        incident("gpu_bus", "n1", "0000:07:00", T0 + H, severity="critical"),
        incident("gpu_memory", "n2", "0000:07:00", T0 + 2 * H, severity="critical"),  # wrong GPU
    ]
    score = by_name(score_detectors(truth(*faults), rows))["critical hardware"]
    assert (score.truth, score.detected, score.missed) == (2, 1, ("hw-2",))
    assert score.median_delay_h == 0.0


def test_degradation_precision_recall_and_lead_time():
    degrading = FaultTruth("deg-1", "ecc_degradation", "n1", T0, gpu=0, pci_bus_id="0000:07:00",
                           details={"failure": "2024-01-02T00:00:00.000Z"})  # fmt: skip
    rows = [
        incident("ecc_trend", "n1", "0000:07:00", T0 + 12 * H),  # 12 h after onset, 12 h before failure
        incident("ecc_trend", "n3", "0000:07:00", T0 + 5 * H),  # nothing planted there: false alarm
    ]
    score = by_name(score_detectors(truth(degrading), rows))["ECC trend"]
    assert score.recall == 1.0
    assert score.precision == pytest.approx(0.5)
    assert score.median_delay_h == pytest.approx(12.0)
    assert score.median_lead_h == pytest.approx(12.0)


def test_detection_before_onset_or_after_the_window_does_not_count():
    storm = FaultTruth("st-1", "xid_storm", "n1", T0 + 10 * H, gpu=0, pci_bus_id="0000:07:00",
                       details={"end": "2024-01-01T11:00:00.000Z"})  # fmt: skip
    early = [incident("xid_storm", "n1", "0000:07:00", T0 + 9 * H)]
    late = [incident("xid_storm", "n1", "0000:07:00", T0 + 12 * H + 1)]
    inside = [incident("xid_storm", "n1", "0000:07:00", T0 + 12 * H)]  # end + 1 h slack
    for rows, detected in ((early, 0), (late, 0), (inside, 1)):
        assert by_name(score_detectors(truth(storm), rows))["XID storm"].detected == detected


def test_faults_too_close_to_the_end_or_cut_short_are_censored_not_missed():
    late = FaultTruth("deg-2", "ecc_degradation", "n1", T0 + 40 * H, gpu=0, pci_bus_id="0000:07:00")
    # A flapping link on one GPU is one (the detector no longer waits for a second GPU).
    unspread = FaultTruth(
        "flap-1", "nvlink_flapping", "n2", T0, details={"gpus": [3], "end": "2024-01-01T05:00:00Z"}
    )
    # A storm whose job ended after 3 of its lines: fewer than the scenario's smallest storm (40).
    cut = FaultTruth("storm-1", "xid_storm", "n3", T0, gpu=0, pci_bus_id="0000:07:00",
                     details={"end": "2024-01-01T00:01:00Z", "lines": 3})  # fmt: skip
    # A flapping link that logged its first burst only, 20 s, before the span ended: no recurrence yet.
    once = FaultTruth("flap-2", "nvlink_flapping", "n4", T0 + 47 * H, details={"end": "2024-01-02T23:00:20Z"})
    scores = by_name(score_detectors(truth(late, unspread, cut, once), []))
    assert (scores["ECC trend"].truth, scores["ECC trend"].censored) == (0, ("deg-2",))
    flapping = scores["NVLink flapping"]
    assert (flapping.truth, flapping.missed, flapping.censored) == (1, ("flap-1",), ("flap-2",))
    assert (scores["XID storm"].truth, scores["XID storm"].censored) == (0, ("storm-1",))


def test_job_aware_scores_count_false_lemons_and_incidents_routed_to_owners():
    from dataclasses import replace

    from stream.reports.evaluation import render_evaluation, score_job_aware

    planted = replace(truth(), lemon_nodes=("n1",), crash_loop_users=("user009",))
    rows = [
        {"incident_id": "a", "kind": "lemon_node", "node": "n1", "owner": ""},  # a true lemon
        {"incident_id": "b", "kind": "lemon_node", "node": "n2", "owner": ""},  # false, where user009 crashed
        {"incident_id": "b", "kind": "lemon_node", "node": "n2", "owner": ""},  # the same verdict again
        {"incident_id": "c", "kind": "lemon_node", "node": "n3", "owner": ""},  # false
        {"incident_id": "d", "kind": "job_app_errors", "node": "n2", "owner": "user009"},
        {"incident_id": "e", "kind": "job_app_errors", "node": "n4", "owner": "user003"},
    ]
    scores = score_job_aware(planted, rows, crash_loop_nodes=["n1", "n2"])
    assert scores["node_days"] == 8  # 4 nodes x 2 days
    assert scores["false_lemon_verdicts"] == 2
    assert scores["false_lemon_verdicts_per_1000_node_days"] == 250
    assert scores["false_lemon_verdicts_on_crash_loop_nodes"] == 1
    assert scores["crash_loop_nodes_that_are_lemons"] == 1
    assert (scores["app_incidents"], scores["app_incidents_to_owners"], scores["crash_loop_users_told"]) == (
        2,
        1,
        1,
    )
    text = render_evaluation(
        {
            "detectors": [],
            "attribution": {"accuracy": None, "failed_jobs": 0, "hardware_true": 0, "hardware_decided": 0},
            "lemon_nodes": {"flagged": 2, "truth": 1, "recall": 1.0, "healthy_flagged_share": 0.5},
            "job_aware": scores,
            "failure_rate": {
                "measured_rf_per_1000_node_days": None,
                "true_rf_per_1000_node_days": 0.0,
                "relative_error": None,
                "measured_node_days": 0.0,
                "true_node_days": 1.0,
            },
        }
    )
    assert "false lemon verdicts 250.000 per 1000 node-days (2, 1 on the 2 nodes" in text
    assert "app-class incidents to job owners 1 of 2 (crash-looping users told: 1 of 1)" in text


def test_a_jobs_storm_is_scored_by_its_owner_and_a_node_storm_on_it_is_a_false_alarm():
    from dataclasses import replace

    from stream.reports.evaluation import score_job_aware

    end = "2024-01-01T11:00:00.000Z"
    gpu_storm = FaultTruth("storm-1", "xid_storm", "n1", T0 + 10 * H, gpu=0, pci_bus_id="0000:07:00",
                           job_id="j0", details={"end": end, "user": "bob"})  # fmt: skip
    job_storm = FaultTruth("storm-2", "job_xid_storm", "n2", T0 + 10 * H, gpu=1, pci_bus_id="0000:0f:00",
                           job_id="j1", details={"end": end, "user": "ann"})  # fmt: skip
    rows = [
        {**incident("xid_storm", "n1", "0000:07:00", T0 + 10 * H + 60_000), "incident_id": "a", "owner": ""},
        # The job's storm judged the GPU's: a node verdict on a job's errors.
        {**incident("xid_storm", "n2", "0000:0f:00", T0 + 10 * H + 60_000), "incident_id": "b", "owner": ""},
        # The job's storm told to its owner: one incident per owner, naming the job.
        {**incident("job_xid_storm", "n2", "0000:0f:00", T0 + 10 * H + 120_000), "incident_id": "c",
         "owner": "ann", "jobs": ["j1"]},
        # Another of ann's: it names no planted storm's job.
        {**incident("job_xid_storm", "n3", "0000:07:00", T0 + 20 * H), "incident_id": "d", "owner": "ann",
         "jobs": ["j9"]},
    ]  # fmt: skip
    scores = by_name(score_detectors(truth(gpu_storm, job_storm), rows))
    storm, owned = scores["XID storm"], scores["job XID storm"]
    assert (storm.truth, storm.detected, storm.false_positives) == (1, 1, 1)
    assert (owned.truth, owned.detected, owned.false_positives) == (1, 1, 1)
    assert owned.delays_h == (120_000 / H,)
    aware = score_job_aware(replace(truth(gpu_storm, job_storm)), rows, crash_loop_nodes=[])
    assert (
        aware["job_storms"],
        aware["job_storms_to_owners"],
        aware["node_storm_verdicts_on_job_storms"],
    ) == (
        1,
        1,
        1,
    )
    assert (aware["app_incidents"], aware["app_incidents_to_owners"]) == (2, 1)
