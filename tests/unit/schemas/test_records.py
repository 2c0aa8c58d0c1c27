"""The hand-written validators agree with the published JSON Schemas."""

import json
from pathlib import Path

import jsonschema
import pytest

from schemas.records import EccSample, InvalidRecord, JobEvent, JobState, XidEvent, normalize_pci_bus_id

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "jsonschema"

CASES = [
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "n1", "xid": 79}, True),
    (XidEvent, "xid_event", {"ts": 1705314225000, "cluster": "c", "node": "n1", "xid": 79,
                             "pci_bus_id": "00000000:3B:00.0", "gpu": 3, "pid": 12, "process": "python"}, True),
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "n1"}, False),
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "n1", "xid": "79"}, False),
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "", "xid": 79}, False),
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "n", "xid": 0}, False),
    (XidEvent, "xid_event", {"ts": "2024-01-15T10:23:45Z", "cluster": "c", "node": "n", "xid": 79,
                             "pci_bus_id": "nonsense"}, False),
    (XidEvent, "xid_event", {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 12028, "device": "nvswitch",
                             "pci_bus_id": "0000:05:00.0"}, True),
    (XidEvent, "xid_event", {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "device": "gpu"}, True),
    (XidEvent, "xid_event", {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "device": "switch"}, False),
    (XidEvent, "xid_event", {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "device": ""}, False),
    (XidEvent, "xid_event", {"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79, "device": 1}, False),
    (EccSample, "ecc_sample", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"sbe_volatile": 3, "dbe_volatile": 0}}, True),
    (EccSample, "ecc_sample", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n",
                               "pci_bus_id": "0000:07:00", "counters": {}}, True),
    (EccSample, "ecc_sample", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n",
                               "counters": {"sbe_volatile": 3}}, False),
    (EccSample, "ecc_sample", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"sbe_volatile": -1}}, False),
    (EccSample, "ecc_sample", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"bogus": 1}}, False),
    (EccSample, "ecc_sample", {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"remap_failure": 9223372036854775794}}, False),  # DCGM_INT64_NOT_SUPPORTED
    (EccSample, "ecc_sample", {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"remap_failure": 140737488355328}}, False),  # DCGM_FP64_BLANK
    (EccSample, "ecc_sample", {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"dbe_volatile": 2147483634}}, False),  # DCGM_INT32_NOT_SUPPORTED
    (EccSample, "ecc_sample", {"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0,
                               "counters": {"dbe_volatile": 2147483631, "sbe_volatile": 140737488355327}}, True),
    (JobEvent, "job_event", {"ts": "2024-01-15T10:00:00Z", "cluster": "c", "job_id": "17", "state": "FAILED",
                             "nodes": ["n1", "n2"], "gpus": 16, "start": "2024-01-15T08:00:00Z",
                             "end": "2024-01-15T10:00:00Z", "exit_code": "1:0"}, True),
    (JobEvent, "job_event", {"ts": 1704067200000, "cluster": "c", "job_id": 17, "state": "running"}, True),
    (JobEvent, "job_event", {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "EXPLODED"}, False),
    (JobEvent, "job_event", {"ts": 1704067200000, "cluster": "c", "job_id": "17", "state": "FAILED", "nodes": "n1"}, False),
    (JobEvent, "job_event", {"ts": "yesterday", "cluster": "c", "job_id": "17", "state": "FAILED"}, False),
]  # fmt: skip


