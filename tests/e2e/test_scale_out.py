"""Scale-out on the real broker (issue 12's done-when): whatever the partitioning and however the
group changes while it works, the workers write what the embedded replay writes.

Each scenario is one run through every change of membership
(:func:`tests.services.failover.join_kill_leave`): two workers start (one with a static instance
id), a third joins mid-stream (a rebalance; it takes partitions over from their checkpoints), the
static one is killed with SIGKILL and replaced at once with its id (the time until the partitions
commit again is printed), and the second stops with SIGTERM and leaves the group. The input is
published while the workers run, at a steady rate, so that it outlasts the changes however fast
the workers are: the simulated clusters one record a message, at the rate that spreads them over
``PUBLISH_SECONDS`` (a backlog published first, as before, was drained before the leave once the
workers grew faster, in one CI run of five); the example at 1,500 records/s. Then the incidents
(id, version, status, kind, severity, node, GPU, first evidence), the job attributions (verdict,
run, evidence of every node) and the MTTF rows of every worker's store, merged, equal the embedded
replay's, and so do the dead letters; no worker logged an ERROR line.

The scenarios: a 120-node cluster with under a week of history (5 days, a crash-looping user) and
a 500-node cluster of 3 days, both on 8 partitions, and the bundled example on 4. With
``test_worker_kafka.py`` (1 partition), ``test_worker_recovery.py`` (a kill -9 on 1 partition),
``test_fleet_stage.py`` (4 and 8 partitions, a lemon and a storm outside the fleet stage's
partition) and ``test_worker_failover.py`` (five SIGKILLs, 4 partitions) that is 1, 4 and 8
partitions with 1 to 3 workers, on the example and three simulated clusters of 60 to 500 nodes.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.e2e.conftest import EXAMPLE_LOGS
from tests.services import kafka
from tests.services.failover import BACKLOG_JOIN_RECORDS, KillRun, join_kill_leave
from tests.services.worker import (
    ROOT,
    assert_same_results,
    cli,
    query,
    results,
    wait_until_caught_up,
)

pytestmark = pytest.mark.e2e


#: How long the simulated clusters' publishing lasts: the changes took 11-13 s from the first
#: launch on this machine alone (``pytest -s`` prints their times), so a loaded CI machine has
#: about three times that before the leave must find the publisher still at work.
PUBLISH_SECONDS = 40


@dataclass(frozen=True)
class Scenario:
    partitions: int
    #: `faultstream simulate` arguments (None: the bundled example).
    simulate: str | None
    #: Records/s of the publisher (None: the records over ``PUBLISH_SECONDS``, one a message).
    rate: int | None = None


SCENARIOS = {
    "120 nodes x 5 days, 8 partitions": Scenario(
        8, "--nodes 120 --days 5 --seed 12 --ecc-interval-minutes 45 --crash-loop-users 1"
    ),
    "500 nodes x 3 days, 8 partitions": Scenario(
        8, "--nodes 500 --days 3 --seed 13 --ecc-interval-minutes 180"
    ),
    "the example, 4 partitions": Scenario(4, None, rate=1500),
}


@dataclass(frozen=True)
class Inputs:
    files: list[Path]
    #: The embedded replay's results and dead letters.
    expected: dict[str, list[dict]]
    #: The hour the MTTF rows are compared up to.
    before: str
    #: The replay's publishing arguments.
    publishing: list[str]


def inputs_and_expected(scenario: Scenario, folder: Path, request: pytest.FixtureRequest) -> Inputs:
    if scenario.simulate is None:
        expected, before = request.getfixturevalue("embedded")  # the session's, shared
        store = request.getfixturevalue("embedded_store")
        letters = results([store], before, dead_letters=True)["dead_letters"]
        return Inputs(
            [EXAMPLE_LOGS], {**expected, "dead_letters": letters}, before, ["--rate", str(scenario.rate)]
        )
    sim = folder / "sim"
    cli({}, "simulate", *scenario.simulate.split(), "--out", str(sim))
    inputs = [sim / "kernel.log", sim / "sacct.txt", sim / "dcgm.prom"]
    store = folder / "embedded"
    summary = cli(
        {}, "replay", *map(str, inputs), "--clickhouse", f"chdb://{store}", "--no-progress", "--json"
    )
    records = orjson.loads(summary)["events"]
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([store], last["t"], dead_letters=True)
    assert len(expected["incidents"]) >= 5 and expected["attributions"], "too little to compare"
    rate = math.ceil(records / PUBLISH_SECONDS)
    return Inputs(inputs, expected, last["t"], ["--rate", str(rate), "--records-per-message", "1"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_join_a_kill_and_a_leave_change_nothing(
    bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest, name: str
) -> None:
    scenario = SCENARIOS[name]
    inputs = inputs_and_expected(scenario, tmp_path, request)
    prefix = f"scale{scenario.partitions}x{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, scenario.partitions, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"),
                               FAULTSTREAM_WORKER_JOIN_RECORDS=BACKLOG_JOIN_RECORDS)  # fmt: skip
    cli(env, "init-kafka")
    replay = [sys.executable, "-m", "stream.cli", "replay", *map(str, inputs.files), "--to", f"kafka://{bootstrap}",
              "--no-progress", *inputs.publishing]  # fmt: skip

    def publish() -> subprocess.Popen[bytes]:
        return subprocess.Popen(replay, env={**os.environ, **env}, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / "publisher.log").open("w"))  # fmt: skip

    run = KillRun()
    try:
        join_kill_leave(run, env, tmp_path, publish=publish)
        wait_until_caught_up(env, run.alive, timeout=300)
        run.events.append((time.time(), "caught up"))
    finally:
        for worker in run.alive:
            worker.stop()

    [(_, resumed)] = run.resumes
    began = run.events[0][0]
    print(f"{name}: " + "; ".join(f"{at - began:.1f} s {what}" for at, what in run.events))  # pytest -s
    # (The 10 s target of a failover is test_worker_failover.py's: here the kill comes right after
    # a rebalance, among three workers busy on a backlog.)
    assert resumed is not None, f"the killed worker's partitions did not commit again: {run.events}"
    stores = [worker.store for worker in run.incarnations]
    got = results(stores, inputs.before, dead_letters=True)
    assert_same_results(
        {k: v for k, v in got.items() if k != "dead_letters"},
        {k: v for k, v in inputs.expected.items() if k != "dead_letters"},
    )
    assert got["dead_letters"] == inputs.expected["dead_letters"]
    for worker in run.incarnations:
        errors = [line for line in worker.log().splitlines() if "[ERROR]" in line]
        assert not errors, f"{worker.log_path}: ERROR lines:\n" + "\n".join(errors[:5])
    kafka.delete_deployment_topics(env)
