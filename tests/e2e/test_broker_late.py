"""Commands started while the broker is down wait for it (issue 40): ``init-kafka`` started before
its broker, and a worker started while it is down for a restart, go on once it answers, and the
worker's results are the embedded replay's; ``tail`` and ``notify`` wait and say so, within a bound when one is set. A refused
address stays a quick error (``tests/integration/test_kafka_security.py``, and an unknown host
name in ``tests/unit/stream/kafka/test_reachable.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import kafka
from tests.services.worker import (
    ROOT,
    Worker,
    assert_same_results,
    cli,
    free_port,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e

KAFKA_SCRIPTS = ROOT / "tests" / "services" / "kafka"
LOGS = ROOT / "examples" / "sim-48x14" / "logs"


@pytest.fixture
def later_broker(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A port for a broker of this test's own that is not started yet: (bootstrap, its folder)."""
    folder = tmp_path / "kafka"
    bootstrap = f"127.0.0.1:{free_port()}"
    yield bootstrap, folder
    subprocess.run([str(KAFKA_SCRIPTS / "stop.sh"), str(folder)], timeout=120, check=False)


def start_broker(bootstrap: str, folder: Path, *, restart: bool = False) -> None:
    port = bootstrap.rsplit(":", 1)[1]
    args = ["--restart", str(folder)] if restart else [str(folder)]
    started = subprocess.run(
        [str(KAFKA_SCRIPTS / "start.sh"), *args],
        env={**os.environ, "FAULTSTREAM_KAFKA_PORT": port, "FAULTSTREAM_KAFKA_CONTROLLER_PORT": str(free_port())},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert started.returncode == 0, f"start.sh failed:\n{started.stderr[-3000:]}"


def test_init_kafka_and_a_worker_started_while_the_broker_is_down_go_on_once_it_answers(
    later_broker: tuple[str, Path], tmp_path: Path, embedded: tuple[dict[str, list[dict]], str]
) -> None:
    """init-kafka started before the broker's first start; then a worker started while the broker
    is down again (a restart), which goes on once it is back and writes the embedded results."""
    bootstrap, folder = later_broker
    expected, before = embedded
    env = kafka.deployment_env(
        bootstrap, f"late{uuid.uuid4().hex[:6]}", 2, FAULTSTREAM_DATA_DIR=str(tmp_path / "d")
    )
    init_log = tmp_path / "init-kafka.log"
    with init_log.open("w") as log:
        init = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "init-kafka"], env={**os.environ, **env}, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            time.sleep(3)
            assert init.poll() is None, "init-kafka gave up on a broker that is down"
            start_broker(bootstrap, folder)
            assert init.wait(timeout=120) == 0, init_log.read_text()
        finally:
            if init.poll() is None:
                init.kill()
    assert f"init-kafka waits for Kafka at {bootstrap}, which does not answer" in init_log.read_text()
    subprocess.run([str(KAFKA_SCRIPTS / "stop.sh"), "--keep", str(folder)], timeout=120, check=True)
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        deadline = time.monotonic() + 60
        while worker.metric("faultstream_kafka_wait_seconds", before_start=0) < 3:
            assert time.monotonic() < deadline, f"the worker does not say it waits:\n{worker.log()[-2000:]}"
            worker.assert_alive()
            time.sleep(0.5)
        assert f"the worker waits for Kafka at {bootstrap}, which does not answer" in worker.log()
        start_broker(bootstrap, folder, restart=True)
        cli(env, "replay", str(LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
        wait_until_caught_up(env, [worker], timeout=300)
        assert worker.metric("faultstream_kafka_wait_seconds") == 0
    finally:
        worker.stop()
    assert f"Kafka at {bootstrap} answered after" in worker.log()
    assert_same_results(results([worker.store], before), expected)


@pytest.mark.parametrize("command", [("tail", "--no-follow"), ("notify",)], ids=["tail", "notify"])
def test_tail_and_notify_wait_for_a_broker_that_is_down_and_say_so(command: tuple[str, ...]) -> None:
    env = {
        "FAULTSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "FAULTSTREAM_ALERTMANAGER_URL": "http://127.0.0.1:9",
        "FAULTSTREAM_KAFKA_WAIT_SECONDS": "4",
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *command],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 5, result.stderr
    assert (
        f"{command[0]} waits for Kafka at {env['FAULTSTREAM_KAFKA_BOOTSTRAP']}, which does not answer"
        in lines[0]
    )
    assert "FAULTSTREAM_KAFKA_WAIT_SECONDS=4" in lines[-1] and "Connect call failed" in lines[-1]
    assert 4 <= took < 40
