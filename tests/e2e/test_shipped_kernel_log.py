"""Kernel logs shipped by a real rsyslog (omkafka) give the incidents of replaying the file (issue 41).

A simulated cluster's kernel log is forwarded line by line to a real rsyslog relay, which ships
every message (other drivers' lines and all) to the deployment's ``kernel-log`` topic with no key,
in omkafka's default template and in the RFC 5424 one; its job records and DCGM scrapes are
published with ``replay --to``. One worker, started once everything is in Kafka (the order a
catch-up after an outage has), must write the incidents, attributions and MTTF rows of the
embedded replay of the same three files, and pass over the lines that are not the GPU driver's
without a dead letter.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.services import kafka
from tests.services.rsyslog import RsyslogRelay
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict]], str]:
    """A simulated 40-node week and what the embedded replay makes of its files."""
    folder = tmp_path_factory.mktemp("shipped")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "40", "--days", "7", "--seed", "41", "--ecc-interval-minutes", "360",
        "--out", str(sim))  # fmt: skip
    store = folder / "embedded"
    cli({}, "replay", str(sim / "kernel.log"), str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--clickhouse", f"chdb://{store}", "--no-progress")  # fmt: skip
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([store], last["t"])
    assert len(expected["incidents"]) >= 5, "the simulated week has too few incidents to compare"
    return sim, expected, last["t"]


@pytest.mark.parametrize("template", ["RSYSLOG_FileFormat", "RSYSLOG_SyslogProtocol23Format"])
def test_lines_shipped_by_rsyslog_give_the_replay_s_results(
    bootstrap: str, tmp_path: Path, cluster: tuple[Path, dict[str, list[dict]], str], template: str
) -> None:
    sim, expected, before = cluster
    prefix = f"shipped{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(bootstrap, prefix, 4, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))
    cli(env, "init-kafka")
    topic = env["FAULTSTREAM_TOPIC_KERNEL_LOG"]
    relay = RsyslogRelay(tmp_path / "rsyslog", bootstrap, topic, template)
    try:
        lines = (sim / "kernel.log").read_bytes().splitlines()
        sent = relay.forward(lines)
        deadline = time.monotonic() + 60
        while progress(env)[topic][1] < sent:
            assert relay.process.poll() is None, relay.log()[-2000:]
            assert time.monotonic() < deadline, (
                f"rsyslog shipped {progress(env)[topic][1]} of {sent} lines in 60 s:\n{relay.log()[-2000:]}"
            )
            time.sleep(0.5)
    finally:
        relay.stop()
    cli(env, "replay", str(sim / "sacct.txt"), str(sim / "dcgm.prom"),
        "--to", f"kafka://{bootstrap}", "--no-progress")  # fmt: skip
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker], timeout=300)
        not_ours = worker.metric("faultstream_records_not_ours_total", label=f'topic="{topic}"')
        read = worker.metric("faultstream_records_in_total", label=f'topic="{topic}"')
    finally:
        worker.stop()
    assert_same_results(results([worker.store], before), expected)
    events = query(worker.store, "SELECT count() AS n FROM faultstream.xid_events")[0]["n"]
    driver_lines = sum(b"NVRM: Xid" in line or b"SXid" in line for line in lines)
    assert (read, not_ours) == (driver_lines, sent - driver_lines)
    assert int(events) == driver_lines
    assert query(worker.store, "SELECT count() AS n FROM faultstream.dead_letters")[0]["n"] in (0, "0")
    kafka.delete_deployment_topics(env)
