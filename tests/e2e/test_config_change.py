"""A threshold deployed by restarting the workers (issue 43): the configuration's fingerprint is
stored with every incident version, a partition restored under a changed threshold goes on under
it and says what changed, and a change of a setting that shapes the state stops the worker with
one line saying what to do.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from stream.configuration import fingerprint
from stream.settings import Settings
from tests.e2e.conftest import EXAMPLE_LOGS
from tests.services import kafka
from tests.services.worker import Worker, cli, query, wait_until_caught_up

pytestmark = pytest.mark.e2e


def publish_more(env: dict[str, str], tmp_path: Path, day: int) -> None:
    """Three XID lines of one node on a day after the example's weeks: input the restored
    partition must apply (and so restore its checkpoint for)."""
    log = tmp_path / f"more-{day}.log"
    log.write_text(
        "".join(
            f"2024-01-{day:02d}T0{hour}:00:00.000000+00:00 node0001 kernel: NVRM: Xid (PCI:0000:07:00): 13, "
            "pid=1, name=python, Graphics Exception\n"
            for hour in (1, 2, 3)
        )
    )
    cli(env, "replay", str(log), "--to", f"kafka://{env['FAULTSTREAM_KAFKA_BOOTSTRAP']}", "--no-progress")


def wait_for_line(worker: Worker, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.log():
        assert time.monotonic() < deadline, f"no {text!r} in {timeout:.0f} s:\n{worker.log()[-3000:]}"
        time.sleep(0.5)


def test_a_restart_under_a_new_threshold_goes_on_and_a_state_setting_is_refused(
    bootstrap: str, tmp_path: Path
) -> None:
    env = kafka.deployment_env(
        bootstrap, f"cfg{uuid.uuid4().hex[:6]}", 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "d")
    )
    cli(env, "init-kafka")
    cli(env, "replay", str(EXAMPLE_LOGS), "--to", f"kafka://{bootstrap}", "--no-progress")
    default = fingerprint(Settings().core_config())
    first = Worker(env, tmp_path / "store-a", tmp_path / "a.log")
    try:
        wait_until_caught_up(env, [first], timeout=300)
        assert f"detector configuration {default} (the defaults)" in first.log()
    finally:
        first.stop()
    stored = query(first.store, "SELECT DISTINCT config FROM faultstream.incidents")
    assert stored == [{"config": default}]

    lowered = {**env, "FAULTSTREAM_STORM_MIN_EVENTS": "5"}
    publish_more(env, tmp_path, 20)
    second = Worker(lowered, tmp_path / "store-b", tmp_path / "b.log")
    try:
        wait_for_line(second, "Changed: storm_min_events: 10 -> 5")
        wait_until_caught_up(lowered, [second], timeout=300)
    finally:
        second.stop()
    new = fingerprint(Settings(storm_min_events=5).core_config())
    assert f"under this worker's ({new})" in second.log()
    assert f"detector configuration {new} (storm_min_events=5)" in second.log()  # the start line shows it
    assert {
        row["config"] for row in query(second.store, "SELECT DISTINCT config FROM faultstream.incidents")
    } <= {new}

    reshaped = {**env, "FAULTSTREAM_STORM_MIN_EVENTS": "5", "FAULTSTREAM_WINDOWS_SECONDS": "3600"}
    publish_more(env, tmp_path, 21)
    third = Worker(reshaped, tmp_path / "store-c", tmp_path / "c.log")
    try:
        deadline = time.monotonic() + 120
        while third.process.poll() is None:
            assert time.monotonic() < deadline, f"the worker did not stop in 120 s:\n{third.log()[-3000:]}"
            time.sleep(0.5)
    finally:
        third.stop()
    errors = [line for line in third.log().splitlines() if "[ERROR]" in line]
    # The first error says it all (Faust's own "Crashed" lines and their tracebacks follow).
    assert (
        errors and "stopping the worker: partition 0: its checkpoint was made under other values" in errors[0]
    )
    assert "windows_s: (3600, 86400) -> (3600,)" in errors[0], third.log()[-3000:]
    kafka.delete_deployment_topics(env)
