"""docker/prometheus/alerts.yml: promtool's syntax check, its unit tests, and our own conventions.

``promtool`` comes with Debian's ``prometheus`` package (.ci/run installs it); without it these
tests fail, they do not skip: the rules would otherwise ship unchecked.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream.worker.metric_defs import exposed_series
from tests.integration.grafana.test_dashboards import check_promql

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "docker" / "prometheus" / "alerts.yml"
RULE_TESTS = Path(__file__).with_name("alerts.test.yml")
#: What the issue asks the rules to watch, and the rule watching each.
REQUIRED = {
    "worker down": "FaultstreamWorkerDown",
    "consumer lag growing": "FaultstreamConsumerLagGrowing",
    "input partition re-read or stalled": "FaultstreamInputRereads",
    "dead-letter rate": "FaultstreamDeadLetterRate",
    "ClickHouse flush failures": "FaultstreamClickHouseFlushFailing",
    "no events in from a topic": "FaultstreamNoEventsIn",
    "checkpoint age": "FaultstreamCheckpointStale",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: apt-get install prometheus (.ci/run does)")
    return path


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_rules_unit_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_is_unit_tested_firing() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {check["alertname"] for case in cases for check in case["alert_rule_test"] if check["exp_alerts"]}
    assert fired == {rule["alert"] for rule in rules()}


def test_each_watched_condition_has_a_rule() -> None:
    names = {rule["alert"] for rule in rules()}
    assert not {what: name for what, name in REQUIRED.items() if name not in names}


def test_every_rule_has_a_severity_a_summary_and_a_runbook() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warn"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["runbook"].split()) >= 8, f"{rule['alert']}: runbook too thin"


def slurm_series() -> dict[str, set[str]]:
    """The series the Slurm collector's and the remediator's /metrics show, with their labels."""
    from prometheus_client import Counter

    from stream.slurm.collector import CollectorMetrics
    from stream.slurm.remediate import RemediationMetrics

    series: dict[str, set[str]] = {}
    for metrics in (CollectorMetrics(), RemediationMetrics()):
        for metric in vars(metrics).values():
            if hasattr(metric, "_labelnames"):
                name = metric._name + ("_total" if isinstance(metric, Counter) else "")
                series[name] = set(metric._labelnames)
    return series


def test_every_expression_reads_metrics_the_worker_exposes() -> None:
    # `up` is Prometheus' own, per target; the Slurm services' metrics are theirs.
    metrics = {**exposed_series(), **slurm_series(), "up": {"job", "instance"}}
    for rule in rules():
        assert check_promql(rule["expr"], metrics) == [], rule["alert"]


def test_the_expression_checker_catches_a_renamed_metric() -> None:
    metrics = {**exposed_series(), "up": {"job", "instance"}}
    assert check_promql("rate(faultstream_sink_flush_failure_total[5m]) > 0", metrics)
