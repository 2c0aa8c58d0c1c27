"""Format sniffing, parse_file / parse_lines plumbing, gzip, and ParseOptions."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest

from schemas.records import InvalidRecord, XidEvent
from stream.inputs.parsers import Format, ParseOptions, detect_format, parse_file, parse_lines

DATA = Path(__file__).resolve().parents[4] / "data"


@pytest.mark.parametrize(
    ("relative", "fmt"),
    [
        ("kernel/node017.dmesg", Format.KERNEL),
        ("kernel/node018.dmesg-T.log", Format.KERNEL),
        ("kernel/syslog-cluster-a.log", Format.KERNEL),
        ("kernel/journal-short-iso.log", Format.KERNEL),
        ("kernel/node008.rfc5424.log", Format.KERNEL),
        ("kernel/node019.mixed.log.gz", Format.KERNEL),
        ("gcm-sacct/sample-sacct-output.txt", Format.SACCT),
        ("gcm-sacct/sample-sacct-multiple-multiline.txt", Format.SACCT),
        ("gcm-sacct/sample-sacct-running-output.txt", Format.SACCT),
        ("gcm-sacct/sample-sacct-output-midnight-edge-case.txt", Format.SACCT),
        ("gcm-sacct/sample-sacct-output-invalid-utf8.txt", Format.SACCT),
        ("gcm-sacct/sample-sacct-output-with-invalid-lines.txt", Format.SACCT),
        ("sacct/cluster-b.sacct.txt", Format.SACCT),
        ("dcgm/node001.prom", Format.DCGM),
        ("dcgm/dcgm-federate.prom", Format.DCGM),
        ("nvidia-smi/node042.nvsmi-q.txt", Format.NVIDIA_SMI),
        ("nvidia-smi/v100-node07.txt", Format.NVIDIA_SMI),
        ("nvidia-smi/node050.h100.txt", Format.NVIDIA_SMI),
        ("jsonl/events.jsonl", Format.JSONL),
        ("gcm-sacct/README.md", Format.KERNEL),
    ],
)
def test_detect_sample_files(relative: str, fmt: Format) -> None:
    assert detect_format(DATA / relative) is fmt


@pytest.mark.parametrize(
    ("content", "fmt"),
    [
        (b"", Format.KERNEL),
        (b"\n\n  \n", Format.KERNEL),
        (b'\n{"ts": 1704067200000}\n', Format.JSONL),
        (b"jobid|state|start\n", Format.SACCT),
        (b"JobID|#State|#End\n", Format.SACCT),
        (b"JobID State Start\n1 RUNNING x\n", Format.KERNEL),
        (b"# HELP DCGM_FI_DEV_GPU_TEMP x\n", Format.DCGM),
        (b'# comment\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 31\n', Format.DCGM),
        (b"Jan 1 00:00:00 n1 kernel: saw DCGM_FI_DEV_XID_ERRORS in a log\n", Format.KERNEL),
        (b"Timestamp : Mon Jan 15 10:23:45 2024\nAttached GPUs : 8\n", Format.NVIDIA_SMI),
        (b"Jan 15 10:23:45 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x\n", Format.KERNEL),
        (b"caf\xe9 au lait\n" * 3, Format.KERNEL),
    ],
)
def test_detect_content_not_name(tmp_path: Path, content: bytes, fmt: Format) -> None:
    path = tmp_path / "input.jsonl"  # the name says JSONL; only the content counts
    path.write_bytes(content)
    assert detect_format(path) is fmt
    packed = tmp_path / "packed.bin"
    packed.write_bytes(gzip.compress(content))
    assert detect_format(packed) is fmt


def test_detect_refuses_binary(tmp_path: Path) -> None:
    path = tmp_path / "node1.log.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd\x00\x00\x10\x00" * 100)
    with pytest.raises(ValueError, match=r"cannot detect the format of .*node1\.log\.zst.*binary"):
        detect_format(path)
    with pytest.raises(ValueError, match="binary"):
        parse_file(path, ParseOptions())  # raised at once, not on iteration


def test_missing_file_raises_at_once(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        parse_file(tmp_path / "nope.log", ParseOptions())
    with pytest.raises(FileNotFoundError):
        parse_file(tmp_path / "nope.log", ParseOptions(), Format.KERNEL)


def test_parse_file_reads_gzip_by_content_and_keeps_the_path_as_given(tmp_path: Path) -> None:
    line = b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, gone\r\n"
    path = tmp_path / "node5.dmesg"
    path.write_bytes(gzip.compress(b"noise\n" + line))
    (event,) = parse_file(path, ParseOptions())
    assert isinstance(event, XidEvent)
    assert (event.node, event.source, event.message) == ("node5", f"{path}:2", "gone")
    (again,) = parse_file(str(path), ParseOptions(), "kernel")  # type: ignore[arg-type]
    assert again == event


def test_truncated_gzip_keeps_records_and_reports_the_damage(tmp_path: Path) -> None:
    lines = [
        b"[Mon Jan 15 10:%02d:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, gone\n" % minute
        for minute in range(60)
    ]
    packed = gzip.compress(b"".join(lines) * 50)
    path = tmp_path / "node6.log.gz"
    path.write_bytes(packed[: len(packed) // 2])
    items = list(parse_file(path, ParseOptions()))
    assert all(isinstance(item, XidEvent) for item in items[:-1])
    assert len(items) > 100
    last = items[-1]
    assert isinstance(last, InvalidRecord)
    assert "compressed input ends early or is corrupt" in last.reason
    assert last.source == str(path)
    assert last.location == f"line {len(items)}"


def test_parse_lines_dispatches_on_format() -> None:
    line = b'{"ts": 1704067200000, "node": "n", "xid": 31}'
    assert [type(item) for item in parse_lines([line], Format.JSONL, ParseOptions(), "s")] == [XidEvent]
    assert list(parse_lines([line], Format.KERNEL, ParseOptions(), "s")) == []
    with pytest.raises(ValueError):
        parse_lines([line], "yaml", ParseOptions(), "s")  # type: ignore[arg-type]


def test_format_values() -> None:
    assert [fmt.value for fmt in Format] == ["kernel", "sacct", "dcgm", "nvidia-smi", "jsonl"]
    assert Format("nvidia-smi") is Format.NVIDIA_SMI


def test_parse_options_defaults_and_validation() -> None:
    options = ParseOptions()
    assert (
        options.cluster,
        options.node,
        options.year,
        options.boot_time_ms,
        options.scrape_time_ms,
        options.gpus_per_node,
        options.timezone,
    ) == ("default", None, None, None, None, 8, "UTC")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.cluster = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        ParseOptions(timezone="Mars/Olympus")
    with pytest.raises(ValueError, match="gpus_per_node"):
        ParseOptions(gpus_per_node=-1)


def test_detect_reads_what_a_damaged_gzip_stream_holds(tmp_path: Path) -> None:
    content = b"".join(b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} %d\n' % n for n in range(5000))
    packed = gzip.compress(content)
    path = tmp_path / "scrape.gz"
    path.write_bytes(packed[: len(packed) // 2])
    assert detect_format(path) is Format.DCGM
