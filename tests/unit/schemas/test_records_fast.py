"""The wire form (``to_wire``) and the fast path of ``from_dict``: same records, same rejections."""

import copy
import dataclasses
import json
import pickle
import random
from pathlib import Path

import jsonschema
import msgspec
import orjson
import pytest

from schemas.records import (
    EccSample,
    InvalidRecord,
    JobEvent,
    JobState,
    XidEvent,
    finish_decoded_ecc_samples,
    normalize_pci_bus_id,
)


def _astuple(record):
    """A record's fields: the ECC sample is a msgspec Struct, the others dataclasses."""
    return (
        msgspec.structs.astuple(record) if isinstance(record, msgspec.Struct) else dataclasses.astuple(record)
    )


SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "jsonschema"

RECORDS = [
    XidEvent(ts_ms=1705314225123, cluster="c", node="n1", xid=48, pci_bus_id="0000:3b:00", gpu=2, pid=7,
             process="python", message="DBE"),
    XidEvent(ts_ms=1704067200000, cluster="c", node="n1", xid=79),
    XidEvent(ts_ms=1704067200000, cluster="c", node="n1", xid=12028, pci_bus_id="0000:05:00",
             message="Non-fatal, Link 33", device="nvswitch"),
    XidEvent(ts_ms=1705314225000, cluster="c", node="n1", xid=79, pci_bus_id="0000:3b:00", gpu=0,
             message="reported by DCGM field 230", since_ms=1705314195000),
    XidEvent(ts_ms=1705314225000, cluster="c", node="n1", xid=79, gpu=0, since_ms=0),
    EccSample(ts_ms=1705314225000, cluster="c", node="n1", gpu=1, pci_bus_id="0000:07:00",
              counters={"sbe_volatile": 5, "remap_failure": 1}),
    EccSample(ts_ms=1704067199999, cluster="c", node="n1", pci_bus_id="0000:07:00", counters={}),
    JobEvent(ts_ms=1705314225000, cluster="c", job_id="9_1", state=JobState.NODE_FAIL, nodes=("a", "b"),
             gpus=16, start_ms=1705310000000, end_ms=1705314225000, exit_code="0:9", name="train", user="u",
             partition="gpu"),
    JobEvent(ts_ms=1705310000000, cluster="c", job_id="10", state=JobState.RUNNING, start_ms=1705310000000),
]  # fmt: skip
SCHEMA_OF = {XidEvent: "xid_event", EccSample: "ecc_sample", JobEvent: "job_event"}


def _no_reference(monkeypatch, record_type):
    """Make the reference validator fail the test: the document must be taken by the fast path."""

    def refuse(value, source):
        raise AssertionError(f"not on the fast path: {value!r}")

    monkeypatch.setattr(record_type, "_from_dict_checked", refuse)


@pytest.mark.parametrize("record", RECORDS, ids=repr)
def test_wire_form_round_trips_on_the_fast_path(record, monkeypatch):
    record_type = type(record)
    _no_reference(monkeypatch, record_type)
    document = orjson.loads(orjson.dumps(record.to_wire()))
    assert record_type.from_dict(document, record.source) == record


@pytest.mark.parametrize("record", RECORDS, ids=repr)
def test_iso_form_round_trips_on_the_fast_path(record, monkeypatch):
    record_type = type(record)
    _no_reference(monkeypatch, record_type)
    assert record_type.from_dict(orjson.loads(orjson.dumps(record.to_dict()))) == record


@pytest.mark.parametrize("record", RECORDS, ids=repr)
def test_wire_form_is_the_json_form_with_integer_times(record):
    wire, human = record.to_wire(), record.to_dict()
    assert list(wire) == list(human)
    times = {"ts": record.ts_ms}
    if isinstance(record, JobEvent):
        times.update(start=record.start_ms, end=record.end_ms)
    for key in wire:
        if key in times:
            assert isinstance(wire[key], int) and wire[key] == times[key]
            assert isinstance(human[key], str)
        else:
            assert wire[key] == human[key]


