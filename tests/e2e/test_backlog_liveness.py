"""Liveness on the real broker (SPEC 5, issue 40): a dense month-long backlog, published before the
workers start, drains to nothing held and gives the embedded replay's tables.

A replay of months of history, or a catch-up after an outage, is a backlog of every DCGM scrape of
its span. Such a month (10-minute scrapes, 4 partitions, two workers) once stalled for good: every
offset committed, millions of records held in the merges, most incidents never written. The cause
was in the fleet stage (its first instants lay past the horizon a record waiting for them pinned);
``tests/unit/detectors/test_fleet.py`` has the model of it. Here the same shapes go through Kafka:
a month of 10-minute scrapes on 4 partitions and two workers, and a denser one (1-minute scrapes,
fewer nodes, the same span) on 8 partitions and one worker. A fifth of the GPUs, or half on the
smaller fleet, correct errors from the first scrape on, so that samples wait for the fleet's ECC
reference from the history's first hour. Done means processed: the gauges must say held = 0 (and
``faultstream_caught_up``), not only committed offsets.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from stream.simulator import simulate
from stream.simulator.config import SimulationConfig
from tests.services import kafka
from tests.services.worker import Worker, assert_same_results, cli, query, results, wait_until_caught_up

pytestmark = pytest.mark.e2e

#: name -> (the simulated month, partitions, workers)
CASES = {
    "10-minute scrapes, 12 nodes": (
        SimulationConfig(nodes=12, days=30, seed=7, ecc_interval_minutes=10, sbe_gpu_fraction=0.2,
                         sbe_rate_per_day=96),
        4,
        2,
    ),
    "1-minute scrapes, 2 nodes": (
        SimulationConfig(nodes=2, days=30, seed=8, ecc_interval_minutes=1, sbe_gpu_fraction=0.5,
                         sbe_rate_per_day=96),
        8,
        1,
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CASES))
def month(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, dict, str]:
    """A simulated month and what the embedded replay makes of it."""
    folder = tmp_path_factory.mktemp("month")
    sim = folder / "sim"
    simulate(CASES[request.param][0], sim)
    store = folder / "embedded"
    cli({}, "replay", *files(sim), "--clickhouse", f"chdb://{store}", "--no-progress")
    # Up to the last full hour: the replay's end writes the exposure of jobs still running then,
    # which a live worker (whose input has no end) does not.
    [last] = query(
        store,
        "SELECT toString(toStartOfHour(max(ts) - INTERVAL 1 HOUR)) AS t FROM faultstream.ecc_samples",
    )
    return request.param, sim, results([store], last["t"]), last["t"]


def files(sim: Path) -> list[str]:
    return [str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom")]


def test_a_dense_month_published_first_drains_and_equals_the_embedded_replay(
    bootstrap: str, tmp_path: Path, month: tuple[str, Path, dict, str]
) -> None:
    name, sim, expected, before = month
    _, partitions, workers = CASES[name]
    prefix = f"backlog{partitions}x{workers}{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, partitions, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    cli(env, "replay", *files(sim), "--to", f"kafka://{bootstrap}", "--no-progress")
    members = [Worker(env, tmp_path / f"store{n}", tmp_path / f"worker{n}.log") for n in range(workers)]
    held_seen = 0.0
    try:
        started = time.monotonic()
        # Held records are committed in checkpoints: the offsets alone say "done" too early.
        wait_until_caught_up(env, members, timeout=600)
        drained = time.monotonic() - started
        deadline = time.monotonic() + 15
        while sum(m.metric("faultstream_caught_up") for m in members) < workers:
            assert time.monotonic() < deadline, "faultstream_caught_up did not read 1 on every worker"
            time.sleep(0.5)
        held_seen = max(m.metric("faultstream_merge_held_records") for m in members)
    finally:
        for member in members:
            member.stop()
    print(f"{name}: {partitions} partitions, {workers} workers: drained {drained:.0f} s after the launch")
    assert held_seen == 0
    for member in members:
        assert "went without" not in member.log() and "goes without" not in member.log()
    got = results([m.store for m in members], before)
    assert_same_results(got, expected)
    assert expected["incidents"] and expected["mttf"]
    kafka.delete_deployment_topics(env)
