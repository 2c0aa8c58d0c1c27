"""The shipped alert rules in a real Prometheus scraping a real worker on the real broker.

The rules are docker/prometheus/alerts.yml as shipped, with each ``for:`` set to 0 s so that a rule
fires as soon as its expression holds (the durations themselves are promtool-tested in
tests/unit/docker/alerts.test.yml). Prometheus scrapes and evaluates every second.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer

from tests.services import kafka
from tests.services.prometheus import Service, get_json, start_prometheus
from tests.services.worker import Worker, cli

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]

RULES = Path(__file__).resolve().parents[2] / "docker" / "prometheus" / "alerts.yml"


def immediate_rules() -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    return rules


def firing(prometheus: Service, name: str) -> list[dict[str, Any]]:
    alerts = get_json(f"{prometheus.url}/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def wait_for(
    what: str, check: Callable[[], list[dict[str, Any]]], step: Callable[[], None], timeout: float
) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        step()
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen in {timeout:.0f} s")


async def send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, key=b"node1")
    finally:
        await producer.stop()


def test_dead_letters_and_a_stopped_worker_fire_their_alerts(bootstrap: str, tmp_path: Path) -> None:
    env = kafka.deployment_env(
        bootstrap, f"p{uuid.uuid4().hex[:8]}", 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "worker-data")
    )
    cli(env, "init-kafka")
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "faultstream-worker",  # the job name the rules select, as in the stack
                "static_configs": [{"targets": [f"127.0.0.1:{worker.metrics_port}"]}],
            }
        ],
    }
    prometheus = start_prometheus(tmp_path / "prometheus", config, immediate_rules())
    topic = env["FAULTSTREAM_TOPIC_XID"]
    try:
        up = f"{prometheus.url}/api/v1/query?query=up"
        wait_for("the first scrape", lambda: [r for r in get_json(up)["data"]["result"] if r["value"][1] == "1"],
                 worker.assert_alive, 60)  # fmt: skip
        assert not firing(prometheus, "FaultstreamDeadLetterRate")
        minute = iter(range(10**6))

        def trickle() -> None:
            """One bad line beside three good ones (a quarter: over the rule's 1%, under the
            worker's own 50% stop), so the counters keep rising between scrapes."""
            lines = [
                json.dumps({"ts": f"2024-01-05T{n // 60 % 24:02d}:{n % 60:02d}:00Z", "cluster": "c",
                            "node": "node1", "xid": 13}).encode()
                for n in (next(minute) for _ in range(3))
            ]  # fmt: skip
            asyncio.run(send(bootstrap, topic, [*lines, b"{truncated"]))
            worker.assert_alive()

        [alert] = wait_for("FaultstreamDeadLetterRate firing",
                           lambda: firing(prometheus, "FaultstreamDeadLetterRate"), trickle, 90)  # fmt: skip
        assert alert["labels"]["topic"] == topic and alert["labels"]["severity"] == "warn"
        assert f"of {topic} records are dead letters" in alert["annotations"]["summary"]
        assert "dead_letters" in alert["annotations"]["runbook"]
        assert not firing(prometheus, "FaultstreamWorkerDown")

        worker.stop()
        [down] = wait_for("FaultstreamWorkerDown firing",
                          lambda: firing(prometheus, "FaultstreamWorkerDown"), lambda: None, 30)  # fmt: skip
        assert down["labels"]["instance"] == f"127.0.0.1:{worker.metrics_port}"
        assert down["labels"]["severity"] == "critical"
    finally:
        prometheus.stop()
        worker.stop()
        kafka.delete_deployment_topics(env)