@pytest.mark.parametrize("record", RECORDS, ids=repr)
def test_wire_form_satisfies_the_json_schema(record):
    schema = json.loads((SCHEMAS / f"{SCHEMA_OF[type(record)]}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    validator.validate(record.to_wire())


@pytest.mark.parametrize(
    ("record_type", "document"),
    [
        (XidEvent, {"cluster": "c", "node": "n1", "xid": 79, "pci_bus_id": "00000000:3B:00.0", "gpu": 0}),
        (EccSample, {"cluster": "c", "node": "n1", "gpu": 0, "counters": {"sbe_volatile": 3}}),
        (JobEvent, {"cluster": "c", "job_id": 17, "state": "failed", "nodes": ["n1"], "gpus": 8}),
    ],
)  # fmt: skip
def test_integer_and_iso_timestamps_decode_to_the_same_record(record_type, document):
    iso = {"ts": "2024-01-15T10:23:45.123Z"}
    integer = {"ts": 1705314225123}
    if record_type is JobEvent:
        iso |= {"start": "2024-01-15T09:23:45+00:00", "end": "2024-01-15T11:23:45.123+01:00"}
        integer |= {"start": 1705310625000, "end": 1705314225123}
    from_iso = record_type.from_dict(document | iso, "s")
    from_integer = record_type.from_dict(document | integer, "s")
    assert from_iso == from_integer
    assert from_iso.ts_ms == 1705314225123


@pytest.mark.parametrize(
    ("record_type", "document", "reason"),
    [
        (XidEvent, {"ts": 1.5, "cluster": "c", "node": "n", "xid": 79},
         "field 'ts': timestamp must be an ISO-8601 string or epoch milliseconds, got 1.5"),
        (XidEvent, {"ts": True, "cluster": "c", "node": "n", "xid": 79},
         "field 'ts': timestamp must be an ISO-8601 string or epoch milliseconds, got True"),
        (XidEvent, {"ts": "yesterday", "cluster": "c", "node": "n", "xid": 79},
         "field 'ts': not an ISO-8601 timestamp: 'yesterday'"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "xid": 79}, "missing required field 'node'"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": " ", "xid": 79}, "field 'node' must not be empty"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "gpu": -1}, "field 'gpu' must be >= 0, got -1"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": True},
         "field 'xid' must be an integer, got bool"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "pci_bus_id": "nonsense"},
         "field 'pci_bus_id': not a PCI bus id: 'nonsense'"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": -2, "counters": {}},
         "field 'gpu' must be >= 0, got -2"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "gpu": 0, "counters": {}}, "missing required field 'node'"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0, "counters": [1, 2]},
         "field 'counters' must be an object of counter name to integer"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0, "counters": {"sbe_volatile": True}},
         "ECC counter 'sbe_volatile' must be a non-negative integer, got True"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "counters": {}},
         "an ECC sample needs 'gpu' or 'pci_bus_id' to name its GPU"),
        (EccSample, {"ts": 0, "cluster": "c", "node": "n", "gpu": 0, "counters": {"remap_failure": 9223372036854775794}},
         "ECC counter 'remap_failure' is 9223372036854775794, a DCGM blank sentinel ('no value'), not a count: "
         "leave the counter out"),
        (XidEvent, {"ts": 0, "cluster": "c", "node": "n", "xid": 79, "device": "switch"},
         "field 'device' must be one of gpu, nvswitch, got 'switch'"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "since": 1704067200001},
         "field 'since' must not be after 'ts', got 1704067200001 > 1704067200000"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "since": "0"},
         "field 'since' must be an integer, got str"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "since": -1},
         "field 'since' must be >= 0, got -1"),
        (EccSample, {"ts": [0], "cluster": "c", "node": "n", "gpu": 0, "counters": {}},
         "field 'ts': timestamp must be an ISO-8601 string or epoch milliseconds, got [0]"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "EXPLODED"},
         "field 'state': unknown job state 'EXPLODED' (known: PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, "
         "TIMEOUT, CANCELLED, PREEMPTED, REQUEUED, OUT_OF_MEMORY)"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "nodes": None},
         "field 'nodes' must be a list of node names"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": True, "state": "FAILED"},
         "field 'job_id' must be a string, got bool"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "end": 1.0},
         "field 'end': timestamp must be an ISO-8601 string or epoch milliseconds, got 1.0"),
        # Out of the columns' ranges or of any plausible clock: dead letters, never a failed insert.
        (XidEvent, {"ts": 0, "cluster": "c", "node": "n", "xid": 79},
         "field 'ts' out of range (0 is not between 2000-01-01 and 2100-01-01 UTC)"),
        (XidEvent, {"ts": "2200-01-01T00:00:00Z", "cluster": "c", "node": "n", "xid": 79},
         "field 'ts' out of range ('2200-01-01T00:00:00Z' is not between 2000-01-01 and 2100-01-01 UTC)"),
        (XidEvent, {"ts": -10**15, "cluster": "c", "node": "n", "xid": 79},
         "field 'ts' out of range (-1000000000000000 is not between 2000-01-01 and 2100-01-01 UTC)"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 65536},
         "field 'xid' must be <= 65535, got 65536"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "gpu": 2**63},
         "field 'gpu' must be <= 65535, got 9223372036854775808"),
        (XidEvent, {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "pid": 2**32},
         "field 'pid' must be <= 4294967295, got 4294967296"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 65536, "counters": {}},
         "field 'gpu' must be <= 65535, got 65536"),
        (EccSample, {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0, "counters": {"sbe_volatile": 2**64}},
         "ECC counter 'sbe_volatile' must be <= 18446744073709551615, got 18446744073709551616"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "gpus": 2**32},
         "field 'gpus' must be <= 4294967295, got 4294967296"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "start": "1970-01-01T00:00:00Z"},
         "field 'start' out of range ('1970-01-01T00:00:00Z' is not between 2000-01-01 and 2100-01-01 UTC)"),
        (JobEvent, {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "end": 2**62},
         "field 'end' out of range (4611686018427387904 is not between 2000-01-01 and 2100-01-01 UTC)"),
    ],
)  # fmt: skip
def test_malformed_documents_name_the_field(record_type, document, reason):
    with pytest.raises(InvalidRecord) as caught:
        record_type.from_dict(document)
    assert caught.value.reason == reason


