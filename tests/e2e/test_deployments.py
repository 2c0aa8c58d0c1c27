"""Two deployments on one broker cannot mix (issue 43): their internal topics are named from their
application ids unless set, and a worker stops, in one line, on an internal message of another.

A canary beside production reads the same input topics with a configuration of its own: both
must write exactly what the embedded replay writes. With the internal topics shared by hand, the
second one's worker must refuse to run rather than fold the other's facts into its fleet stage
(tried before: the second deployment's results lost most incidents).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from stream.settings import Settings
from tests.e2e.conftest import EXAMPLE_LOGS
from tests.services import kafka
from tests.services.worker import Worker, assert_same_results, cli, results, wait_until_caught_up

pytestmark = pytest.mark.e2e

INTERNAL = ("JOBS_BY_NODE", "KERNEL_LOG_BY_NODE", "CHECKPOINTS", "FLEET", "FLEET_BASELINES")


def deployment(bootstrap: str, prefix: str, app: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A deployment reading the ``prefix`` input topics as app ``app``, its internal topics unset
    unless ``extra`` names them."""
    env = kafka.deployment_env(bootstrap, prefix, 2, FAULTSTREAM_DATA_DIR=str(tmp_path / app), **extra)
    env["FAULTSTREAM_WORKER_APP_ID"] = app
    for name in INTERNAL:
        if f"FAULTSTREAM_TOPIC_{name}" not in extra:
            env.pop(f"FAULTSTREAM_TOPIC_{name}")
    return env


def with_internal_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the internal topics' names its settings derive from the app id."""
    settings = Settings.from_env(env)
    return {
        **env,
        **{f"FAULTSTREAM_TOPIC_{name}": getattr(settings, f"topic_{name.lower()}") for name in INTERNAL},
    }


def test_two_app_ids_on_the_same_inputs_each_write_the_embedded_results(
    bootstrap: str, tmp_path: Path, embedded: tuple[dict[str, list[dict]], str]
) -> None:
    expected, before = embedded
    prefix = f"deploy{uuid.uuid4().hex[:6]}"
    prod = deployment(bootstrap, prefix, f"{prefix}-prod", tmp_path)
    canary = deployment(bootstrap, prefix, f"{prefix}-canary", tmp_path)
    for env in (prod, canary):
        created = cli(env, "init-kafka")
        assert f"{env['FAULTSTREAM_WORKER_APP_ID']}.fleet: created" in created, created
    workers = [
        Worker(env, tmp_path / f"store-{n}", tmp_path / f"worker-{n}.log")
        for n, env in enumerate((prod, canary))
    ]
    try:
        cli(prod, "replay", str(EXAMPLE_LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
        wait_until_caught_up(with_internal_names(prod), [workers[0]], timeout=300)
        wait_until_caught_up(with_internal_names(canary), [workers[1]], timeout=300)
    finally:
        for worker in workers:
            worker.stop()
    for worker in workers:
        assert_same_results(results([worker.store], before), expected)
        assert "ERROR" not in worker.log()
    for env in (prod, canary):
        kafka.delete_deployment_topics(with_internal_names(env))


def test_a_worker_stops_on_the_fleet_topic_of_another_deployment(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"foreign{uuid.uuid4().hex[:6]}"
    shared = {f"FAULTSTREAM_TOPIC_{name}": f"{prefix}.{name.lower()}" for name in INTERNAL}
    first = deployment(bootstrap, prefix, f"{prefix}-a", tmp_path, **shared)
    second = deployment(bootstrap, prefix, f"{prefix}-b", tmp_path, **shared)
    cli(first, "init-kafka")
    cli(first, "replay", str(EXAMPLE_LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
    one = Worker(first, tmp_path / "store-a", tmp_path / "worker-a.log")
    try:
        wait_until_caught_up(first, [one], timeout=300)
    finally:
        one.stop()
    other = Worker(second, tmp_path / "store-b", tmp_path / "worker-b.log")
    deadline = time.monotonic() + 120
    while other.process.poll() is None:
        assert time.monotonic() < deadline, f"the second deployment's worker ran on:\n{other.log()[-3000:]}"
        time.sleep(0.5)
    other.stop()
    stops = [line for line in other.log().splitlines() if "stopping the worker:" in line]
    assert stops, other.log()[-3000:]
    assert f"was written by deployment '{prefix}-a', not '{prefix}-b'" in stops[0]
    assert other.process.returncode != 0
    kafka.delete_deployment_topics({**first, **shared})
