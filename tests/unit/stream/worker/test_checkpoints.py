"""Checkpoint encoding: a restored core continues exactly as the original; foreign blobs are refused."""

from __future__ import annotations

import pickle
import zlib
from types import SimpleNamespace

import pytest

from detectors.core import CoreConfig, DetectionCore
from schemas.records import XidEvent
from stream.worker.checkpoints import CheckpointError, HeldLines, PartitionCheckpoint, decode, encode

MINUTE = 60_000


def xid(minute: int, code: int = 13) -> XidEvent:
    return XidEvent(ts_ms=minute * MINUTE, cluster="c", node="n1", xid=code, pci_bus_id="0000:07:00")


def test_a_restored_core_emits_what_the_original_would_have() -> None:
    original = DetectionCore(CoreConfig())
    for minute in range(0, 30, 3):
        original.process(xid(minute))
    original.drain()
    blob = encode(PartitionCheckpoint(2, {"xid": 9}, original, [("xid", 31 * MINUTE, xid(31))]))
    restored = decode(blob)
    assert (restored.partition, restored.offsets, [r[2] for r in restored.held]) == (2, {"xid": 9}, [xid(31)])
    later = [xid(40, 79), xid(200), xid(400, 79)]
    outputs = []
    for core in (original, restored.core):
        for record in later:
            core.process(record)
        outputs.append([(i.incident_id, i.version, i.status) for i in core.drain().incidents])
    assert outputs[0] == outputs[1] and outputs[0]


def test_a_blob_of_another_format_is_refused_with_what_to_do() -> None:
    format_1 = zlib.compress(pickle.dumps((1, "a checkpoint of the flat stream/ layout")))
    with pytest.raises(CheckpointError, match=r"before checkpoint format 2.*delete the checkpoint topic"):
        decode(format_1)
    with pytest.raises(CheckpointError, match=r"format 2 is not 5.*delete the checkpoint topic"):
        decode(b"faultstream-checkpoint/2\n" + format_1)
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        decode(b"faultstream-checkpoint/3\nnot zlib")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        decode(b"faultstream-checkpoint/5\nnot an lz4 frame")


def wire_held(count: int) -> list[tuple[str, int, bytes, str]]:
    """Held records as a worker holds them: merge source, event time, line, record source."""
    return [
        (
            ("ecc", "xid", "job")[i % 3],
            i * MINUTE,
            b'{"ts":%d,"node":"n%d"}' % (i * MINUTE, i),
            f"t.ecc/0:offset {i} line 1",
        )
        for i in range(count)
    ]


def test_held_lines_come_back_in_order_whatever_the_format_that_stored_them() -> None:
    core = DetectionCore(CoreConfig())
    held = wire_held(1000)
    checkpoint = PartitionCheckpoint(0, {"ecc": 3}, core, list(held))
    blob = encode(checkpoint)
    assert blob.startswith(b"faultstream-checkpoint/5\n")
    assert checkpoint.held == held  # encoding left the caller's checkpoint alone
    assert decode(blob).held == held
    # As a worker writes them: in columns, made from what its merge holds.
    merged = [
        (source, ts, (SimpleNamespace(source=record_source), line))
        for source, ts, line, record_source in held
    ]
    assert decode(encode(PartitionCheckpoint(0, {"ecc": 3}, core, HeldLines.of_merge(merged)))).held == held
    # A format 4 checkpoint (zlib, the held lines a list) written before this version: restored.
    format_4 = b"faultstream-checkpoint/4\n" + zlib.compress(pickle.dumps(checkpoint))
    assert decode(format_4).held == held
    # Nothing held: no column of one empty line.
    assert decode(encode(PartitionCheckpoint(0, {}, core, []))).held == []


def test_records_held_as_format_3_held_them_are_stored_as_records() -> None:
    """Columns are for held lines (format 4 on); a held record itself (format 3) stays a record."""
    legacy = [("xid", 31 * MINUTE, xid(31))]
    restored = decode(encode(PartitionCheckpoint(2, {"xid": 9}, DetectionCore(CoreConfig()), legacy)))
    assert restored.held == legacy
