"""sacct -P parser, on the real GCM samples (tests/data/gcm-sacct) and on a synthetic cluster dump."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from schemas.records import InvalidRecord, JobEvent, JobState
from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format, ParseOptions, parse_file, parse_lines
from stream.inputs.parsers.detect import detect_format
from stream.inputs.parsers.hostlist import expand_hostlist
from stream.inputs.parsers.sacct import SACCT_COMMAND, parse_sacct, parse_sacct_state

DATA = Path(__file__).resolve().parents[4] / "data"
GCM = DATA / "gcm-sacct"
SYNTHETIC = DATA / "sacct" / "cluster-b.sacct.txt"


def split(items: Iterable[object]) -> tuple[list[JobEvent], list[InvalidRecord]]:
    events: list[JobEvent] = []
    dead: list[InvalidRecord] = []
    for item in items:
        if isinstance(item, InvalidRecord):
            dead.append(item)
        else:
            assert isinstance(item, JobEvent)
            events.append(item)
    return events, dead


def brief(events: list[JobEvent]) -> list[tuple[str, str, int]]:
    return [(e.job_id, e.state.value, e.ts_ms) for e in events]


# --- GCM samples --------------------------------------------------------------------------------


def test_gcm_multiline_records_are_joined() -> None:
    path = GCM / "sample-sacct-multiple-multiline.txt"
    events, dead = split(parse_file(path, ParseOptions(cluster="fallback")))
    assert dead == []
    assert brief(events) == [
        ("201729", "RUNNING", parse_ts("2023-01-15T03:01:10Z")),
        ("201729", "FAILED", parse_ts("2023-01-16T01:04:26Z")),
        ("201844", "RUNNING", parse_ts("2023-01-15T07:15:56Z")),  # three identical multi-line rows: once
        ("201844", "REQUEUED", parse_ts("2023-01-16T07:31:52Z")),
    ]
    failed = events[1]
    assert len(failed.nodes) == 128
    assert failed.nodes[:3] == ("node1083", "node1084", "node1085")
    assert failed.nodes[-1] == "node2911"
    assert (failed.gpus, failed.exit_code, failed.name, failed.user, failed.partition, failed.cluster) == (
        1024,
        "6:0",
        "test_run",
        "test_user",
        "learn",
        "cluster",
    )
    assert (failed.start_ms, failed.end_ms) == (
        parse_ts("2023-01-15T03:01:10Z"),
        parse_ts("2023-01-16T01:04:26Z"),
    )
    requeued = events[3]
    assert requeued.source == f"{path}:4"  # the record starts on line 4 and ends on line 5
    assert len(requeued.nodes) == 32
    assert requeued.nodes[:5] == ("node1001", "node1002", "node1073", "node1074", "node1129")
    assert requeued.gpus == 256
    # the steps 200131.0 (with the 256-node list) and 201729.batch are folded into their jobs
    assert {e.job_id for e in events} == {"201729", "201844"}


def test_gcm_big_node_list_expands_to_nnodes() -> None:
    raw = (GCM / "sample-sacct-multiple-multiline.txt").read_text()
    header, first = raw.split("\n")[:2]
    row = dict(zip(header.split("|#"), first.split("|#"), strict=False))
    assert row["JobID"] == "200131.0"
    nodes = expand_hostlist(row["NodeList"])
    assert len(nodes) == int(row["NNodes"]) == 256
    assert nodes[0] == "node1820"
    assert nodes[-1] == "node2999"


def test_gcm_invalid_utf8_sample() -> None:
    events, dead = split(parse_file(GCM / "sample-sacct-output-invalid-utf8.txt", ParseOptions()))
    assert dead == []
    assert brief(events) == [
        ("3557891", "RUNNING", parse_ts("2018-06-28T00:34:35Z")),
        ("3557891", "FAILED", parse_ts("2018-06-28T00:36:14Z")),
        ("3557892", "RUNNING", parse_ts("2018-06-28T00:44:33Z")),
        ("3557892", "TIMEOUT", parse_ts("2018-06-28T02:44:45Z")),
    ]
    assert [(e.nodes, e.gpus, e.exit_code, e.cluster) for e in events[1:4:2]] == [
        (("learnnode047",), 8, "0:9", "learnnode"),
        (("learnnode036",), 1, "0:0", "learnnode"),
    ]


def test_gcm_invalid_utf8_in_a_job_row_is_replaced() -> None:
    lines = (GCM / "sample-sacct-output-invalid-utf8.txt").read_bytes().split(b"\n")
    bad_step = lines[11]
    assert b"\xff" in bad_step
    as_job = bad_step.replace(b"3557893.1|3557893.1|", b"3557893|3557893|", 1)
    events, dead = split(parse_lines([lines[0], as_job], Format.SACCT, ParseOptions(), "utf8.txt"))
    assert dead == []
    assert [e.state for e in events] == [JobState.RUNNING, JobState.COMPLETED]
    assert events[0].name == "\ufffdorted"
    assert len(events[0].nodes) == 15


def test_gcm_invalid_lines_sample() -> None:
    path = GCM / "sample-sacct-output-with-invalid-lines.txt"
    events, dead = split(parse_file(path, ParseOptions()))
    assert events == []
    assert len(dead) == 1
    assert dead[0].location == "line 2"
    assert dead[0].source == str(path)
    assert dead[0].raw == path.read_bytes().split(b"\n")[1]
    assert "93 fields, the header has 109" in dead[0].reason


def test_gcm_midnight_edge_case() -> None:
    events, dead = split(parse_file(GCM / "sample-sacct-output-midnight-edge-case.txt", ParseOptions()))
    assert dead == []
    assert len({e.job_id for e in events}) == 306
    assert Counter(e.state.value for e in events) == {
        "RUNNING": 306,
        "FAILED": 259,
        "CANCELLED": 24,
        "COMPLETED": 18,
        "REQUEUED": 2,
        "OUT_OF_MEMORY": 2,
        "TIMEOUT": 1,
    }
    # every job ended in the last five minutes before midnight; their steps ended after it
    midnight = parse_ts("2021-04-08T00:00:00Z")
    ends = [e.ts_ms for e in events if e.state is not JobState.RUNNING]
    assert min(ends) == parse_ts("2021-04-07T23:55:02Z")
    assert max(ends) == parse_ts("2021-04-07T23:59:56Z") < midnight
    assert all("." not in e.job_id for e in events)
    first = events[:2]
    assert brief(first) == [
        ("39125549", "RUNNING", parse_ts("2021-04-05T02:07:20Z")),
        ("39125549", "CANCELLED", parse_ts("2021-04-07T23:59:38Z")),  # "CANCELLED by 1185300516"
    ]
    # only JobID|State|Start|End: no nodes, so NNodes x gpus_per_node = 0, and the option's cluster
    assert (first[1].nodes, first[1].gpus, first[1].cluster, first[1].exit_code) == ((), 0, "default", "")
    array = [e for e in events if e.job_id == "39461339_226"]
    assert [e.state for e in array] == [JobState.RUNNING, JobState.COMPLETED]


def test_gcm_midnight_edge_case_in_a_local_time_zone() -> None:
    events, _ = split(
        parse_file(
            GCM / "sample-sacct-output-midnight-edge-case.txt", ParseOptions(timezone="America/Los_Angeles")
        )
    )
    assert brief(events[:2]) == [
        ("39125549", "RUNNING", parse_ts("2021-04-05T09:07:20Z")),
        ("39125549", "CANCELLED", parse_ts("2021-04-08T06:59:38Z")),
    ]


def test_gcm_sample_of_only_repeated_step_rows_gives_nothing() -> None:
    path = GCM / "sample-sacct-output.txt"
    assert list(parse_file(path, ParseOptions())) == []
    # the same rows as a job row: 68 duplicates give one RUNNING and one COMPLETED event
    lines = path.read_bytes().split(b"\n")
    as_job = [line.replace(b"|8012944_24093.0|", b"|8012944_24093|") for line in lines]
    events, dead = split(parse_lines(as_job, Format.SACCT, ParseOptions(), "as-job.txt"))
    assert dead == []
    assert brief(events) == [
        ("8012944_24093", "RUNNING", parse_ts("2020-11-16T11:59:11Z")),
        ("8012944_24093", "COMPLETED", parse_ts("2020-11-16T11:59:59Z")),
    ]
    assert (events[1].nodes, events[1].gpus, events[1].name, events[1].cluster) == (
        ("node077",),
        8,
        "python3",
        "node",
    )


def test_gcm_running_sample() -> None:
    path = GCM / "sample-sacct-running-output.txt"
    assert list(parse_file(path, ParseOptions())) == []  # ten RUNNING `.extern` step rows
    lines = path.read_bytes().split(b"\n")
    as_job = [line.replace(b"|#6539191_195.extern|#", b"|#6539191_195|#") for line in lines]
    events, dead = split(parse_lines(as_job, Format.SACCT, ParseOptions(), "running.txt"))
    assert dead == []
    assert len(events) == 1
    running = events[0]
    assert (running.job_id, running.state, running.ts_ms) == (
        "6539191_195",
        JobState.RUNNING,
        parse_ts("2023-04-16T16:52:27Z"),
    )
    assert (running.start_ms, running.end_ms, running.nodes, running.gpus) == (
        parse_ts("2023-04-16T16:52:27Z"),
        None,
        ("learnnode0423",),
        1,
    )


# --- synthetic dump ---------------------------------------------------------------------------


def test_synthetic_cluster_dump() -> None:
    events, dead = split(parse_file(SYNTHETIC, ParseOptions(cluster="dflt")))
    assert brief(events) == [
        ("1001", "RUNNING", parse_ts("2024-01-15T08:05:00Z")),  # End=Unknown: RUNNING only
        ("1002", "PENDING", parse_ts("2024-01-15T09:00:00Z")),  # at Submit
        ("1003", "CANCELLED", parse_ts("2024-01-15T07:30:00Z")),  # never started
        ("1004", "RUNNING", parse_ts("2024-01-14T20:00:00Z")),
        ("1004", "NODE_FAIL", parse_ts("2024-01-15T06:12:31Z")),  # its duplicate row: once
        ("1005", "RUNNING", parse_ts("2024-01-15T01:00:05Z")),
        ("1005", "OUT_OF_MEMORY", parse_ts("2024-01-15T01:47:10Z")),
        ("1007", "RUNNING", parse_ts("2024-01-15T04:00:30Z")),
        ("1007", "PREEMPTED", parse_ts("2024-01-15T05:01:00Z")),
        ("1008", "RUNNING", parse_ts("2024-01-15T02:00:01Z")),
        ("1008", "COMPLETED", parse_ts("2024-01-15T02:10:01Z")),
        ("1012_[1-3]", "PENDING", parse_ts("2024-01-15T10:00:00Z")),
        ("1013", "RUNNING", parse_ts("2024-01-15T10:00:00Z")),
        ("1013", "TIMEOUT", parse_ts("2024-01-15T14:00:00Z")),
        ("1015", "RUNNING", parse_ts("2024-01-15T11:00:00Z")),  # after a second header
        ("1015", "COMPLETED", parse_ts("2024-01-15T12:00:00Z")),
    ]
    by_id = {(e.job_id, e.state.value): e for e in events}
    running = by_id[("1001", "RUNNING")]
    assert (running.nodes, running.gpus, running.start_ms, running.end_ms) == (
        ("gpu001", "gpu002", "gpu003", "gpu004"),
        32,
        parse_ts("2024-01-15T08:05:00Z"),
        None,
    )
    assert (running.name, running.user, running.cluster, running.exit_code) == (
        "train_llm",
        "alice",
        "clusterb",
        "0:0",
    )
    pending = by_id[("1002", "PENDING")]
    assert (pending.nodes, pending.gpus, pending.cluster, pending.start_ms) == ((), 16, "dflt", None)
    cancelled = by_id[("1003", "CANCELLED")]
    assert (cancelled.gpus, cancelled.start_ms, cancelled.end_ms) == (
        8,
        None,
        parse_ts("2024-01-15T07:30:00Z"),
    )
    node_fail = by_id[("1004", "NODE_FAIL")]
    assert (node_fail.nodes, node_fail.gpus, node_fail.exit_code) == (
        ("gpu010", "gpu011", "gpu015"),
        24,
        "1:0",
    )
    assert node_fail.source == f"{SYNTHETIC}:7"
    assert by_id[("1005", "OUT_OF_MEMORY")].gpus == 2  # AllocGRES gpu:a100:2(IDX:0-1)
    assert by_id[("1008", "COMPLETED")].name == "caf\ufffd_bench"
    assert by_id[("1012_[1-3]", "PENDING")].gpus == 4  # typed gres/gpu:a100=4 in ReqTRES
    completed = by_id[("1015", "COMPLETED")]
    assert (completed.nodes, completed.gpus, completed.cluster, completed.name) == (
        ("gpu070", "gpu071"),
        16,
        "dflt",
        "",
    )

    assert [(d.location, d.reason) for d in dead] == [
        ("line 10", "record ends early: 7 fields, the header has 15"),
        ("line 13", "job 1009: bad Start time '2024-01-15T25:00:00'"),
        ("line 14", "job 1010: unknown job state 'EXPLODED'"),
        ("line 15", "job 1011: unbalanced '[' in host list 'gpu[043-'"),
        ("line 19", "job 1014: state RUNNING without a Start time"),
        (
            "line 20",
            "row has 17 fields, the header has 15 (a '|' inside a field? use sacct --delimiter='|#')",
        ),
    ]
    lines = SYNTHETIC.read_bytes().split(b"\n")
    assert [d.raw for d in dead] == [lines[n - 1] for n in (10, 13, 14, 15, 19, 20)]


def test_synthetic_dump_in_new_york_time() -> None:
    events, _ = split(parse_file(SYNTHETIC, ParseOptions(timezone="America/New_York")))
    timeout = next(e for e in events if e.state is JobState.TIMEOUT)
    assert (timeout.ts_ms, timeout.start_ms) == (
        parse_ts("2024-01-15T19:00:00Z"),
        parse_ts("2024-01-15T15:00:00Z"),
    )


def test_gpus_fall_back_to_nnodes_times_gpus_per_node() -> None:
    events, _ = split(parse_file(SYNTHETIC, ParseOptions(gpus_per_node=4)))
    by_id = {(e.job_id, e.state.value): e.gpus for e in events}
    assert by_id[("1003", "CANCELLED")] == 4  # 1 node, no gres/gpu anywhere
    assert by_id[("1015", "COMPLETED")] == 8  # 2 nodes from the NodeList, no NNodes column
    assert by_id[("1004", "NODE_FAIL")] == 24  # gres/gpu wins


# --- rules, on small inputs -------------------------------------------------------------------


def parse(*lines: bytes, options: ParseOptions | None = None) -> tuple[list[JobEvent], list[InvalidRecord]]:
    return split(parse_sacct(list(lines), options or ParseOptions(), "t.txt"))


def test_header_columns_in_any_order_and_case_with_custom_delimiter() -> None:
    events, dead = parse(
        b"end|#STATE|#nodelist|#jobid|#Start|#AllocGRES|#NNodes\r\n",
        b"2024-01-15T11:00:00|#COMPLETED|#n[1-2]|#42|#2024-01-15T10:00:00|#PER_NODE:gpu:4|#2\r\n",
    )
    assert dead == []
    assert brief(events) == [
        ("42", "RUNNING", parse_ts("2024-01-15T10:00:00Z")),
        ("42", "COMPLETED", parse_ts("2024-01-15T11:00:00Z")),
    ]
    assert events[1].gpus == 8
    assert events[1].nodes == ("n1", "n2")


def test_multi_line_field_with_blank_line_and_a_pipe_free_continuation() -> None:
    events, dead = parse(
        b"JobID|SubmitLine|State|Start|End",
        b"7|sbatch --wrap 'echo a",
        b"",
        b"echo b'|FAILED|2024-01-15T10:00:00|2024-01-15T10:05:00",
        b"8|x|COMPLETED|2024-01-15T10:00:00|2024-01-15T10:05:00",
    )
    assert dead == []
    assert [(e.job_id, e.state.value, e.source) for e in events] == [
        ("7", "RUNNING", "t.txt:2"),
        ("7", "FAILED", "t.txt:2"),
        ("8", "RUNNING", "t.txt:5"),
        ("8", "COMPLETED", "t.txt:5"),
    ]


def test_truncated_record_at_end_of_file() -> None:
    events, dead = parse(b"JobID|State|Start|End", b"7|FAILED|2024-01-15T10:00:00", b"")
    assert events == []
    assert [(d.location, d.raw) for d in dead] == [("line 2", b"7|FAILED|2024-01-15T10:00:00")]
    assert "file truncated?" in dead[0].reason


def test_rows_before_any_header_are_dead_letters() -> None:
    events, dead = parse(
        b"7|FAILED|2024-01-15T10:00:00|2024-01-15T10:05:00",
        b"JobID|State|Start|End",
        b"8|FAILED|2024-01-15T10:00:00|2024-01-15T10:05:00",
    )
    assert [e.job_id for e in events] == ["8", "8"]
    assert [d.location for d in dead] == ["line 1"]
    assert "no sacct header" in dead[0].reason


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (b"|FAILED|2024-01-15T10:00:00|2024-01-15T10:05:00", "empty JobID"),
        (b"7|FAILED|2024-01-15T10:00:00|Unknown", "job 7: state FAILED without an End time"),
        (b"7|FAILED|2024-01-15T10:00:00|2024-01-15T09:00:00", "job 7: End is before Start"),
        (b"7|FAILED|2024-01-15T10:00:00|tomorrow", "job 7: bad End time 'tomorrow'"),
        (b"7||2024-01-15T10:00:00|2024-01-15T11:00:00", "job 7: unknown job state ''"),
    ],
)
def test_bad_rows(row: bytes, reason: str) -> None:
    events, dead = parse(b"JobID|State|Start|End", row)
    assert events == []
    assert [(d.reason, d.raw, d.location) for d in dead] == [(reason, row, "line 2")]


def test_bad_step_rows_are_still_skipped() -> None:
    assert parse(b"JobID|State|Start|End", b"7.batch|BOGUS|never|never") == ([], [])


def test_epoch_and_offset_times() -> None:
    events, dead = parse(
        b"JobID|State|Start|End",
        b"7|COMPLETED|1705312800|2024-01-15T11:00:00+01:00",
        options=ParseOptions(timezone="Asia/Tokyo"),
    )
    assert dead == []
    assert brief(events) == [
        ("7", "RUNNING", parse_ts("2024-01-15T10:00:00Z")),
        ("7", "COMPLETED", parse_ts("2024-01-15T10:00:00Z")),
    ]


def test_pending_without_submit_is_skipped_and_suspended_counts_as_running() -> None:
    events, dead = parse(
        b"JobID|State|Submit|Start|End",
        b"7|PENDING|Unknown|Unknown|Unknown",
        b"8|SUSPENDED|2024-01-15T09:00:00|2024-01-15T10:00:00|Unknown",
    )
    assert dead == []
    assert brief(events) == [("8", "RUNNING", parse_ts("2024-01-15T10:00:00Z"))]


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("CANCELLED by 1185200069", JobState.CANCELLED),
        ("cancelled", JobState.CANCELLED),
        ("NODE_FAIL", JobState.NODE_FAIL),
        ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY),
        ("TIMEOUT", JobState.TIMEOUT),
        ("PREEMPTED", JobState.PREEMPTED),
        ("REQUEUED", JobState.REQUEUED),
        ("FAILED", JobState.FAILED),
        ("COMPLETED", JobState.COMPLETED),
        ("BOOT_FAIL", JobState.NODE_FAIL),
        ("DEADLINE", JobState.TIMEOUT),
        ("RUNNING+", JobState.RUNNING),
    ],
)
def test_state_names(text: str, state: JobState) -> None:
    assert parse_sacct_state(text) is state


def test_unknown_state_name() -> None:
    with pytest.raises(ValueError, match="unknown job state 'EXPLODED'"):
        parse_sacct_state("EXPLODED")


# --- issue 13: JobIDRaw, default --format -----------------------------------------------------------


def test_jobidraw_is_the_job_id_when_there_is_no_jobid_column() -> None:
    path = DATA / "sacct" / "jobidraw.sacct.txt"
    assert detect_format(path) is Format.SACCT
    events, dead = split(parse_file(path, ParseOptions(cluster="c")))
    assert dead == []
    assert [(e.job_id, e.state.value, e.nodes, e.gpus) for e in events] == [
        ("9100", "RUNNING", ("gpu001", "gpu002"), 16),
        ("9100", "FAILED", ("gpu001", "gpu002"), 16),
        ("9101", "RUNNING", ("gpu003",), 8),
        ("9101", "COMPLETED", ("gpu003",), 8),
        ("9105", "RUNNING", ("gpu004",), 8),
    ]


def test_jobid_wins_over_jobidraw_when_both_are_there() -> None:
    rows = [b"JobIDRaw|JobID|State|Start|End", b"127|123_4|FAILED|2024-01-15T10:00:00|2024-01-15T11:00:00"]
    events, dead = split(parse_sacct(rows, ParseOptions(), "s"))
    assert dead == [] and {e.job_id for e in events} == {"123_4"}


def test_partition_is_read_when_the_header_has_it_and_empty_when_not() -> None:
    rows = [
        b"JobID|Partition|State|Start|End",
        b"1|train|FAILED|2024-01-15T10:00:00|2024-01-15T11:00:00",
        b"2||COMPLETED|2024-01-15T10:00:00|2024-01-15T11:00:00",
        b"JobID|State|Start|End",  # a second table, without the column
        b"3|FAILED|2024-01-15T10:00:00|2024-01-15T11:00:00",
    ]
    events, dead = split(parse_sacct(rows, ParseOptions(), "s"))
    assert dead == []
    assert [(e.job_id, e.state.value, e.partition) for e in events] == [
        ("1", "RUNNING", "train"),
        ("1", "FAILED", "train"),
        ("2", "RUNNING", ""),
        ("2", "COMPLETED", ""),
        ("3", "RUNNING", ""),
        ("3", "FAILED", ""),
    ]


def test_default_format_is_one_dead_letter_naming_the_columns_and_the_command() -> None:
    path = DATA / "sacct" / "default-format.sacct.txt"
    assert detect_format(path) is Format.SACCT
    events, dead = split(parse_file(path, ParseOptions()))
    assert events == []
    assert len(dead) == 1  # one for the file, not one per job
    assert dead[0].location == "line 1"
    assert "no Start and no End column" in dead[0].reason
    assert "--format=JobID,State,Submit,Start,End,NodeList" in dead[0].reason


def test_a_table_without_times_does_not_spoil_the_next_table() -> None:
    rows = [
        b"JobID|State|ExitCode",
        b"1|FAILED|1:0",
        b"JobID|State|Start|End",
        b"2|FAILED|2024-01-15T10:00:00|2024-01-15T11:00:00",
    ]
    events, dead = split(parse_sacct(rows, ParseOptions(), "s"))
    assert [(e.job_id, e.state.value) for e in events] == [("2", "RUNNING"), ("2", "FAILED")]
    assert len(dead) == 1 and "no Start and no End" in dead[0].reason


def test_the_docs_give_the_sacct_command_the_dead_letter_names() -> None:
    reference = (Path(__file__).resolve().parents[5] / "docs" / "configuration.md").read_text()
    assert SACCT_COMMAND in reference
