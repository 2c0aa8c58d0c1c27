"""Results that do not depend on the partitioning, on the real broker (SPEC 5, issue 12).

A simulated cluster with a lemon node, an XID storm and a user whose jobs crash wherever they run
(job-aware verdicts: the owner's incident and what the lemon statistics count), published to 4
partitions worked by two workers and to 8 partitions worked by one, must give the incidents, job
attributions and MTTF rows of the embedded replay of the same files: the lemon verdicts, the storm
baseline and the attribution of jobs spanning partitions are the fleet stage's, which sees the
whole fleet whatever the partitioning. The cluster (seed 30, its planted storms faulty GPUs': a job's own storm goes to its owner) is picked so that its lemon and its
storm sit outside partition 0, the fleet stage's, with 4 partitions and with 8: each partition
judging its own nodes against a fraction of the fleet would decide them otherwise. (Workers
joining, killed and leaving mid-stream: ``test_scale_out.py``.)
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from stream.kafka.codec import partition_for_key
from tests.services import kafka
from tests.services.worker import Worker, assert_same_results, cli, query, results, wait_until_caught_up

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict]], str]:
    """A simulated 60-node cluster, 20 days, with a crash-looping user, and what the embedded replay
    makes of it; its lemon and its storm sit outside partition 0 (asserted)."""
    folder = tmp_path_factory.mktemp("fleet")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "60", "--days", "20", "--seed", "30", "--ecc-interval-minutes", "720",
        "--crash-loop-users", "1", "--xid-storm-gpu-fraction", "1.0", "--out", str(sim))  # fmt: skip
    store = folder / "embedded"
    cli({}, "replay", str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--clickhouse", f"chdb://{store}", "--no-progress")  # fmt: skip
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([store], last["t"])
    fleet_wide = query(
        store, "SELECT kind, node FROM faultstream.incidents FINAL WHERE kind IN ('lemon_node', 'xid_storm')"
    )
    for kind in ("lemon_node", "xid_storm"):
        nodes = [row["node"] for row in fleet_wide if row["kind"] == kind]
        assert nodes, f"the simulated cluster has no {kind} incident: nothing fleet-wide would be compared"
        assert all(partition_for_key(node.encode(), p) != 0 for node in nodes for p in (4, 8)), (
            f"a {kind} incident of {nodes} sits in partition 0: pick a seed that puts it elsewhere"
        )
    owners = query(store, "SELECT DISTINCT JSONExtractString(evidence, 'owner') AS owner FROM faultstream.incidents "
                   "FINAL WHERE kind = 'job_app_errors'")  # fmt: skip
    assert owners == [{"owner": "user009"}], (
        "the crash-looping user's incident is what job-aware verdicts compare"
    )
    return sim, expected, last["t"]


def publish(env: dict[str, str], sim: Path) -> None:
    cli(env, "replay", str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--to", f"kafka://{env['FAULTSTREAM_KAFKA_BOOTSTRAP']}", "--no-progress")  # fmt: skip


@pytest.mark.parametrize(("partitions", "workers"), [(4, 2), (8, 1)])
def test_any_partitioning_gives_the_embedded_results(
    bootstrap: str,
    tmp_path: Path,
    cluster: tuple[Path, dict[str, list[dict]], str],
    partitions: int,
    workers: int,
) -> None:
    sim, expected, before = cluster
    prefix = f"fleet{partitions}x{workers}{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, partitions, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    members = [Worker(env, tmp_path / f"store{n}", tmp_path / f"worker{n}.log") for n in range(workers)]
    try:
        deadline = time.monotonic() + 120
        while not all(m.metric("faultstream_commits_total", before_start=-1) >= 0 for m in members):
            assert time.monotonic() < deadline, "the workers did not start in 120 s"
            time.sleep(0.5)
        time.sleep(3)
        publish(env, sim)
        wait_until_caught_up(env, members, timeout=420)
    finally:
        for member in members:
            member.stop()
    got = results([m.store for m in members], before)
    assert_same_results(got, expected)
    # The lemon and the storm sit in partitions other than the one that runs the fleet stage, with
    # a fraction of the fleet: the verdict and the baseline were still taken against all of it.
    kinds = {
        row["kind"]: row["node"] for row in got["incidents"] if row["kind"] in ("lemon_node", "xid_storm")
    }
    assert set(kinds) == {"lemon_node", "xid_storm"}, kinds
    assert all(partition_for_key(node.encode(), partitions) != 0 for node in kinds.values()), kinds
    kafka.delete_deployment_topics(env)
