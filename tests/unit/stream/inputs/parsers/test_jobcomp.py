"""Slurm ``jobcomp/kafka`` records: what the worker's jobs topic and ``replay`` make of them."""

from __future__ import annotations

import orjson
import pytest

from schemas.records import InvalidRecord, JobEvent, JobState
from stream.inputs.parsers.jobcomp import parse_jobcomp
from stream.inputs.parsers.jsonl import parse_jsonl
from stream.inputs.parsers.options import ParseOptions
from stream.worker.rekeyed import job_copies

#: A record as Slurm's jobcomp serializer writes it (field names and shapes of Slurm 23.02+'s
#: ``jobcomp_common``, values made up): compact JSON, UTC times without a zone, a host list.
ENDED = {
    "jobid": 4242,
    "container": None,
    "username": "ana",
    "user_id": 1000,
    "groupname": "ml",
    "group_id": 1000,
    "@start": "2025-03-04T10:00:00",
    "@end": "2025-03-04T11:30:00",
    "elapsed": 5400,
    "partition": "gpu",
    "alloc_node": "login1",
    "nodes": "gpu-node-[17-18]",
    "total_cpus": 128,
    "total_nodes": 2,
    "derived_ec": "0:0",
    "exit_code": "1:0",
    "state": "NODE_FAIL",
    "failed_node": "gpu-node-18",
    "cpu_hours": 192.0,
    "@submit": "2025-03-04T09:59:00",
    "@eligible": "2025-03-04T09:59:00",
    "@queue_wait": 60,
    "work_dir": "/home/ana",
    "cluster": "research",
    "qos": "normal",
    "time_limit": 600,
    "job_name": "pretrain",
    "account": "ml",
    "tres_req": "cpu=128,mem=1000G,node=2,billing=128,gres/gpu=16",
    "tres_alloc": "cpu=128,mem=1000G,node=2,billing=128,gres/gpu=16",
}


def parse(record: dict[str, object]) -> JobEvent | InvalidRecord:
    return parse_jobcomp(record, "default", 8, "slurm-jobs/0", "offset 7", orjson.dumps(record))


def test_an_end_record_is_one_event_in_its_state_at_its_end_with_its_start() -> None:
    event = parse(ENDED)
    assert isinstance(event, JobEvent)
    assert (event.state, event.job_id, event.cluster, event.user, event.name, event.partition) == (
        JobState.NODE_FAIL, "4242", "research", "ana", "pretrain", "gpu",
    )  # fmt: skip
    assert event.nodes == ("gpu-node-17", "gpu-node-18")
    assert event.gpus == 16
    assert event.ts_ms == event.end_ms == 1741087800000
    assert event.start_ms == 1741082400000
    assert event.exit_code == "1:0"


def test_a_start_record_is_running_at_its_start() -> None:
    start = {key: value for key, value in ENDED.items() if key not in ("@end", "elapsed", "exit_code")}
    start["state"] = None
    event = parse(start)
    assert isinstance(event, JobEvent)
    assert (event.state, event.ts_ms, event.start_ms, event.end_ms) == (
        JobState.RUNNING,
        1741082400000,
        1741082400000,
        None,
    )


def test_an_array_task_is_named_as_sacct_names_it_and_a_missing_cluster_is_the_deployments() -> None:
    record = {**ENDED, "jobid": 4300, "array_job_id": 4299, "array_task_id": 3, "state": "COMPLETED"}
    del record["cluster"]
    event = parse(record)
    assert isinstance(event, JobEvent)
    assert (event.job_id, event.cluster, event.state) == ("4299_3", "default", JobState.COMPLETED)
    # Slurm's NO_VAL in array_task_id: not an array task.
    event = parse({**ENDED, "array_job_id": 0, "array_task_id": 0xFFFFFFFE})
    assert isinstance(event, JobEvent) and event.job_id == "4242"


def test_gpus_without_gres_come_from_the_node_count() -> None:
    record = {**ENDED, "tres_alloc": "cpu=128,mem=1000G,node=2", "tres_req": "cpu=128,node=2"}
    event = parse(record)
    assert isinstance(event, JobEvent) and event.gpus == 16  # 2 nodes x 8


