"""The wire contract of the input topics (pure logic: no broker)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import random
from pathlib import Path

import jsonschema
import msgspec
import orjson
import pytest

from schemas.records import EccSample, InvalidRecord, JobEvent, JobState, XidEvent
from stream.inputs.files import LateRecord, MergedInputs
from stream.inputs.parsers.options import ParseOptions
from stream.kafka import codec
from stream.kafka.codec import (
    decode_message,
    decode_message_lines,
    decode_record,
    encode_record,
    message_lines,
    partition_for_key,
    record_key,
)
from stream.kafka.publish import MessageBatcher


def _astuple(record):
    """A record's fields: the ECC sample is a msgspec Struct, the others dataclasses."""
    return (
        msgspec.structs.astuple(record) if isinstance(record, msgspec.Struct) else dataclasses.astuple(record)
    )


ROOT = Path(__file__).resolve().parents[4]
SCHEMAS = ROOT / "schemas" / "jsonschema"
EXAMPLE = sorted((ROOT / "examples" / "sim-48x14" / "logs").iterdir())
KIND_OF_TOPIC = {"faultstream.xid": "xid", "faultstream.ecc": "ecc", "faultstream.jobs": "job"}


def line_validators() -> dict[str, jsonschema.Validator]:
    wire = json.loads((SCHEMAS / "wire_message.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(wire)
    validators = {}
    for topic, name in wire["x-faultstream-line-schemas"].items():
        schema = json.loads((SCHEMAS / name).read_text())
        validators[topic] = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return validators


def test_batched_messages_of_the_example_follow_the_wire_schema_and_decode_back() -> None:
    validators = line_validators()
    topic_of = {XidEvent: "faultstream.xid", JobEvent: "faultstream.jobs"}
    partitions = {"faultstream.xid": 3, "faultstream.ecc": 3, "faultstream.jobs": 1}
    batcher = MessageBatcher(partitions, records=64)
    sent: dict[str, list[dict]] = {}
    messages = []
    inputs = MergedInputs(EXAMPLE, ParseOptions(cluster="default"), None, 300_000)
    for item, _ in itertools.islice(inputs, 5000):
        assert not isinstance(item, InvalidRecord | LateRecord)
        topic = topic_of.get(type(item), "faultstream.ecc")
        sent.setdefault(topic, []).append(item.to_dict())
        messages += batcher.add(topic, record_key(item), item.ts_ms, encode_record(item))
    messages += batcher.drain()
    assert {m.topic for m in messages} == set(partitions) and max(m.records for m in messages) == 64
    # Sent in event-time order across topics and partitions: no message starts before an earlier
    # one's first record (a sparse topic's records never wait behind a dense one's).
    firsts = [m.timestamp_ms for m in messages]
    assert firsts == sorted(firsts)
    received: dict[str, list[dict]] = {}
    for offset, message in enumerate(messages):
        for line in message.value.split(b"\n"):
            validators[message.topic].validate(json.loads(line))
        for record in decode_message(KIND_OF_TOPIC[message.topic], message.value, "t/0", offset):
            assert not isinstance(record, InvalidRecord)
            assert partition_for_key(record_key(record), partitions[message.topic]) == message.partition
            received.setdefault(message.topic, []).append(record.to_dict())
    for topic, records in sent.items():
        key = "job_id" if topic == "faultstream.jobs" else "node"
        for name in {record[key] for record in records}:  # each key's records, all of them, in order
            assert [r for r in received[topic] if r[key] == name] == [r for r in records if r[key] == name]


def test_a_bad_line_is_its_own_dead_letter_and_spoils_nothing_around_it() -> None:
    good = encode_record(
        JobEvent(ts_ms=1704067200000, cluster="c", job_id="1", state=JobState.RUNNING, nodes=("n1",))
    )
    value = b"\n".join(
        [good, b'{"ts": 1704067200000, "cluster": "c", "job_id": "2", "state": "SLEEPING"}', b"", good]
    )
    items = list(decode_message("job", value, "jobs/0", 41))
    assert [type(i).__name__ for i in items] == ["JobEvent", "InvalidRecord", "JobEvent"]
    bad = items[1]
    assert isinstance(bad, InvalidRecord)
    assert (bad.source, bad.location) == ("jobs/0", "offset 41 line 2")
    assert bad.raw == b'{"ts": 1704067200000, "cluster": "c", "job_id": "2", "state": "SLEEPING"}'


def test_an_empty_value_is_a_dead_letter_and_empty_lines_are_no_records() -> None:
    [empty] = decode_message("xid", b"", "xid/0", 3)
    assert isinstance(empty, InvalidRecord) and empty.location == "offset 3"
    assert list(decode_message("xid", b"\n\n  \n", "xid/0", 4)) == []


def test_a_message_without_a_value_is_one_dead_letter() -> None:
    """A tombstone on an input topic stopped the worker with a TypeError (found by the fuzz test)."""
    [item] = list(decode_message("job", None, "jobs/0", 12))
    assert isinstance(item, InvalidRecord)
    assert item.location == "offset 12" and item.reason.startswith("not JSON") and item.raw == b""


# The typed decoder of ECC lines (msgspec) beside the reference path (orjson + from_dict's own
# validator): mutated lines, raw bytes included, give the same sample or the same dead-letter reason.
_ECC_BASE = {"ts": 1705314225000, "cluster": "c", "node": "n", "gpu": 0, "pci_bus_id": "00000000:07:00.0",
             "counters": {"sbe_volatile": 3, "dbe_volatile": 0}}  # fmt: skip
_ECC_MUTATIONS = [
    None, 0, -1, 1, True, 1.0, 1.5, "", " ", "x", "2024-01-15T10:23:45.5+01:00", "2024-02-30T00:00:00Z",
    "PCI:0000:3B:00", "nonsense", [], {}, {"sbe_volatile": 1}, {"bogus": 1}, {"sbe_volatile": -1},
    {"sbe_volatile": True}, {"sbe_volatile": 1.0}, {"sbe_volatile": 2**64}, {"sbe_volatile": 2**31 - 8},
    {"sbe_volatile": 2**31 - 17}, {"sbe_volatile": 2**31 - 16}, {"sbe_volatile": 2**40}, {"dbe_volatile": 0, "bogus": 0},
    10**20, 2**63, 946_684_799_999, 4_102_444_800_000,
]  # fmt: skip


# The same for job state changes (typed decoder, then JobEvent.from_fields), against the reference
# validator itself.
_JOB_BASE = {"ts": 1704068533000, "cluster": "sim", "job_id": "4200001", "state": "RUNNING", "gpus": 8,
             "start": 1704068533000, "end": 1704070828000, "exit_code": "0:125", "name": "train",
             "user": "u1", "partition": "debug", "nodes": ["node0001", "node0002"]}  # fmt: skip
_JOB_MUTATIONS = [
    None, 0, -1, 1, 7, True, 1.0, 1.5, "", " ", "x", "7", "failed", "FAILED", "NODE_FAIL", "nonsense",
    "2024-01-15T10:23:45.5+01:00", "2024-02-30T00:00:00Z", [], [""], ["n1"], ["n1", 2], [None], {}, {"a": 1},
    10**20, 2**63, 2**32, 2**32 - 1, 946_684_799_999, 4_102_444_800_000,
]  # fmt: skip


def _reference(parse, line: bytes) -> object:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "not json"
    try:
        return "accepted", _astuple(parse(document, "t/0:offset 1"))
    except InvalidRecord as exc:
        return "rejected", exc.reason


def _decoded(kind: str, line: bytes) -> object:
    try:
        record = decode_record(kind, line, "t/0", "offset 1")
    except InvalidRecord as exc:
        return "not json" if exc.reason.startswith("not JSON") else ("rejected", exc.reason)
    return "accepted", _astuple(record)


@pytest.mark.parametrize(
    ("kind", "reference", "base", "mutations", "seed", "lines"),
    [
        ("ecc", EccSample.from_dict, _ECC_BASE, _ECC_MUTATIONS, 20261201, 3000),
        ("job", JobEvent._from_dict_checked, _JOB_BASE, _JOB_MUTATIONS, 20261205, 4000),
    ],
)
def test_the_typed_decoders_agree_with_the_reference_validator(kind, reference, base, mutations, seed, lines):
    rng = random.Random(seed)
    keys = [*base, "extra"]
    outcomes = set()
    for n in range(lines):
        document = copy.deepcopy(base)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            key = rng.choice(keys)
            if rng.random() < 0.15:
                document.pop(key, None)
            else:
                document[key] = copy.deepcopy(rng.choice(mutations))
        line = json.dumps(document, separators=(",", ":") if n % 2 else None).encode()
        if n % 50 == 0:
            line = line[: rng.randrange(len(line))]  # truncated
        got = _decoded(kind, line)
        assert got == _reference(reference, line), (kind, line)
        outcomes.add(got[0] if isinstance(got, tuple) else got)
    assert outcomes == {"accepted", "rejected", "not json"}


def _line_by_line(kind: str, value: bytes, offset: int) -> list[tuple[object, bytes]]:
    decoded: list[tuple[object, bytes]] = []
    for location, line in message_lines(value, offset):
        try:
            decoded.append((decode_record(kind, line, "ecc/0", location), line))
        except InvalidRecord as exc:
            decoded.append((exc, line))
    return decoded


def _comparable(items: list[tuple[object, bytes]]) -> list[object]:
    return [
        ("invalid", item.reason, item.source, item.location, item.raw, line)
        if isinstance(item, InvalidRecord)
        else (_astuple(item), line)
        for item, line in items
    ]


def test_a_message_of_ecc_lines_decodes_as_its_lines_one_by_one() -> None:
    """ECC messages are decoded in one call of a typed decoder (straight into samples, or into
    fields when times are ISO-8601 strings): every record, location, dead letter and line as the
    line-by-line path gives them, whatever the message holds."""
    rng = random.Random(20261205)
    keys = [*_ECC_BASE, "extra"]
    paths = set()
    for offset in range(400):
        lines = []
        for n in range(rng.randrange(1, 12)):
            document = copy.deepcopy(_ECC_BASE)
            document["node"] = f"node{n:04d}"
            if offset % 3 == 0:  # the wire form's other spelling of times, a message's worth
                document["ts"] = "2024-01-15T10:23:45.5Z"
            if rng.random() < 0.2:  # one mutated field: some lines are refused, some accepted
                document[rng.choice(keys)] = copy.deepcopy(rng.choice(_ECC_MUTATIONS))
            line = json.dumps(document, separators=(",", ":")).encode()
            if rng.random() < 0.02:
                line = line[: rng.randrange(len(line))]
            if rng.random() < 0.02:
                line = b"  " if rng.random() < 0.5 else b""
            lines.append(line)
        value = b"\n".join(lines) + (b"\n" if rng.random() < 0.3 else b"")
        expected = _comparable(_line_by_line("ecc", value, offset))
        batched = codec._decode_ecc_message(value, "ecc/0", offset, None) if b"\n" in value else None
        paths.add("batched" if batched is not None else "line by line")
        if batched is not None and codec._iso_times(value.split(b"\n")[0]):
            paths.add("batched, ISO-8601 times")
        if batched is not None and any(isinstance(item, InvalidRecord) for item, _ in batched):
            paths.add("batched, a line refused by the sample's checks")
        assert _comparable(list(decode_message_lines("ecc", value, "ecc/0", offset))) == expected, value
    assert paths == {
        "batched",
        "batched, ISO-8601 times",
        "batched, a line refused by the sample's checks",
        "line by line",
    }


@pytest.mark.parametrize("kind", ["ecc", "job"])
def test_a_line_that_is_not_utf8_is_a_dead_letter_beside_good_ones(kind: str) -> None:
    """msgspec raises UnicodeDecodeError, not its DecodeError, on bytes that are not UTF-8 in a
    string: the typed decoders crashed the worker on one (found by the fuzz test)."""
    good = {"ecc": _ECC_BASE, "job": _JOB_BASE}[kind]
    line = json.dumps(good).encode()
    bad = line.replace(b'"c"' if kind == "ecc" else b'"sim"', b'"\xff\xfec"', 1)
    assert bad != line
    value = b"\n".join([line, bad, line])
    items = [item for item, _ in decode_message_lines(kind, value, f"{kind}/0", 9)]
    assert [type(item).__name__ for item in items][1] == "InvalidRecord"
    assert not any(isinstance(item, InvalidRecord) for item in (items[0], items[2])), items
    assert items[1].location == "offset 9 line 2" and items[1].raw == bad
    assert items[1].reason.startswith("not JSON")
    with pytest.raises(InvalidRecord, match="not JSON"):
        decode_record(kind, bad, f"{kind}/0", "offset 10")


_XID_BASE = {"ts": 1705314225000, "cluster": "c", "node": "n", "xid": 79, "pci_bus_id": "00000000:07:00.0"}
_XID_MUTATIONS = [None, "79", -1, 1.5, [], {}, "", "not a time", 10**20]


@pytest.mark.parametrize(
    ("kind", "base", "mutations"),
    [
        ("ecc", _ECC_BASE, _ECC_MUTATIONS),
        ("xid", _XID_BASE, _XID_MUTATIONS),
        ("job", _JOB_BASE, _JOB_MUTATIONS),
    ],
)
def test_a_joined_message_decodes_as_its_one_record_messages_each_alone(
    kind: str, base: dict[str, object], mutations: list[object]
) -> None:
    """One-record messages the worker's fetch joined (stream.worker.joining): every record, dead
    letter, location and line as the messages give them one by one, blank and refused ones too."""
    rng = random.Random(20261205)
    keys = [*base, "extra"]
    paths = set()
    first = 1_000
    for _ in range(300):
        values = []
        for n in range(rng.randrange(2, 12)):
            document = copy.deepcopy(base)
            document["node"] = f"node{n:04d}"
            if rng.random() < 0.2:
                document[rng.choice(keys)] = copy.deepcopy(rng.choice(mutations))
            value = json.dumps(document, separators=(",", ":")).encode()
            if rng.random() < 0.03:
                value = value[: rng.randrange(len(value))]
            if rng.random() < 0.03:
                value = rng.choice([b"", b"  ", b"\r", value + b"\r"])
            values.append(value)
        last = first + len(values) - 1
        alone = [
            pair
            for number, value in enumerate(values)
            for pair in decode_message_lines(kind, value, f"{kind}/3", first + number)
        ]
        joined = b"\n".join(values)
        got = list(decode_message_lines(kind, joined, f"{kind}/3", last, joined_from=first))
        assert _comparable(got) == _comparable(alone), values
        assert [location for location, _ in message_lines(joined, last, first)] == [
            f"offset {offset}" for offset in range(first, last + 1)
        ]
        if kind == "ecc":
            paths.add(
                "batched" if codec._decode_ecc_message(joined, "ecc/3", last, first) else "line by line"
            )
        first = last + 1
    assert kind != "ecc" or paths == {"batched", "line by line"}
