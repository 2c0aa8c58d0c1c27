"""Kernel log parser: every line shape, XID payload variants, dead letters, node names."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from schemas.records import InvalidRecord, XidEvent
from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format, ParseOptions, parse_file, parse_lines
from stream.inputs.parsers.kernel_log import parse_kernel_log

DATA = Path(__file__).resolve().parents[4] / "data" / "kernel"
BOOT_MS = parse_ts("2024-01-15T09:00:00Z")


def split(items: Iterable[object]) -> tuple[list[XidEvent], list[InvalidRecord]]:
    events: list[XidEvent] = []
    dead: list[InvalidRecord] = []
    for item in items:
        if isinstance(item, InvalidRecord):
            dead.append(item)
        else:
            assert isinstance(item, XidEvent)
            events.append(item)
    return events, dead


def file_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def one(line: bytes, options: ParseOptions | None = None, source: str = "node042.log") -> XidEvent:
    events, dead = split(parse_kernel_log([line], options or ParseOptions(year=2024), source))
    assert dead == [], [record.reason for record in dead]
    assert len(events) == 1
    return events[0]


def one_dead(line: bytes, options: ParseOptions | None = None, source: str = "node042.log") -> InvalidRecord:
    events, dead = split(parse_kernel_log([line], options or ParseOptions(year=2024), source))
    assert events == []
    assert len(dead) == 1
    return dead[0]


# --- the sample files -------------------------------------------------------------------------


def test_plain_dmesg_sample() -> None:
    path = DATA / "node017.dmesg"
    events, dead = split(parse_file(path, ParseOptions(boot_time_ms=BOOT_MS, cluster="c1")))
    got = [(e.ts_ms - BOOT_MS, e.xid, e.pci_bus_id, e.pid, e.process, e.source) for e in events]
    assert got == [
        (3_456_789, 79, "0000:3b:00", 1101234, "python", f"{path}:9"),
        (4_001_000, 48, "0000:86:00", None, "", f"{path}:14"),
        (4_001_000, 63, "0000:86:00", None, "", f"{path}:15"),
        (4_002_100, 94, "0000:86:00", 2201, "pt_main_thread", f"{path}:16"),
        (5_000_500, 13, "0000:af:00", None, "", f"{path}:17"),
        (5_200_250, 31, "0000:3b:00", 4455, "python3", f"{path}:19"),
        (5_300_000, 119, "0000:3b:00", 3094906, "python3\ufffd\ufffd", f"{path}:20"),
        (5_600_000, 79, "0000:3b:00", None, "", f"{path}:24"),
    ]
    assert {(e.node, e.cluster, e.gpu) for e in events} == {("node017", "c1", None)}
    assert events[0].message == "GPU has fallen off the bus."
    assert events[1].message == (
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer"
        " at partition 6, subpartition 0."
    )
    assert (
        events[4].message == "Graphics Exception: ChID 0010, Class 0000c6c0, Offset 00000000, Data 00000000"
    )
    assert events[5].message.startswith("Ch 00000008, intr 00000000. MMU Fault:")
    assert events[7].message == ""

    lines = file_lines(path)
    assert [(d.location, d.raw, d.source) for d in dead] == [
        ("line 18", lines[17], str(path)),
        ("line 21", lines[20], str(path)),
        ("line 23", lines[22], str(path)),
    ]
    assert dead[0].raw == b"[ 5100.000001] NVRM: Xid (PCI:0000:3b"
    assert "truncated or malformed" in dead[0].reason
    assert "invalid UTF-8" in dead[1].reason
    assert dead[2].reason == "XID code must be 1 to 65535, got 0"


def test_plain_dmesg_without_boot_time_is_one_dead_letter_for_the_file() -> None:
    """The cause is the file (no --boot-time), so it is said once, not once per line."""
    events, dead = split(parse_file(DATA / "node017.dmesg", ParseOptions()))
    assert events == []
    assert len(dead) == 4  # three bad lines, and the file's cause
    boot = [d for d in dead if "--boot-time" in d.reason]
    assert [d.location for d in boot] == ["lines 9-24 (9 lines)"]  # 8 Xid lines and a fallen-off one
    assert "9 driver lines of this file, reported once" in boot[0].reason
    assert boot[0].raw.startswith(b"[ 3456.789020] NVRM: Xid (PCI:0000:3b:00): 79")


def test_dmesg_T_sample_reads_local_time() -> None:
    path = DATA / "node018.dmesg-T.log"
    events, dead = split(parse_file(path, ParseOptions(timezone="Europe/Paris")))
    assert [(e.ts_ms, e.xid, e.pci_bus_id, e.pid, e.node) for e in events] == [
        (parse_ts("2024-01-15T09:23:45Z"), 79, "0000:3b:00", 1101234, "node018"),
        (parse_ts("2024-01-05T07:00:00Z"), 13, "0000:07:00", None, "node018"),
        (parse_ts("2024-07-14T10:00:00Z"), 92, "0000:07:00", 77, "node018"),  # CEST
    ]
    assert events[2].message == "High single-bit ECC error rate detected"
    assert [d.location for d in dead] == ["line 6"]
    assert "day is out of range" in dead[0].reason

    utc_events, _ = split(parse_file(path, ParseOptions()))
    assert utc_events[0].ts_ms == parse_ts("2024-01-15T10:23:45Z")


def test_syslog_sample_with_crlf_pri_uptime_and_new_year() -> None:
    path = DATA / "syslog-cluster-a.log"
    events, dead = split(parse_file(path, ParseOptions(year=2023)))
    assert [(e.ts_ms, e.node, e.xid, e.pci_bus_id, e.pid, e.process, e.source) for e in events] == [
        (parse_ts("2023-12-31T23:59:58Z"), "node001", 79, "0000:3b:00", 1101234, "python", f"{path}:2"),
        (parse_ts("2023-12-31T23:59:59Z"), "node002", 13, "0000:07:00", 2002, "python", f"{path}:3"),
        (parse_ts("2024-01-01T00:00:03Z"), "node002", 43, "0000:07:00", 2002, "python", f"{path}:4"),
        (parse_ts("2024-01-01T00:01:10Z"), "node003", 74, "0000:ca:00", None, "", f"{path}:5"),
        (parse_ts("2024-01-01T00:05:00.250Z"), "node004", 45, "0000:ca:00", 9, "python", f"{path}:9"),
    ]
    assert events[1].message == (
        "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"
    )  # no trailing \r
    assert (
        events[3].message == "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
    )
    assert [d.location for d in dead] == ["line 7", "line 8"]
    assert dead[0].raw == b"Jan  1 00:03:00 node004 kernel: NVRM: Xid (PCI:0000:ca:00): "
    assert b"\xff" in dead[1].raw
    assert not dead[1].raw.endswith(b"\r")
    assert "invalid UTF-8" in dead[1].reason


def test_syslog_without_year_asks_for_it() -> None:
    events, dead = split(parse_file(DATA / "syslog-cluster-a.log", ParseOptions()))
    assert events == []
    year = [d for d in dead if "pass --year" in d.reason]
    assert len(year) == 1 and year[0].location == "lines 2-9 (5 lines)"  # once for the file


def test_journalctl_short_iso_sample() -> None:
    path = DATA / "journal-short-iso.log"
    events, dead = split(parse_file(path, ParseOptions()))
    assert [(e.ts_ms, e.node, e.xid, e.pci_bus_id, e.pid) for e in events] == [
        (parse_ts("2024-01-15T10:23:45Z"), "node005", 79, "0000:3b:00", 1101234),
        (parse_ts("2024-01-15T10:23:45.123Z"), "node005", 45, "0000:3b:00", 1101234),
        (parse_ts("2024-01-15T10:30:00.500Z"), "node006", 92, "0000:07:00", None),
    ]
    assert events[2].message == "High single-bit ECC error rate detected"
    assert [(d.location, d.reason) for d in dead] == [
        (
            "line 6",
            "truncated or malformed 'NVRM: Xid' line (expected 'NVRM: Xid (PCI:dddd:bb:dd): CODE, ...')",
        ),
        ("line 7", "bad time stamp '2024-13-15T10:32:00+0000'"),
    ]


def test_rfc5424_sample() -> None:
    path = DATA / "node008.rfc5424.log"
    events, dead = split(parse_file(path, ParseOptions()))
    assert [(e.ts_ms, e.node, e.xid, e.pid, e.process) for e in events] == [
        (parse_ts("2024-01-15T10:23:45.123Z"), "node007", 79, 1101234, "python"),
        (parse_ts("2024-01-15T10:24:00Z"), "node007", 48, None, ""),
        (parse_ts("2024-01-15T10:25:00Z"), "node008", 64, 1, "python"),  # host '-': file stem
    ]
    assert events[2].message == "ECC page retirement or row remapper recording failure."
    assert [(d.location, d.reason) for d in dead] == [
        ("line 4", "RFC 5424 record has no time stamp (NILVALUE '-')")
    ]


def test_gzip_file_mixing_line_shapes() -> None:
    path = DATA / "node019.mixed.log.gz"
    events, dead = split(parse_file(path, ParseOptions(year=2024, boot_time_ms=BOOT_MS)))
    assert dead == []
    assert [(e.ts_ms, e.node, e.xid) for e in events] == [
        (BOOT_MS + 100_000, "node019", 79),
        (parse_ts("2024-01-15T10:23:45Z"), "node019", 48),
        (parse_ts("2024-01-15T10:23:46Z"), "node019", 63),
        (parse_ts("2024-01-15T10:23:47Z"), "node019", 94),
    ]
    assert events[3].source == f"{path}:4"


# --- line shapes and payloads -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "ts", "node"),
    [
        (
            b"[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            BOOT_MS + 1_234_568,
            "n9",
        ),
        (
            b"<4>[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            BOOT_MS + 1_234_500,
            "n9",
        ),
        (
            b"[ 1234.567890] node003 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            BOOT_MS + 1_234_568,
            "node003",
        ),
        (
            b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45Z"),
            "n9",
        ),
        (
            b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45Z"),
            "node001",
        ),
        (
            b"<4>Jan 15 10:23:45 node001 kernel: [12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45Z"),
            "node001",
        ),
        (
            b"Jan 15 10:23:45.999600 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:46Z"),
            "node001",
        ),
        (
            b"2024-01-15T10:23:45+0000 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45Z"),
            "node001",
        ),
        (
            b"2024-01-15T10:23:45.123456+00:00 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45.123Z"),
            "node001",
        ),
        (
            b"2024-01-15T12:23:45,5+02:00 NVRM: Xid (PCI:0000:3b:00): 79, x",  # dmesg --time-format iso
            parse_ts("2024-01-15T10:23:45.500Z"),
            "n9",
        ),
        (
            b"<4>1 2024-01-15T10:23:45.123Z node001 kernel - - - NVRM: Xid (PCI:0000:3b:00): 79, x",
            parse_ts("2024-01-15T10:23:45.123Z"),
            "node001",
        ),
        (
            b'<4>1 2024-01-15T10:23:45Z node001 kernel - - [a@1 x="]" y="\\"q\\""] NVRM: Xid (PCI:0000:3b:00): 79, x',
            parse_ts("2024-01-15T10:23:45Z"),
            "node001",
        ),
    ],
)
def test_line_shapes(line: bytes, ts: int, node: str) -> None:
    options = ParseOptions(year=2024, boot_time_ms=BOOT_MS)
    for variant in (line, line + b"\n", line + b"\r\n"):
        event = one(variant, options, source="/logs/n9.kern.log")
        assert (event.ts_ms, event.node, event.xid, event.pci_bus_id) == (ts, node, 79, "0000:3b:00")
        assert event.message in ("x", "GPU has fallen off the bus.")


@pytest.mark.parametrize(
    ("payload", "pci", "xid", "pid", "process", "message"),
    [
        (
            b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1101234, name=python, GPU has fallen off the bus.",
            "0000:3b:00",
            79,
            1101234,
            "python",
            "GPU has fallen off the bus.",
        ),
        (
            b"NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR 0x50a648=0x10 0x50a650=0x0",
            "0000:3b:00",
            13,
            None,
            "",
            "Graphics Exception: ESR 0x50a648=0x10 0x50a650=0x0",
        ),
        (
            b"NVRM: Xid (PCI:0000:b7:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ChID 0010",
            "0000:b7:00",
            13,
            None,
            "",
            "Graphics Exception: ChID 0010",
        ),
        (
            b"NVRM: Xid (PCI:0000:0e:00): 48, pid=<unknown>, name=<unknown>, An uncorrectable DBE",
            "0000:0e:00",
            48,
            None,
            "",
            "An uncorrectable DBE",
        ),
        (b"NVRM: Xid  (PCI:0000:3B:00):  48,   pid=12 ,  name=a b ,  msg  ", "0000:3b:00", 48, 12, "a b", "msg"),
        (b"NVRM: Xid (PCI:00000000:3B:00.0): 79, x", "0000:3b:00", 79, None, "", "x"),
        (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python", "0000:3b:00", 79, 7, "python", ""),
        (b"NVRM: Xid (PCI:0000:3b:00): 119, pid=3094906, name=python3, Timeout after 6s of waiting for RPC "
         b"response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
         "0000:3b:00", 119, 3094906, "python3",
         "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL)"
         " (0x20800a4c 0x4)."),
    ],
)  # fmt: skip
def test_payload_variants(
    payload: bytes, pci: str, xid: int, pid: int | None, process: str, message: str
) -> None:
    event = one(b"Jan 15 10:23:45 node001 kernel: " + payload)
    assert (event.pci_bus_id, event.xid, event.pid, event.process, event.message) == (
        pci,
        xid,
        pid,
        process,
        message,
    )
    assert event.gpu is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b", "truncated or malformed"),
        (b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00)", "truncated or malformed"),
        (b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): x79, y", "truncated or malformed"),
        (b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:zz:3b:00): 79, y", "truncated or malformed"),
        (b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "has no time stamp"),
        (b"some agent said NVRM: Xid (PCI:0000:3b:00): 79, y", "unrecognised time stamp"),
        (b"Jan 15 10:23:45 kernel: NVRM: Xid (PCI:0000:3b:00): 79, y", "unrecognised time stamp"),
        (b"Foo 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, y", "bad month 'Foo'"),
        (b"[Mon Jan 15 25:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, y", "bad dmesg -T time stamp"),
        (b"<4>1 2024-01-15T10:23:45 node001 kernel - - NVRM: Xid (PCI:0000:3b:00): 79, y", "unrecognised"),
        (b"Jan 15 10:23:45 node\xc3\x28 kernel: NVRM: Xid (PCI:0000:3b:00): 79, y", "invalid UTF-8"),
    ],
)
def test_dead_letters(line: bytes, reason: str) -> None:
    dead = one_dead(line + b"\r\n", source="/var/log/kern.log")
    assert reason in dead.reason
    assert dead.raw == line
    assert dead.source == "/var/log/kern.log"
    assert dead.location == "line 1"


def test_irrelevant_lines_are_skipped_silently() -> None:
    junk = [
        b"",
        b"\r\n",
        b"[    0.000000] Linux version 5.15.0-91-generic",
        b"Jan 15 10:23:45 node001 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-5a3b1c2d",
        b"Jan 15 10:23:45 node001 kernel: NVRM: Xi",
        b"Jan 15 10:23:45 node001 kernel: nvrm: xid (PCI:0000:3b:00): 79, lower case is not the driver",
        b"\xff\xfe\x00garbage",
        b"x" * 10_000,
    ]
    assert list(parse_kernel_log(junk, ParseOptions(), "node001.log")) == []


def test_node_comes_from_line_then_option_then_file_stem() -> None:
    with_host = b"Jan 15 10:23:45 node001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x"
    without = b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, x"
    assert one(with_host, ParseOptions(year=2024, node="other")).node == "node001"
    assert one(without, ParseOptions(node="other")).node == "other"
    assert one(without, ParseOptions(), source="/var/log/gpu-17.dmesg.log.gz").node == "gpu-17"
    dead = one_dead(without, ParseOptions(), source="")
    assert "pass --node" in dead.reason


def test_year_rolls_over_only_on_a_big_backwards_jump() -> None:
    lines = [
        b"Nov 30 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
        b"Dec 31 23:59:59 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
        b"Dec 31 23:59:58 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",  # slightly out of order
        b"Jan  1 00:00:01 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
        b"Feb  2 00:00:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
    ]
    events, dead = split(parse_kernel_log(lines, ParseOptions(year=2023), "syslog"))
    assert dead == []
    assert [e.ts_ms for e in events] == [
        parse_ts("2023-11-30T10:00:00Z"),
        parse_ts("2023-12-31T23:59:59Z"),
        parse_ts("2023-12-31T23:59:58Z"),
        parse_ts("2024-01-01T00:00:01Z"),
        parse_ts("2024-02-02T00:00:00Z"),
    ]


def test_good_lines_around_bad_ones_are_kept_with_their_line_numbers() -> None:
    lines = [
        b"Jan 15 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, a",
        b"Jan 15 10:00:01 n1 kernel: NVRM: Xid (PCI:0000:3b",
        b"Jan 15 10:00:02 n1 kernel: unrelated",
        b"Jan 15 10:00:03 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, b",
    ]
    items = list(parse_lines(lines, Format.KERNEL, ParseOptions(year=2024, cluster="c7"), "f.log"))
    assert [type(item).__name__ for item in items] == ["XidEvent", "InvalidRecord", "XidEvent"]
    first, bad, last = items
    assert isinstance(first, XidEvent) and isinstance(last, XidEvent) and isinstance(bad, InvalidRecord)
    assert (first.source, last.source, bad.location) == ("f.log:1", "f.log:4", "line 2")
    assert (first.cluster, last.cluster) == ("c7", "c7")
    assert first.to_dict() == {
        "ts": "2024-01-15T10:00:00.000Z",
        "cluster": "c7",
        "node": "n1",
        "xid": 79,
        "pci_bus_id": "0000:3b:00",
        "message": "a",
    }


# --- issue 13: what real clusters print ---------------------------------------------------------

ISSUE_SHAPES = [
    # dmesg -x --time-format iso, decimal comma (the issue's line)
    (b"kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python, "
     b"GPU has fallen off the bus.", ParseOptions(), "2025-01-21T04:41:44.283Z", "node042", 79, "0000:3b:00"),
    (b"kern  :err   : [ 3600.000000] NVRM: Xid (PCI:0000:3b:00): 48, DBE", ParseOptions(boot_time_ms=BOOT_MS),
     "2024-01-15T10:00:00Z", "node042", 48, "0000:3b:00"),
    (b"kern  :warn  : [Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 13, x", ParseOptions(),
     "2024-01-15T10:23:45Z", "node042", 13, "0000:3b:00"),
    # dmesg -d: uptime and delta
    (b"[ 3600.000000 <    0.000123>] NVRM: Xid (PCI:0000:3b:00): 31, x", ParseOptions(boot_time_ms=BOOT_MS),
     "2024-01-15T10:00:00Z", "node042", 31, "0000:3b:00"),
    # dmesg -T and journalctl short in other LC_TIME languages (glibc abbreviations)
    (b"[Di Jan 21 04:41:44 2025] NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(), "2025-01-21T04:41:44Z",
     "node042", 79, "0000:3b:00"),
    (b"[mar. janv. 21 04:41:44 2025] NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(), "2025-01-21T04:41:44Z",
     "node042", 79, "0000:3b:00"),
    (b"M\xc3\xa4r 03 04:41:44 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(year=2025),
     "2025-03-03T04:41:44Z", "gpu7", 79, "0000:3b:00"),
    (b"pa\xc5\xba 03 04:41:44 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(year=2025),
     "2025-10-03T04:41:44Z", "gpu7", 79, "0000:3b:00"),
    (b"d\xc3\xa9c 03 04:41:44 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(year=2025),
     "2025-12-03T04:41:44Z", "gpu7", 79, "0000:3b:00"),  # French without its dot
    (b"\xd0\xbc\xd0\xb0\xd1\x8f 03 04:41:44 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
     ParseOptions(year=2025), "2025-05-03T04:41:44Z", "gpu7", 79, "0000:3b:00"),  # Russian genitive
    (b" 5\xe6\x9c\x88 03 04:41:44 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(year=2025),
     "2025-05-03T04:41:44Z", "gpu7", 79, "0000:3b:00"),  # Japanese
    # journalctl -o short-full / short-unix
    (b"Tue 2025-01-21 04:41:44 UTC gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(),
     "2025-01-21T04:41:44Z", "gpu7", 79, "0000:3b:00"),
    (b"Tue 2025-01-21 05:41:44 CET gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
     ParseOptions(timezone="Europe/Berlin"), "2025-01-21T04:41:44Z", "gpu7", 79, "0000:3b:00"),
    (b"1737434504.283302 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(),
     "2025-01-21T04:41:44.283Z", "gpu7", 79, "0000:3b:00"),
    # pasted: fences, quotes, backticks, bold; old and redacted ids
    (b"```Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, "0000:3b:00"),
    (b"```text[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, x```", ParseOptions(),
     "2024-01-15T10:23:45Z", "node042", 79, "0000:3b:00"),
    (b"> > `Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x`", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, "0000:3b:00"),
    (b"**Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x**", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, "0000:3b:00"),
    (b"Jan 15 10:23:45 gpu7 kernel: **NVRM: Xid (PCI:0000:3b:00): 79**, x", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, "0000:3b:00"),
    (b"Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (0000:05): 13, old driver", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 13, "0000:05:00"),
    (b"Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:...): 79, redacted", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, ""),
    (b"Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:xxxx:xx:xx): 79, redacted", ParseOptions(year=2024),
     "2024-01-15T10:23:45Z", "gpu7", 79, ""),
]  # fmt: skip


@pytest.mark.parametrize(("line", "options", "ts", "node", "xid", "pci"), ISSUE_SHAPES)
def test_issue_13_shapes(line: bytes, options: ParseOptions, ts: str, node: str, xid: int, pci: str) -> None:
    event = one(line, options)
    assert (event.ts_ms, event.node, event.xid, event.pci_bus_id, event.device) == (
        parse_ts(ts),
        node,
        xid,
        pci,
        "gpu",
    )


def test_sxid_lines_are_nvswitch_events_and_their_detail_lines_fold_in() -> None:
    lines = [
        b"Jan 21 04:41:44 dgx1 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33 "
        b"egress non-posted PRIV error (First)",
        b"Jan 21 04:41:44 dgx1 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine "
        b"instance 33 Sub-engine instance 00",
        b"Jan 21 04:41:44 dgx1 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000}",
        b"Jan 21 04:41:45 dgx1 kernel: nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 20034, Fatal error, Link 44",
    ]
    events, dead = split(parse_kernel_log(lines, ParseOptions(year=2025), "x.log"))
    assert dead == []
    assert [(e.device, e.xid, e.pci_bus_id, e.gpu, e.node, e.source) for e in events] == [
        ("nvswitch", 12028, "0000:05:00", None, "dgx1", "x.log:1"),
        ("nvswitch", 20034, "0000:c6:00", None, "dgx1", "x.log:4"),
    ]
    assert events[0].message.startswith("Non-fatal, Link 33") and "Severity 0" in events[0].message
    assert "Data {0x00000000}" in events[0].message


def test_fallen_off_the_bus_without_a_number_is_xid_79_once_per_failure() -> None:
    alone = b"[Mon Jan 15 10:23:45 2024] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    event = one(alone, ParseOptions())
    assert (event.xid, event.pci_bus_id, event.message) == (
        79,
        "0000:3b:00",
        alone.split(b"NVRM: ")[1].decode(),
    )
    xid = b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    for lines in ([xid, alone], [alone, xid]):  # the driver prints both; either order is one failure
        events, dead = split(parse_kernel_log(lines, ParseOptions(), "n1.log"))
        assert dead == [] and [(e.xid, e.pid) for e in events] == [(79, 1)]
    other_gpu = alone.replace(b"3b:00.0", b"86:00.0")
    events, _ = split(parse_kernel_log([xid, other_gpu], ParseOptions(), "n1.log"))
    assert [e.pci_bus_id for e in events] == ["0000:3b:00", "0000:86:00"]
    old_driver = (
        b"[Mon Jan 15 10:23:45 2024] NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:20b0) installed "
    )
    old_driver += b"in this system has fallen off the bus and is not responding to commands."
    assert one(old_driver, ParseOptions()).xid == 79


def test_indented_continuation_lines_are_joined_into_the_message() -> None:
    lines = [
        b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on",
        b"                           (GPC 0, TPC 1, SM 0): Out Of Range Address",
        b"                           NVRM: second part",
        b"[Mon Jan 15 10:23:46 2024] NVRM: GPU 0000:86:00.0:",
        b"                           GPU has fallen off the bus.",
        b"[Mon Jan 15 10:23:47 2024] unrelated",
        b"   indented but after an unrelated line",
    ]
    events, dead = split(parse_kernel_log(lines, ParseOptions(), "n1.log"))
    assert dead == []
    assert [(e.xid, e.message, e.source) for e in events] == [
        (
            13,
            "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address second part",
            "n1.log:1",
        ),
        (79, "GPU 0000:86:00.0: GPU has fallen off the bus.", "n1.log:4"),
    ]


def test_dmesg_reltime_is_placed_to_the_minute_with_a_year() -> None:
    lines = [
        b"[Jan15 10:23] usb 1-1: new device",
        b"[  +1.500000] NVRM: Xid (PCI:0000:3b:00): 79, x",
        b"[  +2.000000] NVRM: Xid (PCI:0000:3b:00): 48, y",
        b"[Jan15 10:25] NVRM: Xid (PCI:0000:3b:00): 13, z",
    ]
    events, dead = split(parse_kernel_log(lines, ParseOptions(year=2024), "n1.log"))
    assert dead == []
    assert [e.ts_ms for e in events] == [
        parse_ts("2024-01-15T10:23:01.500Z"),
        parse_ts("2024-01-15T10:23:03.500Z"),
        parse_ts("2024-01-15T10:25:00Z"),
    ]
    events, dead = split(parse_kernel_log(lines, ParseOptions(), "n1.log"))
    assert events == [] and len(dead) == 1 and "pass --year" in dead[0].reason


def test_a_file_level_cause_is_one_dead_letter_naming_its_lines() -> None:
    lines = [b"NVRM: Xid (PCI:0000:3b:00): 79, a", b"noise", b"NVRM: Xid (PCI:0000:3b:00): 48, b",
             b"NVRM: Xid (PCI:0000:3b", b"NVRM: Xid (PCI:0000:3b:00): 13, c"]  # fmt: skip
    items = list(parse_kernel_log(lines, ParseOptions(), "n1.log"))
    assert all(isinstance(item, InvalidRecord) for item in items)
    assert [(d.location, d.reason.split(" (")[0]) for d in items] == [  # type: ignore[union-attr]
        ("line 4", "truncated or malformed 'NVRM: Xid' line"),
        ("lines 1-5 (3 lines)", "line has no time stamp"),
    ]


def test_short_full_with_a_zone_that_is_not_the_timezone_option_asks_for_it() -> None:
    dead = one_dead(
        b"Tue 2025-01-21 05:41:44 CET gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x", ParseOptions()
    )
    assert "pass --timezone" in dead.reason


@pytest.mark.parametrize("code", [b"65536", b"99999999999999999999", b"9" * 1_000_000])
def test_an_xid_code_past_every_code_is_a_dead_letter_not_a_crash(code: bytes) -> None:
    line = b"2024-01-15T10:23:45Z node001 kernel: NVRM: Xid (PCI:0000:3b:00): " + code + b", pid=1, name=x, y"
    sxid = b"2024-01-15T10:23:45Z node001 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): " + code + b", x"
    events, dead = split(parse_kernel_log([line, sxid], ParseOptions(), "f"))
    assert events == []
    assert [letter.reason.split(",")[0] for letter in dead] == [
        "XID code must be 1 to 65535",
        "SXid code must be 1 to 65535",
    ]
    assert all(len(letter.reason) < 200 for letter in dead)
