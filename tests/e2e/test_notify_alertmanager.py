"""`faultstream notify` against a real Alertmanager (API v2) and the real broker.

Incident messages are published to the incidents topic as the worker publishes them (keyed by
node, JSON of ``Incident.to_dict``), repeats included; Alertmanager's own API must then show each
incident once, in its newest state, resolved when the incident is — also when the resolution was
published while the notifier was down.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from tests.services import kafka
from tests.services.prometheus import Service, get_json, start_alertmanager
from tests.services.worker import cli

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]

ROOT = Path(__file__).resolve().parents[2]
RESEND_S = 2  # open alerts end 4 x this after a post: 8 s without a re-send


def incident(incident_id: str, version: int, *, severity: str = "critical", status: str = "open",
             evidence: int = 1, node: str = "node0007") -> dict[str, Any]:  # fmt: skip
    return {
        "incident_id": incident_id, "kind": "gpu_bus", "severity": severity, "status": status,
        "cluster": "sim", "node": node, "gpu": "0000:07:00", "first_evidence": "2024-01-03T10:00:00.000Z",
        "last_evidence": "2024-01-03T10:05:00.000Z", "detected": "2024-01-03T10:05:00.000Z",
        "detector": "xid_rules", "score": 1.0, "action": "drain the node", "summary": f"XID 79 on {node}",
        "evidence": {"xids": [79]}, "evidence_count": evidence, "version": version,
    }  # fmt: skip


async def _publish(bootstrap: str, topic: str, incidents: list[dict[str, Any]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for item in incidents:
            await producer.send_and_wait(topic, json.dumps(item).encode(), key=item["node"].encode())
    finally:
        await producer.stop()


class Notifier:
    """`faultstream notify` as a background process."""

    def __init__(self, env: dict[str, str], log: Path, resend_s: float = RESEND_S) -> None:
        self.log_path = log
        env = {**os.environ, **env, "FAULTSTREAM_NOTIFY_RESEND_SECONDS": str(resend_s)}
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stream.cli", "notify"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        assert self.process.returncode == 0, self.log_path.read_text()


def shown(alertmanager: Service) -> list[dict[str, Any]]:
    """The incident alerts Alertmanager's API lists (active ones: resolved alerts are not listed)."""
    alerts = get_json(f"{alertmanager.url}/api/v2/alerts")
    return [a for a in alerts if a["labels"].get("alertname") == "FaultstreamIncident"]


def eventually(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not seen in {timeout:.0f} s: {what}"
        time.sleep(0.3)


@pytest.fixture
def setup(bootstrap: str, tmp_path: Path) -> Iterator[tuple[dict[str, str], Service]]:
    env = kafka.deployment_env(bootstrap, f"n{uuid.uuid4().hex[:8]}", 2)
    cli(env, "init-kafka")
    alertmanager = start_alertmanager(tmp_path / "alertmanager")
    env |= {
        "FAULTSTREAM_ALERTMANAGER_URL": alertmanager.url,
        "FAULTSTREAM_NOTIFY_GROUP": f"notify-{uuid.uuid4().hex[:8]}",
    }
    try:
        yield env, alertmanager
    finally:
        alertmanager.stop()
        kafka.delete_deployment_topics(env)


def test_each_incident_is_one_alert_updated_and_resolved(
    setup: tuple[dict[str, str], Service], tmp_path: Path
) -> None:
    env, alertmanager = setup
    topic = env["FAULTSTREAM_TOPIC_INCIDENTS"]

    def publish(*items: dict[str, Any]) -> None:
        asyncio.run(_publish(env["FAULTSTREAM_KAFKA_BOOTSTRAP"], topic, list(items)))

    def by_id() -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for alert in shown(alertmanager):
            out.setdefault(alert["labels"]["incident_id"], []).append(alert)
        return out

    # Published before the notifier starts: a new group reads from the beginning.
    publish(incident("a", 2), incident("b", 2, severity="warn", node="node0011"), incident("a", 2))
    notifier = Notifier(env, tmp_path / "notify.log")
    try:
        eventually("a and b", lambda: set(by_id()) == {"a", "b"})
        alerts = by_id()
        assert [len(alerts["a"]), len(alerts["b"])] == [1, 1]
        [a] = alerts["a"]
        assert a["labels"] == {
            "alertname": "FaultstreamIncident", "incident_id": "a", "severity": "critical",
            "kind": "gpu_bus", "cluster": "sim", "node": "node0007", "gpu": "0000:07:00",
        }  # fmt: skip
        assert a["annotations"]["summary"] == "XID 79 on node0007"
        assert a["annotations"]["action"] == "drain the node"
        assert a["annotations"]["evidence_count"] == "1"
        assert a["status"]["state"] == "active"

        # An update, then a stale repeat of the old version: the newest state shows, once.
        publish(incident("a", 4, status="updated", evidence=2), incident("a", 2))
        eventually("a's update", lambda: by_id()["a"][0]["annotations"]["evidence_count"] == "2")
        time.sleep(2)  # the stale repeat has been read by now
        alerts = by_id()
        assert len(alerts["a"]) == 1 and alerts["a"][0]["annotations"]["version"] == "4"

        # Severity raised: one alert still, under the new labels (the old ones resolved).
        publish(incident("b", 4, severity="critical", evidence=3, node="node0011"))
        eventually(
            "b raised", lambda: [x["labels"]["severity"] for x in by_id().get("b", [])] == ["critical"]
        )

        # Open alerts outlive their first end time (4 x the re-send interval) while re-posted.
        time.sleep(RESEND_S * 4 + 3)
        assert set(by_id()) == {"a", "b"}
    finally:
        notifier.stop()

    # Resolved while the notifier is down: applied once it is back (its group resumes there). The
    # restarts re-send every 60 s, so the open alerts they post last 4 min: a goes within seconds
    # because it was resolved, not because it expired.
    notifier = Notifier(env, tmp_path / "notify.log", resend_s=60)
    time.sleep(3)  # its first post: the open incidents, found by reading the topic again
    notifier.stop()
    publish(incident("a", 5, status="resolved", evidence=2))
    time.sleep(RESEND_S * 4 + 1)  # past the end time of the short-lived run's posts
    assert set(by_id()) == {"a", "b"}, "the restarted notifier re-posted the open incidents"
    notifier = Notifier(env, tmp_path / "notify.log", resend_s=60)
    try:
        eventually("a resolved", lambda: set(by_id()) == {"b"}, timeout=20)
        assert len(by_id()["b"]) == 1
    finally:
        notifier.stop()


def test_notify_with_a_kafka_address_that_cannot_be_right_says_so_and_exits(tmp_path: Path) -> None:
    """An unknown host name is not waited for (a broker that is down is: test_broker_late.py)."""
    env = {
        "FAULTSTREAM_KAFKA_BOOTSTRAP": "no-such-broker.invalid:9092",
        "FAULTSTREAM_ALERTMANAGER_URL": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", "notify"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 5
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "faultstream notify: error: cannot use Kafka over PLAINTEXT: no-such-broker.invalid"
    )
