"""Slurm's own ``jobcomp/kafka`` records on the jobs topic give the results of replaying them (issue 42).

Slurm 23.02+ publishes one compact JSON record a job when it ends, with no key, to Kafka. The
Debian Slurm here (22.05) has no such plugin, so the records are written from the documented format
(Slurm's ``jobcomp_common`` serializer: ``jobid``, ``@start``/``@end`` in UTC without a zone,
``nodes`` as a host list, ``tres_alloc``, ...) from a simulated cluster's ``sacct`` table, and
produced as the plugin produces them. One worker, started once everything is in Kafka, must write
the incidents, attributions and MTTF rows of the embedded replay of the same records (read from
JSON Lines) with the cluster's kernel log and DCGM scrapes; a few malformed records between them are
dead letters with their reasons, and the good records around them are kept.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from schemas.records import JobEvent
from stream.inputs.parsers.hostlist import compress_hostlist
from stream.inputs.parsers.options import ParseOptions
from stream.inputs.parsers.sacct import parse_sacct
from tests.services import kafka
from tests.services.worker import Worker, assert_same_results, cli, query, results, wait_until_caught_up

pytestmark = pytest.mark.e2e

#: Malformed records a producer might send: each is one dead letter naming its fault.
BAD = [
    {"jobid": "x7", "@end": "2024-01-02T00:00:00", "state": "FAILED", "nodes": "node0001"},
    {"jobid": 99, "@start": "2024-01-02T00:00:00", "@end": "Unknown", "state": "FAILED", "nodes": "node0001"},
    {"jobid": 98, "@end": "2024-01-02T00:00:00", "state": "LAUNCH_FAILED", "nodes": "node0001"},
    {"jobid": 97, "@end": "2024-01-02T00:00:00", "state": "FAILED", "nodes": "node[0001-"},
]


def _slurm_time(ms: int | None) -> str:
    from datetime import UTC, datetime

    if ms is None:
        return "Unknown"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def jobcomp_record(event: JobEvent) -> dict[str, object]:
    """The record Slurm's jobcomp plugin writes for a job that ended as ``event`` says."""
    array_job, _, array_task = event.job_id.partition("_")
    record: dict[str, object] = {
        "jobid": int(array_job) + (int(array_task) if array_task else 0),
        "container": None,
        "username": event.user,
        "user_id": 1000,
        "groupname": "users",
        "group_id": 1000,
        "@start": _slurm_time(event.start_ms),
        "@end": _slurm_time(event.end_ms),
        "elapsed": ((event.end_ms or 0) - (event.start_ms or event.end_ms or 0)) // 1000,
        "partition": event.partition,
        "alloc_node": "login1",
        "nodes": compress_hostlist(event.nodes),
        "total_cpus": 8 * len(event.nodes),
        "total_nodes": len(event.nodes),
        "derived_ec": "0:0",
        "exit_code": event.exit_code,
        "state": event.state.value,
        "failed_node": None,
        "cluster": event.cluster,
        "qos": "normal",
        "job_name": event.name,
        "account": "research",
        "tres_req": f"cpu={8 * len(event.nodes)},node={len(event.nodes)},gres/gpu={event.gpus}",
        "tres_alloc": f"billing=8,cpu={8 * len(event.nodes)},gres/gpu={event.gpus},node={len(event.nodes)}",
    }
    if array_task:
        record["array_job_id"] = int(array_job)
        record["array_task_id"] = int(array_task)
    return record


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, list[dict]], str]:
    """A simulated 40-node week, its jobs as jobcomp records, and what the embedded replay makes of them."""
    folder = tmp_path_factory.mktemp("jobcomp")
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "40", "--days", "7", "--seed", "41", "--ecc-interval-minutes", "360",
        "--out", str(sim))  # fmt: skip
    events = parse_sacct((sim / "sacct.txt").read_bytes().splitlines(), ParseOptions(cluster="sim"), "sacct")
    ended = sorted(
        (e for e in events if isinstance(e, JobEvent) and e.state.is_terminal), key=lambda e: e.ts_ms
    )
    assert len(ended) > 100
    jobcomp = folder / "jobcomp.jsonl"
    jobcomp.write_bytes(b"".join(orjson.dumps(jobcomp_record(event)) + b"\n" for event in ended))
    store = folder / "embedded"
    cli({}, "replay", str(jobcomp), str(sim / "kernel.log"), str(sim / "dcgm.prom"),
        "--clickhouse", f"chdb://{store}", "--no-progress")  # fmt: skip
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([store], last["t"])
    assert len(expected["incidents"]) >= 5 and len(expected["attributions"]) > 0, expected.keys()
    return sim, jobcomp, expected, last["t"]


def test_jobcomp_records_on_the_jobs_topic_give_the_replay_s_results(
    bootstrap: str, tmp_path: Path, cluster: tuple[Path, Path, dict[str, list[dict]], str]
) -> None:
    sim, jobcomp, expected, before = cluster
    env = kafka.deployment_env(bootstrap, f"jobcomp{uuid.uuid4().hex[:6]}", 4, FAULTSTREAM_DATA_DIR=str(tmp_path / "data"))  # fmt: skip
    cli(env, "init-kafka")
    records = jobcomp.read_bytes().splitlines()
    values = records[:10] + [orjson.dumps(bad) for bad in BAD] + records[10:]

    async def produce() -> None:  # as the plugin does: compact JSON, no key
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for value in values:
                await producer.send(env["FAULTSTREAM_TOPIC_JOBS"], value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(produce())
    cli(env, "replay", str(sim / "kernel.log"), str(sim / "dcgm.prom"),
        "--to", f"kafka://{bootstrap}", "--no-progress")  # fmt: skip
    worker = Worker(env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(env, [worker], timeout=300)
    finally:
        worker.stop()
    assert_same_results(results([worker.store], before), expected)
    letters = query(worker.store, "SELECT reason FROM faultstream.dead_letters ORDER BY reason")
    reasons = sorted(row["reason"] for row in letters)
    assert len(reasons) == len(BAD), reasons
    for fault in ("'jobid' must be a positive integer", "without an '@end' time", "unknown job state 'LAUNCH_FAILED'",
                  "field 'nodes'"):  # fmt: skip
        assert any(fault in reason for reason in reasons), (fault, reasons)
    kafka.delete_deployment_topics(env)