@pytest.mark.parametrize(("record_type", "schema_name", "document", "valid"), CASES)
def test_validator_agrees_with_json_schema(record_type, schema_name, document, valid):
    schema = json.loads((SCHEMAS / f"{schema_name}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    schema_says = validator.is_valid(document)
    try:
        record_type.from_dict(document)
        ours = True
    except InvalidRecord:
        ours = False
    assert (schema_says, ours) == (valid, valid)


@pytest.mark.parametrize(
    "record",
    [
        XidEvent(ts_ms=1705314225123, cluster="c", node="n1", xid=48, pci_bus_id="0000:3b:00", gpu=2, pid=7,
                 process="python", message="DBE"),
        EccSample(ts_ms=1705314225000, cluster="c", node="n1", gpu=1, pci_bus_id="0000:07:00",
                  counters={"sbe_volatile": 5, "remap_failure": 1}),
        JobEvent(ts_ms=1705314225000, cluster="c", job_id="9_1", state=JobState.NODE_FAIL, nodes=("a", "b"),
                 gpus=16, start_ms=1705310000000, end_ms=1705314225000, exit_code="0:9"),
    ],
)  # fmt: skip
def test_round_trip_through_json(record):
    assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_invalid_record_names_the_field():
    with pytest.raises(InvalidRecord, match="field 'xid' must be an integer"):
        XidEvent.from_dict({"ts": 1704067200000, "cluster": "c", "node": "n", "xid": "79"})


def test_pci_bus_ids_of_kernel_and_dcgm_agree():
    assert normalize_pci_bus_id("PCI:0000:3B:00") == normalize_pci_bus_id("00000000:3b:00.0") == "0000:3b:00"


def test_an_sxid_event_keeps_its_device_and_gpu_events_keep_their_ids_and_bytes():
    gpu = XidEvent(ts_ms=1704067200000, cluster="c", node="n", xid=79)
    switch = XidEvent(ts_ms=1704067200000, cluster="c", node="n", xid=79, device="nvswitch")
    assert "device" not in gpu.to_wire() and switch.to_wire()["device"] == "nvswitch"
    assert gpu.event_id == "41795c10359aa495"  # the id it had before devices existed (same key, sha1)
    assert switch.event_id != gpu.event_id
    assert XidEvent.from_dict(switch.to_dict()) == switch
    assert XidEvent.from_dict({"ts": 1704067200000, "cluster": "c", "node": "n", "xid": 79}).device == "gpu"


def test_a_pickle_of_the_layout_before_device_loads_as_a_gpu_event():
    """Worker checkpoints pickle records; those written before ``device`` existed still load."""
    import pickle

    event = XidEvent(ts_ms=5, cluster="c", node="n", xid=48, pci_bus_id="0000:3b:00", message="DBE")
    old_state = event.__getstate__()[:10]  # the ten fields of the previous version
    restored = object.__new__(XidEvent)
    restored.__setstate__(old_state)
    assert restored == event and restored.device == "gpu"
    switch = XidEvent(ts_ms=5, cluster="c", node="n", xid=12028, device="nvswitch")
    assert pickle.loads(pickle.dumps(switch)) == switch


def test_a_pickle_of_the_layout_before_since_loads_as_a_logged_event():
    """Checkpoints written before ``since_ms`` existed (eleven fields) load as driver-logged XIDs."""
    import pickle

    switch = XidEvent(ts_ms=5, cluster="c", node="n", xid=12028, device="nvswitch")
    restored = object.__new__(XidEvent)
    restored.__setstate__(switch.__getstate__()[:11])
    assert restored == switch and restored.since_ms is None
    gauged = XidEvent(ts_ms=5, cluster="c", node="n", xid=79, gpu=0, since_ms=0)
    assert pickle.loads(pickle.dumps(gauged)) == gauged


class _OldJobEventPickle:
    """Pickles as a :class:`JobEvent` of the twelve-field layout from before ``partition``."""

    def __init__(self, state: tuple[object, ...]) -> None:
        self.state = state

    def __reduce__(self) -> tuple[object, ...]:
        return object.__new__, (JobEvent,), self.state


def test_a_pickle_of_the_layout_before_partition_loads_with_no_partition():
    """Worker checkpoints pickle job events; those written before ``partition`` existed still load."""
    import pickle

    event = JobEvent(
        ts_ms=5, cluster="c", job_id="7", state=JobState.FAILED, nodes=("n1",), user="u", source="s"
    )
    old_state = event.__getstate__()
    assert len(old_state) == 13 and old_state[-1] == ""  # partition is the last field
    restored = pickle.loads(pickle.dumps(_OldJobEventPickle(old_state[:12])))
    assert type(restored) is JobEvent and restored == event and restored.partition == ""
    train = JobEvent(ts_ms=1704067200000, cluster="c", job_id="7", state=JobState.FAILED, partition="train")
    assert pickle.loads(pickle.dumps(train)) == train
    assert train.to_wire()["partition"] == "train" and "partition" not in event.to_wire()
    assert JobEvent.from_dict(train.to_dict()) == train
