"""Kernel-log values as shippers send them: each shape reads as the same line of a file would."""

from __future__ import annotations

import orjson
import pytest

from schemas.records import InvalidRecord, XidEvent
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.options import ParseOptions
from stream.inputs.parsers.shipped import names_the_driver, parse_shipped_kernel_line

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, name=python, GPU has fallen off the bus."
#: 2025-03-04T17:22:31.512345Z
US = 1741108951512345
MS = US // 1000
RECORD_MS = MS + 400  # the shipper's record, a moment later


def read(value: bytes, record_ms: int | None = RECORD_MS) -> list[XidEvent | InvalidRecord]:
    return parse_shipped_kernel_line(value, record_ms, "c1", "kl/0", "offset 9")


def the_event(value: bytes, record_ms: int | None = RECORD_MS) -> XidEvent:
    [event] = read(value, record_ms)
    assert isinstance(event, XidEvent), event
    return event


def the_reason(value: bytes) -> str:
    [letter] = read(value)
    assert isinstance(letter, InvalidRecord), letter
    assert (letter.source, letter.location) == ("kl/0", "offset 9")
    return letter.reason


@pytest.mark.parametrize(
    ("value", "ts_ms"),
    [
        # rsyslog's RSYSLOG_FileFormat (omkafka's default), with the uptime prefix and the newline
        (f"2025-03-04T17:22:31.512345+00:00 gpu-node-17 kernel: [1234567.890123] {XID}\n", MS),
        (f"2025-03-04T17:22:31.512345+00:00 gpu-node-17 kernel: {XID}", MS),
        # RSYSLOG_SyslogProtocol23Format (RFC 5424), as rsyslog 8.2302 writes it (two spaces)
        (f"<4>1 2025-03-04T17:22:31.512345+00:00 gpu-node-17 kernel - - -  {XID}\n", MS),
        # RSYSLOG_TraditionalFileFormat: no year, the record's gives it
        (f"Mar  4 17:22:31 gpu-node-17 kernel: [1234567.890123] {XID}\n", MS // 1000 * 1000),
    ],
    ids=["file-format", "file-format-bare", "rfc5424", "traditional"],
)
def test_rsyslog_lines_read_as_the_file_line(value: str, ts_ms: int) -> None:
    event = the_event(value.encode())
    assert (event.node, event.xid, event.pci_bus_id, event.ts_ms, event.cluster) == (
        "gpu-node-17",
        79,
        "0000:3b:00",
        ts_ms,
        "c1",
    )
    assert event.message == "GPU has fallen off the bus."
    assert event.source == "kl/0:offset 9"
    [from_file] = parse_kernel_log([value.encode()], ParseOptions(cluster="c1", year=2025), "f")
    assert isinstance(from_file, XidEvent)
    assert (from_file.node, from_file.ts_ms, from_file.xid, from_file.message) == (
        event.node,
        event.ts_ms,
        event.xid,
        event.message,
    )


def test_a_year_less_line_of_december_shipped_in_january_is_last_year_s() -> None:
    new_year = 1735689600000 + 5_000  # 2025-01-01T00:00:05Z
    event = the_event(f"Dec 31 23:59:58 n1 kernel: {XID}".encode(), record_ms=new_year)
    assert event.ts_ms == new_year - 7_000


def test_a_year_less_line_without_a_record_time_is_a_dead_letter() -> None:
    [letter] = read(f"Mar  4 17:22:31 n1 kernel: {XID}".encode(), record_ms=None)
    assert isinstance(letter, InvalidRecord)
    assert "without a year" in letter.reason


@pytest.mark.parametrize(
    "document",
    [
        # journalctl -o json
        {"__REALTIME_TIMESTAMP": str(US), "_TRANSPORT": "kernel", "_HOSTNAME": "gpu-node-17", "MESSAGE": XID},
        {"_SOURCE_REALTIME_TIMESTAMP": str(US), "__REALTIME_TIMESTAMP": str(US + 900_000),
         "_HOSTNAME": "gpu-node-17", "MESSAGE": XID},
        # Vector journald -> kafka, codec json
        {"host": "gpu-node-17", "message": XID, "source_type": "journald", "timestamp": "2025-03-04T17:22:31.512345678Z"},
        # Fluent Bit systemd -> kafka: float epoch seconds; strip_underscores; lowercase; iso8601
        {"@timestamp": US / 1e6, "_HOSTNAME": "gpu-node-17", "MESSAGE": XID},
        {"@timestamp": US / 1e6, "HOSTNAME": "gpu-node-17", "MESSAGE": XID},
        {"@timestamp": US / 1e6, "hostname": "gpu-node-17", "message": XID},
        {"@timestamp": "2025-03-04T17:22:31.512345Z", "_HOSTNAME": "gpu-node-17", "MESSAGE": XID},
        # rsyslog's JSON template
        {"@timestamp": "2025-03-04T17:22:31.512345+00:00", "host": "gpu-node-17", "syslog-tag": "kernel:",
         "message": f" [1234567.890123] {XID}"},
    ],
    ids=["journald", "journald-source-time", "vector", "fluent-bit", "fluent-bit-strip", "fluent-bit-lower",
         "fluent-bit-iso", "rsyslog-json"],
)  # fmt: skip
def test_json_envelopes_read_their_message_host_and_time(document: dict[str, object]) -> None:
    event = the_event(orjson.dumps(document))
    assert (event.node, event.xid, event.pci_bus_id, event.ts_ms) == ("gpu-node-17", 79, "0000:3b:00", MS)
    assert event.message == "GPU has fallen off the bus."


def test_journald_bytes_that_are_not_utf8_are_read_as_the_file_would() -> None:
    raw = b"NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=py\xfft, Graphics Exception"
    value = orjson.dumps({"MESSAGE": list(raw), "_HOSTNAME": "n1", "__REALTIME_TIMESTAMP": str(US)})
    assert b"NVRM" not in value  # found all the same
    event = the_event(value)
    assert (event.xid, event.process) == (13, "py\ufffdt")


def test_a_message_of_several_lines_is_joined() -> None:
    value = orjson.dumps(
        {"MESSAGE": f"{XID}\nsecond part", "_HOSTNAME": "n1", "__REALTIME_TIMESTAMP": str(US)}
    )
    assert the_event(value).message == "GPU has fallen off the bus. second part"


def test_an_sxid_reads_as_an_nvswitch_event() -> None:
    line = b"2025-03-04T17:22:31Z n1 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33"
    event = the_event(line)
    assert (event.device, event.xid, event.pci_bus_id) == ("nvswitch", 12028, "0000:05:00")


@pytest.mark.parametrize(
    "value",
    [
        b"2025-03-04T17:22:31Z n1 kernel: eth0: link up\n",
        b"2025-03-04T17:22:31Z n1 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module 550.54.15\n",
        orjson.dumps({"MESSAGE": "EXT4-fs (md0): mounted", "_HOSTNAME": "n1"}),  # no time: not ours anyway
        orjson.dumps({"MESSAGE": [65, 66, 255], "_HOSTNAME": "n1"}),
        b"",
    ],
)
def test_other_lines_give_nothing(value: bytes) -> None:
    assert read(value) == []


def test_most_lines_are_passed_over_without_being_decoded() -> None:
    assert not names_the_driver(b"2025-03-04T17:22:31Z n1 kernel: mlx5_core 0000:8d:00.0: Port module event")
    assert names_the_driver(b"... SXid (PCI:0000:05:00.0): 12028")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{NVRM", "not JSON"),
        (orjson.dumps({"_HOSTNAME": "n1", "__REALTIME_TIMESTAMP": str(US), "note": XID}), "no message"),
        (orjson.dumps({"MESSAGE": XID, "__REALTIME_TIMESTAMP": str(US)}), "no host"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": "n1"}), "no time"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": "two words", "__REALTIME_TIMESTAMP": str(US)}), "not a host name"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": "n1", "__REALTIME_TIMESTAMP": "soon"}), "not epoch microseconds"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": "n1", "@timestamp": "yesterday"}), "not a time"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": "n1", "@timestamp": True}), "no time"),
        (orjson.dumps({"MESSAGE": 7, "_HOSTNAME": "n1", "@timestamp": 1.0, "x": XID}), "is int, not text"),
        (orjson.dumps({"MESSAGE": XID, "_HOSTNAME": {"n": 1}, "@timestamp": 1.0}), "is dict, not text"),
        (b"2025-03-04T17:22:31Z n1 kernel: NVRM: Xid (PCI:0000:3b:00): banana", "malformed"),
        (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, y", "no time stamp"),
    ],
)  # fmt: skip
def test_a_driver_value_that_cannot_be_read_is_a_dead_letter_with_its_reason(
    value: bytes, reason: str
) -> None:
    assert reason in the_reason(value)


def test_binary_garbage_and_a_huge_line_are_handled() -> None:
    assert read(bytes(range(256)) * 4) == []
    huge = b"2025-03-04T17:22:31Z n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, " + b"x" * 1_000_000
    [event] = read(huge)
    assert isinstance(event, XidEvent)
    assert len(event.message) >= 1_000_000
