"""JSON Lines parser: kind by keys or explicit "kind", default cluster, dead letters with reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.records import EccSample, InvalidRecord, JobEvent, JobState, XidEvent
from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format, ParseOptions, parse_file, parse_lines
from stream.inputs.parsers.jsonl import parse_jsonl

DATA = Path(__file__).resolve().parents[4] / "data" / "jsonl"


def test_sample_file() -> None:
    path = DATA / "events.jsonl"
    items = list(parse_file(path, ParseOptions(cluster="dflt")))
    records = [item for item in items if not isinstance(item, InvalidRecord)]
    dead = [item for item in items if isinstance(item, InvalidRecord)]

    assert records == [
        XidEvent(
            ts_ms=parse_ts("2024-01-15T10:23:45Z"),
            cluster="c1",
            node="node001",
            xid=79,
            pci_bus_id="0000:3b:00",
            pid=1101234,
            process="python",
            message="GPU has fallen off the bus.",
            source=f"{path}:1",
        ),
        EccSample(
            ts_ms=parse_ts("2024-01-15T10:24:00Z"),
            cluster="dflt",  # no "cluster" key: the option's
            node="node001",
            gpu=3,
            pci_bus_id="0000:3b:00",
            counters={"dbe_volatile": 1, "sbe_volatile": 12, "remap_pending": 1},
            source=f"{path}:2",
        ),
        JobEvent(
            ts_ms=parse_ts("2024-01-15T10:30:00Z"),
            cluster="c1",
            job_id="4242",
            state=JobState.FAILED,
            nodes=("node001", "node002"),
            gpus=16,
            start_ms=parse_ts("2024-01-15T08:00:00Z"),
            end_ms=parse_ts("2024-01-15T10:30:00Z"),
            exit_code="1:0",
            name="train",
            user="alice",
            source=f"{path}:3",
        ),
        XidEvent(  # explicit kind wins over the "counters" key
            ts_ms=parse_ts("2024-01-15T10:37:00Z"),
            cluster="c1",
            node="node002",
            xid=48,
            source=f"{path}:12",
        ),
    ]
    lines = path.read_bytes().split(b"\n")
    assert [(d.location, d.raw) for d in dead] == [
        (f"line {n}", lines[n - 1].rstrip(b"\r")) for n in (5, 6, 7, 8, 9, 10, 11, 13)
    ]
    reasons = [d.reason for d in dead]
    assert reasons[0] == "xid record: field 'xid' must be >= 1, got 0"
    assert reasons[1].startswith("invalid JSON: ")
    assert reasons[2] == "a record must be a JSON object, got list"
    assert reasons[3] == "unknown record kind 'metric' (known: xid, ecc, job)"
    assert reasons[4] == "cannot tell the record kind: no 'xid', 'counters' or 'job_id' key and no 'kind'"
    assert reasons[5].startswith("invalid JSON: ") and "UTF-8" in reasons[5]
    assert reasons[6] == "ecc record: ECC counter 'dbe_volatile' must be a non-negative integer, got -1"
    assert reasons[7] == "job record: field 'ts': not an ISO-8601 timestamp: 'yesterday'"
    assert {d.source for d in dead} == {str(path)}


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b'{"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 31}', XidEvent),
        (b'{"ts": 1704067200000, "node": "n", "gpu": 0, "counters": {}}', EccSample),
        (b'{"ts": 1704067200000, "job_id": "9", "state": "RUNNING"}', JobEvent),
        (b'{"kind": "job", "ts": 1704067200000, "job_id": "9", "state": "running", "xid": 5}', JobEvent),
        (
            b'{"kind": "ecc", "ts": 1704067200000, "node": "n", "pci_bus_id": "0000:3b:00", "counters": {}, "job_id": "x"}',
            EccSample,
        ),
    ],
)
def test_kind_selection(line: bytes, kind: type) -> None:
    (record,) = parse_jsonl([line + b"\r\n"], ParseOptions(cluster="k"), "s")
    assert isinstance(record, kind)
    assert record.source == "s:1"


def test_explicit_empty_cluster_is_not_replaced() -> None:
    (dead,) = parse_lines(
        [b'{"ts": 1704067200000, "cluster": "", "node": "n", "xid": 31}'], Format.JSONL, ParseOptions(), "s"
    )
    assert isinstance(dead, InvalidRecord)
    assert dead.reason == "xid record: field 'cluster' must not be empty"


def test_blank_lines_are_skipped_and_numbering_is_kept() -> None:
    lines = [b"", b"   ", b"\r\n", b'{"ts": 1704067200000, "node": "n", "xid": 31}\n']
    (record,) = parse_jsonl(lines, ParseOptions(), "s")
    assert isinstance(record, XidEvent)
    assert (record.source, record.cluster) == ("s:4", "default")
