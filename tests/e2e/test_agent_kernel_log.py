"""Lines written to a kernel-log file, shipped by ``faultstream agent``, give the incidents of
replaying the file (issue 41, part 3; the agent's twin of test_shipped_kernel_log.py).

A simulated cluster's kernel log is written to a file in pieces (a rotation by rename in the
middle) while an agent follows it and publishes each line, as it is, to the deployment's
``kernel-log`` topic; the job records and DCGM scrapes go in with ``replay --to``. One worker,
started once everything is in Kafka, must write the incidents, attributions and MTTF rows of the
embedded replay of the same three files, with no dead letter.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.services import kafka
from tests.services.agent import AgentProcess
from tests.services.worker import (
    Worker,
    assert_same_results,
    cli,
    progress,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e


def test_lines_shipped_by_the_agent_give_the_replay_s_results(bootstrap: str, tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    cli({}, "simulate", "--nodes", "40", "--days", "7", "--seed", "41", "--ecc-interval-minutes", "360",
        "--out", str(sim))  # fmt: skip
    embedded = tmp_path / "embedded"
    cli({}, "replay", str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--clickhouse", f"chdb://{embedded}", "--no-progress")  # fmt: skip
    [last] = query(embedded, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([embedded], last["t"])
    assert len(expected["incidents"]) >= 5, "the simulated week has too few incidents to compare"

    prefix = f"agent{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, 4, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    topic = env["FAULTSTREAM_TOPIC_KERNEL_LOG"]
    lines = (sim / "kernel.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "node" / "kern.log"
    log.parent.mkdir()
    agent = AgentProcess(env, tmp_path / "agent", str(log))
    try:
        half = len(lines) // 2
        for start in range(0, half, 500):  # written in pieces, as a kernel log grows
            with log.open("ab") as handle:
                handle.write(b"".join(lines[start : min(start + 500, half)]))
            time.sleep(0.05)
        agent.wait_published(half)  # (a file created and rotated between two looks is never seen)
        log.rename(log.with_name("kern.log.1"))  # rotated half-way
        with log.open("ab") as handle:
            handle.write(b"".join(lines[half:]))
        deadline = time.monotonic() + 120
        while progress(env)[topic][1] < len(lines):
            agent.assert_alive()
            assert time.monotonic() < deadline, (
                f"the agent shipped {progress(env)[topic][1]} of {len(lines)} lines:\n{agent.log()[-2000:]}"
            )
            time.sleep(0.5)
    finally:
        agent.stop()
    cli(env, "replay", str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--to", f"kafka://{bootstrap}", "--no-progress")  # fmt: skip
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker], timeout=300)
    finally:
        worker.stop()
    assert progress(env)[topic][1] == len(lines), "lines shipped twice"
    assert_same_results(results([worker.store], last["t"]), expected)
    assert query(worker.store, "SELECT count() AS n FROM faultstream.dead_letters")[0]["n"] in (0, "0")
    kafka.delete_deployment_topics(env)