def test_slurm_aliases_map_as_the_sacct_parser_maps_them() -> None:
    states = {
        name: parse({**ENDED, "state": name})
        for name in ("BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED")
    }
    assert {name: event.state.value for name, event in states.items() if isinstance(event, JobEvent)} == {
        "BOOT_FAIL": "NODE_FAIL", "DEADLINE": "TIMEOUT", "OUT_OF_MEMORY": "OUT_OF_MEMORY", "REQUEUED": "REQUEUED",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"jobid": None}, "field 'jobid' must be a positive integer"),
        ({"jobid": "abc"}, "field 'jobid' must be a positive integer"),
        ({"@end": "Unknown"}, "state NODE_FAIL without an '@end' time"),
        ({"@end": 1741087800}, "field '@end' must be a time string"),
        ({"@end": "yesterday"}, "field '@end': not a time"),
        ({"@start": "2025-03-04T12:00:00"}, "'@end' is before '@start'"),
        ({"state": "LAUNCH_FAILED"}, "unknown job state 'LAUNCH_FAILED'"),
        ({"state": 5}, "field 'state' must be a string or null"),
        ({"nodes": "gpu-node-[17-"}, "field 'nodes'"),
        ({"nodes": ["gpu-node-17"]}, "field 'nodes' must be a string"),
        ({"total_nodes": -1, "tres_alloc": None, "tres_req": None}, "field 'total_nodes'"),
        ({"state": None}, "an end record (with '@end') must name its 'state'"),
        ({"state": None, "@end": None, "@start": "Unknown"}, "a start record needs an '@start' time"),
    ],
)
def test_a_bad_record_is_a_dead_letter_naming_the_field(change: dict[str, object], reason: str) -> None:
    event = parse({**ENDED, **change})
    assert isinstance(event, InvalidRecord), event
    assert reason in event.reason
    assert event.reason.startswith("jobcomp record: ")
    assert (event.source, event.location) == ("slurm-jobs/0", "offset 7")
    assert event.raw == orjson.dumps({**ENDED, **change})


def test_unknown_start_on_an_end_record_is_kept_as_an_end_without_a_start() -> None:
    event = parse({**ENDED, "@start": "Unknown", "state": "CANCELLED"})
    assert isinstance(event, JobEvent)
    assert (event.state, event.start_ms) == (JobState.CANCELLED, None)


def test_a_requeued_job_id_gives_two_runs_told_apart_by_their_starts() -> None:
    first = parse({**ENDED, "state": "REQUEUED"})
    second = parse(
        {**ENDED, "@start": "2025-03-04T11:35:00", "@end": "2025-03-04T12:00:00", "state": "COMPLETED"}
    )
    assert isinstance(first, JobEvent) and isinstance(second, JobEvent)
    assert first.job_id == second.job_id
    assert first.start_ms != second.start_ms


def test_the_worker_copies_and_replay_read_the_same_events() -> None:
    lines = [
        orjson.dumps(ENDED),
        orjson.dumps({**ENDED, "jobid": 4243, "state": "COMPLETED", "nodes": "gpu-node-3"}),
    ]
    replayed = [r for r in parse_jsonl(lines, ParseOptions(cluster="default"), "jobs.jsonl")]
    assert all(isinstance(r, JobEvent) for r in replayed)
    make = job_copies("default", 8)
    copied: list[tuple[str, JobEvent]] = []
    for offset, line in enumerate(lines):
        good, bad = make(line, None, "slurm-jobs/0", f"offset {offset}")
        assert bad == []
        copied += [(node, JobEvent.from_dict(orjson.loads(copy))) for node, _, copy in good]
    assert [node for node, _ in copied] == ["gpu-node-17", "gpu-node-18", "gpu-node-3"]
    strip = lambda event: event.to_wire()  # noqa: E731 (the sources differ: the file's line, the topic's offset)
    assert [strip(event) for _, event in copied] == [
        strip(replayed[0]),
        strip(replayed[0]),
        strip(replayed[1]),
    ]


def test_garbage_on_the_jobs_topic_is_one_dead_letter_each_never_a_crash() -> None:
    make = job_copies("default", 8)
    for value in (
        b'{"jobid":',
        b'{"jobid": 1, "state": "FAILED"}',
        b"\xff\xfe",
        b"[1,2]",
        b'{"jobid": 1e999}',
    ):
        good, bad = make(value, None, "slurm-jobs/0", "offset 1")
        assert good == [] and len(bad) == 1, value