def test_a_record_built_by_the_fast_path_is_an_ordinary_record():
    built = XidEvent.from_dict(
        {"ts": 1704067200005, "cluster": "c", "node": "n", "xid": 79, "pci_bus_id": "0000:07:00"}, "s"
    )
    constructed = XidEvent(
        ts_ms=1704067200005, cluster="c", node="n", xid=79, pci_bus_id="0000:07:00", source="s"
    )
    assert type(built) is XidEvent
    assert built == constructed and hash(built) == hash(constructed) and repr(built) == repr(constructed)
    assert pickle.loads(pickle.dumps(built)) == constructed
    assert dataclasses.replace(built, xid=48).xid == 48
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.xid = 48  # type: ignore[misc]


def test_the_record_owns_its_counters():
    counters = {"sbe_volatile": 1}
    sample = EccSample.from_dict(
        {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0, "counters": counters}
    )
    counters["sbe_volatile"] = 2
    assert sample.counters == {"sbe_volatile": 1}


def test_a_rejected_pci_bus_id_is_rejected_again():
    for _ in range(2):  # the cache keeps results, never failures
        with pytest.raises(ValueError, match="not a PCI bus id"):
            normalize_pci_bus_id("nonsense")


# A differential test: mutate valid documents at random and check that from_dict (fast path
# first) and the reference validator alone agree on every one: the same record, or the same
# rejection reason.

BASES = {
    XidEvent: {"ts": "2024-01-15T10:23:45.123Z", "cluster": "c", "node": "n1", "xid": 79,
               "pci_bus_id": "00000000:3B:00.0", "gpu": 3, "pid": 12, "process": "python", "message": "m",
               "since": 0},
    EccSample: {"ts": 1705314225000, "cluster": "c", "node": "n", "gpu": 0, "pci_bus_id": "0000:07:00",
                "counters": {"sbe_volatile": 3, "dbe_volatile": 0}},
    JobEvent: {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "job_id": "17", "state": "FAILED",
               "nodes": ["n1", "n2"], "gpus": 16, "start": "2024-01-15T08:00:00Z", "end": 1705312800000,
               "exit_code": "1:0", "name": "x", "user": "u", "partition": "p"},
}  # fmt: skip


