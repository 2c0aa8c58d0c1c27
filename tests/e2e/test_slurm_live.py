"""Slurm, live and closed-loop, with a real Slurm (issue 42): jobs in through ``slurm-jobs``, drains
out through ``remediate``.

A real single-host Slurm 22.05 (four ``gpu-node-N``, slurmdbd on MariaDB) runs jobs that complete,
fail, are cancelled and lose their node; ``faultstream slurm-jobs`` polls its sacct into the jobs
topic (killed with SIGKILL halfway and restarted); a DCGM-like feed publishes ECC samples of the four
nodes every second, as a live cluster's scrapes move event time on; a GPU falls off the bus on the
node of the job that then fails. One worker must write each job's life (job events, MTTF rows) and
attribute the failed job to the hardware; ``faultstream remediate --execute`` must drain that node
within seconds with the incident in Slurm's reason, trip its breaker at the third node, and repeat
nothing when it restarts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.services import kafka
from tests.services.slurm import Slurm
from tests.services.worker import Worker, cli, query

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "faultstream"  # the Slurm fixture's ClusterName: sacct's Cluster column


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


class Feed:
    """Publishes to the input topics from a thread: ECC samples of every node each second (event
    time moves on as on a live cluster), and the XID records a test plants."""

    def __init__(self, env: dict[str, str], nodes: list[str]) -> None:
        self.env = env
        self.nodes = nodes
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self.producer: AIOKafkaProducer | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._run(self._start())
        self.scrapes = asyncio.run_coroutine_threadsafe(self._scrape(), self.loop)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    async def _start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.env["FAULTSTREAM_KAFKA_BOOTSTRAP"], linger_ms=0
        )
        await self.producer.start()

    async def _scrape(self) -> None:
        assert self.producer is not None
        while not self.stopped.is_set():
            now = int(time.time() * 1000)
            for node in self.nodes:
                for gpu in range(2):
                    sample = {"ts": now, "cluster": CLUSTER, "node": node, "gpu": gpu,
                              "pci_bus_id": f"0000:{gpu + 7:02x}:00", "counters": {"sbe_volatile": 0, "dbe_volatile": 0}}  # fmt: skip
                    await self.producer.send(
                        self.env["FAULTSTREAM_TOPIC_ECC"], orjson.dumps(sample), key=node.encode()
                    )
            await asyncio.sleep(1)

    def xid(self, node: str, code: int, gpu: int = 0) -> int:
        """Publish one XID event of ``node`` now; returns its time (ms)."""
        now = int(time.time() * 1000)
        event = {"ts": now, "cluster": CLUSTER, "node": node, "xid": code, "pci_bus_id": f"0000:{gpu + 7:02x}:00",
                 "message": "GPU has fallen off the bus."}  # fmt: skip
        assert self.producer is not None
        self._run(
            self.producer.send_and_wait(
                self.env["FAULTSTREAM_TOPIC_XID"], orjson.dumps(event), key=node.encode()
            )
        )
        return now

    def close(self) -> None:
        self.stopped.set()
        self.scrapes.result(10)
        if self.producer is not None:
            self._run(self.producer.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Command:
    """A faultstream command running in the background, its output in a log file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log_path = log
        self.args = args
        self.env = env
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", *args], env={**os.environ, **env}, stdout=self._log,
            stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def topic_values(env: dict[str, str], topic: str) -> list[dict[str, Any]]:
    """Every JSON line on ``topic``, read from its start to its end."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def read() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=env["FAULTSTREAM_KAFKA_BOOTSTRAP"])
        await producer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in sorted(await producer.partitions_for(topic))]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=env["FAULTSTREAM_KAFKA_BOOTSTRAP"], enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = {tp: end for tp, end in (await consumer.end_offsets(partitions)).items() if end > 0}
            values: list[bytes] = []
            while ends:
                for tp, messages in (await consumer.getmany(*ends, timeout_ms=1000)).items():
                    values += [message.value for message in messages]
                    if messages and messages[-1].offset + 1 >= ends[tp]:
                        del ends[tp]
            return values
        finally:
            await consumer.stop()

    return [
        orjson.loads(line) for value in asyncio.run(read()) for line in value.splitlines() if line.strip()
    ]


def job_events(env: dict[str, str]) -> list[dict[str, Any]]:
    """Every job event on the jobs topic (what the collector published)."""
    return topic_values(env, env["FAULTSTREAM_TOPIC_JOBS"])


@pytest.fixture
def deployment(bootstrap: str, slurm: Slurm, tmp_path: Path) -> Iterator[dict[str, str]]:
    prefix = f"slurmlive{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(
        bootstrap, prefix, 2,
        FAULTSTREAM_DATA_DIR=str(tmp_path / "data"),
        FAULTSTREAM_CLUSTER=CLUSTER,
        FAULTSTREAM_ALLOWED_LATENESS_SECONDS="10",
        FAULTSTREAM_ATTRIBUTION_AFTER_SECONDS="5",
        FAULTSTREAM_SLURM_POLL_SECONDS="1",
        FAULTSTREAM_SLURM_BACKFILL_SECONDS="120",
        FAULTSTREAM_SLURM_METRICS_PORT="0",
        FAULTSTREAM_REMEDIATE_METRICS_PORT="0",
        FAULTSTREAM_REMEDIATE_MAX_NODES="2",
        FAULTSTREAM_REMEDIATE_MAX_FRACTION="1",
        **slurm.env,
    )  # fmt: skip
    cli(env, "init-kafka")
    yield env
    for node in slurm.node_names:
        slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    slurm.wait_for_nodes("idle")
    kafka.delete_deployment_topics(env)


def test_a_live_slurm_s_jobs_reach_the_tables_and_a_critical_incident_drains_its_node(
    deployment: dict[str, str], slurm: Slurm, tmp_path: Path
) -> None:
    env = deployment
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    feed = Feed(env, slurm.node_names)
    collector = Command(env, tmp_path / "slurm-jobs.log", "slurm-jobs", "--cursor", str(tmp_path / "cursor"))
    remediate_store = f"chdb://{tmp_path / 'remediate'}"
    remediate = Command(
        env, tmp_path / "remediate.log", "remediate", "--clickhouse", remediate_store, "--execute"
    )
    try:
        completes = slurm.sbatch("sleep 2", job_name="fs-completes", nodelist="gpu-node-1", gres="gpu:8")
        fails = slurm.sbatch("sleep 8; exit 1", job_name="fs-fails", nodelist="gpu-node-2", gres="gpu:8")
        slurm.wait_for_state(fails, "RUNNING")
        wait_for("the collector's RUNNING of the failing job",
                 lambda: any(e["job_id"] == fails and e["state"] == "RUNNING" for e in job_events(env)))  # fmt: skip
        # The GPU falls off the bus on the failing job's node: a critical gpu_bus incident, a drain.
        planted_ms = feed.xid("gpu-node-2", 79)
        reason = wait_for("the drain of gpu-node-2", lambda: slurm.reasons().get("gpu-node-2"), timeout=60)
        drain_latency_s = time.time() - planted_ms / 1000
        assert reason.startswith("faultstream inc-") and reason.endswith(": gpu_bus"), reason
        print(f"XID 79 published -> gpu-node-2 drained in Slurm: {drain_latency_s:.2f} s")
        slurm.wait_for_state(completes, "COMPLETED")
        # The collector dies uncleanly halfway and a supervisor starts it again: the successor must
        # publish nothing twice and miss nothing. (A collector away for longer than the allowed
        # lateness would see its late job events refused by the workers, as dead letters.)
        collector.stop(9)
        collector = Command(
            env, tmp_path / "slurm-jobs.log", "slurm-jobs", "--cursor", str(tmp_path / "cursor")
        )
        cancelled = slurm.sbatch("sleep 300", job_name="fs-cancelled", nodelist="gpu-node-3")
        slurm.wait_for_state(cancelled, "RUNNING")
        slurm.run("scancel", cancelled)
        node_fails = slurm.sbatch(
            "sleep 300", job_name="fs-node-fails", nodelist="gpu-node-4", no_requeue=True
        )
        slurm.wait_for_state(node_fails, "RUNNING")
        slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=down", "reason=test")
        slurm.wait_for_state(node_fails, "NODE_FAIL")
        slurm.wait_for_state(fails, "FAILED")
        ends = {completes: "COMPLETED", fails: "FAILED", cancelled: "CANCELLED", node_fails: "NODE_FAIL"}

        def all_ended() -> bool:
            seen = {(e["job_id"], e["state"]) for e in job_events(env)}
            return all((job, state) in seen for job, state in ends.items())

        wait_for("every job's end on the jobs topic", all_ended, timeout=60)
        # Two more critical incidents: the first drains (2 nodes drained, the limit), the second trips.
        feed.xid("gpu-node-1", 79)
        wait_for("the drain of gpu-node-1", lambda: slurm.reasons().get("gpu-node-1"), timeout=60)
        slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=resume")
        feed.xid("gpu-node-3", 79)
        wait_for("the breaker's notice", lambda: "breaker tripped" in remediate.log(), timeout=60)
        # The worker decides the failed job once event time passes its end + 5 s.
        wait_for(
            "the failed job's job_hw_failure incident",
            lambda: any(i["kind"] == "job_hw_failure"
                        for i in topic_values(env, env["FAULTSTREAM_TOPIC_INCIDENTS"])),
            timeout=60, every=1,
        )  # fmt: skip
        # Every run is decided once event time (the feed's clock) passes its end + the lateness and
        # the attribution window (10 s + 5 s here), and the fleet stage has joined its evidence: about
        # 15-20 s after its end on this machine.
        last_end_s = max(e["ts"] for e in job_events(env) if e["state"] != "RUNNING") / 1000
        time.sleep(max(0.0, last_end_s + 30 - time.time()))
    finally:
        collector.stop()
        remediate.stop()
        feed.close()
        worker.stop()

    published = job_events(env)
    keys = Counter((e["job_id"], e["state"], e["ts"]) for e in published)
    assert [key for key, count in keys.items() if count > 1] == [], "an event published twice"
    ours = {e["job_id"] for e in published}
    assert {completes, fails, cancelled, node_fails} <= ours
    assert "already on" in collector.log(), collector.log()[-2000:]  # the restart read the topic back

    rows = query(worker.store, "SELECT job_id, state FROM faultstream.job_events FINAL ORDER BY ts")
    states = {(row["job_id"], row["state"]) for row in rows}
    for job, state in ends.items():
        assert (job, "RUNNING") in states and (job, state) in states, (job, state, rows)
    attributed = query(
        worker.store,
        f"SELECT hardware, evidence_nodes, evidence_xids FROM faultstream.job_attributions FINAL WHERE job_id = '{fails}'",
    )
    assert attributed and attributed[0]["hardware"] in (True, 1, "true"), attributed
    assert 79 in attributed[0]["evidence_xids"] and "gpu-node-2" in attributed[0]["evidence_nodes"]
    mttf_jobs = {
        row["job_id"] for row in query(worker.store, "SELECT DISTINCT job_id FROM faultstream.mttf_partials")
    }
    assert set(ends) <= mttf_jobs, mttf_jobs

    audit = query(Path(remediate_store.removeprefix("chdb://")),
                  "SELECT node, action, outcome, reason FROM faultstream.remediations ORDER BY decided")  # fmt: skip
    outcomes = [(row["node"], row["outcome"]) for row in audit if row["outcome"] != "skipped"]
    assert outcomes == [("gpu-node-2", "drained"), ("gpu-node-1", "drained"), ("gpu-node-3", "tripped")], (
        audit
    )
    assert slurm.reasons().get("gpu-node-3") is None  # the breaker held

    # A restart repeats nothing, and keeps the breaker open.
    again = Command(
        env, tmp_path / "remediate-again.log", "remediate", "--clickhouse", remediate_store, "--execute"
    )
    wait_for("the restarted remediator's start line", lambda: "incident(s) acted on before" in again.log())
    time.sleep(5)
    again.stop()
    assert "THE BREAKER IS OPEN" in again.log() and "2 node(s) drained by faultstream" in again.log(), (
        again.log()
    )
    audit_after = query(
        Path(remediate_store.removeprefix("chdb://")), "SELECT count() AS n FROM faultstream.remediations"
    )
    assert int(audit_after[0]["n"]) == len(audit)

    # The SRE sees it: the breaker's notice in `tail`, the drains in `report`.
    console = cli(
        env, "tail", "--from-beginning", "--no-follow", "--kind", "remediation*", "--color", "never", "--wide"
    )
    assert "Remediation breaker tripped" in console, console
    assert "faultstream remediate: drained gpu-node-2" in console, console
    report = cli(env, "report", "--clickhouse", remediate_store)
    assert (
        "Remediation (faultstream remediate): " in report and "drained" in report and "tripped" in report
    ), report


def publish_incidents(env: dict[str, str], *incidents: dict[str, Any]) -> None:
    """Put incident messages on the incidents topic as the workers do (keyed by node)."""

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=env["FAULTSTREAM_KAFKA_BOOTSTRAP"])
        await producer.start()
        try:
            for incident in incidents:
                await producer.send(
                    env["FAULTSTREAM_TOPIC_INCIDENTS"], orjson.dumps(incident), key=incident["node"].encode()
                )
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(send())


def incident(incident_id: str, node: str, version: int = 1, status: str = "open") -> dict[str, Any]:
    return {"incident_id": incident_id, "version": version, "kind": "gpu_bus", "severity": "critical",
            "status": status, "cluster": CLUSTER, "node": node, "gpu": "0000:07:00",
            "first_evidence": "2026-12-07T10:00:00.000Z", "last_evidence": "2026-12-07T10:00:00.000Z",
            "detected": "2026-12-07T10:00:00.000Z", "detector": "xid_rules", "summary": "XID 79",
            "action": "drain", "evidence": {}, "evidence_count": 1}  # fmt: skip


def test_outages_a_burst_a_person_s_drain_and_resume(
    deployment: dict[str, str], slurm: Slurm, tmp_path: Path
) -> None:
    env = {
        **deployment,
        "FAULTSTREAM_REMEDIATE_RESUME": "true",
        "FAULTSTREAM_SLURM_COMMAND_TIMEOUT_SECONDS": "5",
    }
    store = f"chdb://{tmp_path / 'remediate'}"
    remediate = Command(env, tmp_path / "remediate.log", "remediate", "--clickhouse", store, "--execute")
    collector = Command(env, tmp_path / "slurm-jobs.log", "slurm-jobs", "--cursor", str(tmp_path / "cursor"))
    try:
        # slurmctld away: remediate cannot read the node, says so, drains nothing; the next version
        # of the incident, once slurmctld is back, drains.
        slurm.stop_daemon("slurmctld")
        publish_incidents(env, incident("inc-a", "gpu-node-1"))
        wait_for("remediate's failed tries", lambda: "try 3 of 3" in remediate.log(), timeout=60)
        slurm.start_daemon("slurmctld")
        slurm.wait_for_nodes("idle")
        publish_incidents(env, incident("inc-a", "gpu-node-1", version=2))
        wait_for("the drain of gpu-node-1", lambda: slurm.reasons().get("gpu-node-1"))
        # A person's drain is left alone, and never resumed.
        slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=drain", "reason=RMA 42")
        publish_incidents(env, incident("inc-b", "gpu-node-4"))
        # A burst: gpu-node-2 drains (two drained: the limit), the rest trips the breaker and waits.
        publish_incidents(env, incident("inc-c", "gpu-node-2"), incident("inc-d", "gpu-node-3"),
                          incident("inc-e", "gpu-node-3", version=2))  # fmt: skip
        wait_for("the breaker", lambda: "breaker tripped" in remediate.log())
        time.sleep(2)
        reasons = slurm.reasons()
        assert sorted(node for node, reason in reasons.items() if reason.startswith("faultstream ")) == [
            "gpu-node-1", "gpu-node-2",
        ], reasons  # fmt: skip
        # Resolved: faultstream's own drain is resumed, the person's is not.
        publish_incidents(
            env,
            incident("inc-a", "gpu-node-1", 3, "resolved"),
            incident("inc-b", "gpu-node-4", 2, "resolved"),
        )
        wait_for("the resume of gpu-node-1", lambda: "gpu-node-1" not in slurm.reasons())
        time.sleep(2)
        assert slurm.reasons().get("gpu-node-4") == "RMA 42"
        # A person resets the breaker.
        remediate.process.send_signal(10)  # SIGUSR1
        wait_for("the reset", lambda: "breaker reset by SIGUSR1" in remediate.log())

        # slurmdbd away: sacct fails, the collector says so and retries; a job that ends meanwhile
        # is published once sacct answers again.
        wait_for("the collector's first poll", lambda: "polling sacct" in collector.log())
        slurm.stop_daemon("slurmdbd")
        job = slurm.sbatch("sleep 1", job_name="fs-during-outage", nodelist="gpu-node-3")
        wait_for("a failed poll", lambda: "trying again in" in collector.log(), timeout=60)
        slurm.wait_for_nodes("idle", ["gpu-node-3"])  # the job ran and ended while slurmdbd was away
        slurm.start_daemon("slurmdbd")
        wait_for("the job's end after the outage",
                 lambda: any(e["job_id"] == job and e["state"] == "COMPLETED" for e in job_events(env)), timeout=120)  # fmt: skip
        assert "sacct answers again" in collector.log()
        # slurmdbd hung (stopped with SIGSTOP, its port open): sacct gets no answer, is killed after
        # the time limit and tried again; once slurmdbd goes on, the collector does too.
        slurm.freeze_daemon("slurmdbd")
        try:
            wait_for(
                "a poll killed for hanging",
                lambda: "no answer in 5 s (killed)" in collector.log(),
                timeout=90,
            )
        finally:
            slurm.freeze_daemon("slurmdbd", frozen=False)
        wait_for(
            "sacct answering after the hang",
            lambda: collector.log().count("sacct answers again") >= 2,
            timeout=120,
        )
    finally:
        collector.stop()
        remediate.stop()
        slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=resume", check=False)

    audit = query(Path(store.removeprefix("chdb://")),
                  "SELECT incident_id, node, outcome, reason FROM faultstream.remediations ORDER BY decided")  # fmt: skip
    outcomes = [(row["incident_id"], row["outcome"]) for row in audit]
    assert outcomes == [
        ("inc-a", "failed"), ("inc-a", "drained"), ("inc-b", "already_drained"), ("inc-c", "drained"),
        ("inc-d", "tripped"), ("inc-e", "skipped"), ("inc-a", "resumed"), ("", "reset"),
    ], audit  # fmt: skip
    keys = Counter((e["job_id"], e["state"], e["ts"]) for e in job_events(env))
    assert [key for key, count in keys.items() if count > 1] == []