class _Str(str):
    """A str subclass: valid for the reference validator, not the exact type the fast path takes."""


MUTATIONS = [
    None, 0, 1, -1, 79, True, False, 1.0, 1.5, "", " ", "\t", "\u3000", "x", " x ", "79", "FAILED", "failed",
    "Failed", "node_fail", "NODE_FAIL ", "PCI:0000:3B:00", "nonsense", "2024-01-15T10:23:45.5+01:00",
    "2024-02-30T00:00:00Z", "yesterday", [], ["n1"], [""], ["n1", 3], ("n1",), {}, {"sbe_volatile": 1},
    {"bogus": 1}, {"sbe_volatile": -1}, {"sbe_volatile": True}, {"sbe_volatile": 1.0}, {3: 1}, 10**20,
    _Str("n1"), _Str(""),
]  # fmt: skip


def _outcome(parse, document):
    try:
        record = parse(document, "s")
    except InvalidRecord as exc:
        return "rejected", exc.reason
    return "accepted", type(record), _astuple(record)


@pytest.mark.parametrize("record_type", [XidEvent, EccSample, JobEvent], ids=lambda t: t.__name__)
def test_fast_path_and_reference_agree_on_mutated_documents(record_type):
    rng = random.Random(20240115)
    base = BASES[record_type]
    keys = [*base, "kind"]
    outcomes = set()
    for _ in range(3000):
        document = copy.deepcopy(base)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            key = rng.choice(keys)
            if rng.random() < 0.15:
                document.pop(key, None)
            else:
                document[key] = copy.deepcopy(rng.choice(MUTATIONS))
        fast = _outcome(record_type.from_dict, document)
        assert fast == _outcome(record_type._from_dict_checked, document), document
        outcomes.add(fast[0])
    assert outcomes == {"accepted", "rejected"}


def test_samples_a_typed_decoder_read_are_finished_as_from_dict_makes_them():
    """finish_decoded_ecc_samples does what the sample's types cannot say: for each line a typed
    decoder reads into a sample, the sample from_dict makes of it (sources numbered from the first
    line), or None exactly where from_dict refuses the line."""
    decoder = msgspec.json.Decoder(EccSample)
    rng = random.Random(20261206)
    choices = {
        "ts": [1705314225000, "2024-01-15T10:23:45.5+01:00", 946_684_799_999, 946_684_800_000,
               4_102_444_800_000, 4_102_444_799_999],
        "cluster": ["c", "", " ", "\t"],
        "node": ["n1", "", " "],
        "gpu": [None, 0, 7, 65535, 65536, -1],
        "pci_bus_id": [None, "", "00000000:07:00.0", "PCI:0000:3B:00", "nonsense"],
    }  # fmt: skip
    outcomes = set()
    for message in range(300):
        documents = []
        for n in range(rng.randrange(1, 9)):
            document = {k: value for k, v in choices.items() if (value := rng.choice(v)) is not None}
            document["counters"] = {"sbe_volatile": n}
            try:
                decoder.decode(orjson.dumps(document))
            except msgspec.ValidationError:
                outcomes.add("not read")  # the types refuse it: the line-by-line path's
                continue
            documents.append(document)
        if not documents:
            continue
        first = rng.randrange(1, 5)
        decoded = decoder.decode_lines(b"\n".join(orjson.dumps(d) for d in documents))
        samples, refused = finish_decoded_ecc_samples(decoded, f"ecc/0:offset {message} line ", first)
        expected = []
        for number, document in enumerate(documents, first):
            try:
                expected.append(EccSample.from_dict(document, f"ecc/0:offset {message} line {number}"))
            except InvalidRecord:
                expected.append(None)
        assert samples == expected, documents
        assert refused == expected.count(None)
        outcomes.update("refused" if sample is None else "accepted" for sample in samples)
        assert all(type(sample) is EccSample for sample in samples if sample is not None)
    assert outcomes == {"accepted", "refused", "not read"}
