"""nvidia-smi -q parser: new (SRAM/DRAM) and old (Single/Double Bit) ECC layouts, concatenated dumps."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from schemas.records import EccSample, InvalidRecord
from schemas.timeutil import parse_ts
from stream.inputs.parsers import ParseOptions, parse_file
from stream.inputs.parsers.nvidia_smi import parse_nvidia_smi

DATA = Path(__file__).resolve().parents[4] / "data" / "nvidia-smi"
A100_ZERO = {
    "sbe_volatile": 0,
    "dbe_volatile": 0,
    "sbe_aggregate": 0,
    "dbe_aggregate": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remap_pending": 0,
    "remap_failure": 0,
}


def split(items: Iterable[object]) -> tuple[list[EccSample], list[InvalidRecord]]:
    samples: list[EccSample] = []
    dead: list[InvalidRecord] = []
    for item in items:
        if isinstance(item, InvalidRecord):
            dead.append(item)
        else:
            assert isinstance(item, EccSample)
            samples.append(item)
    return samples, dead


def test_a100_two_concatenated_dumps() -> None:
    path = DATA / "node042.nvsmi-q.txt"
    samples, dead = split(parse_file(path, ParseOptions(cluster="c3")))
    first = parse_ts("2024-01-15T10:23:45Z")
    second = parse_ts("2024-01-15T10:28:45Z")
    assert [(s.ts_ms, s.gpu, s.pci_bus_id) for s in samples] == [
        (first, 0, "0000:07:00"),
        (first, 1, "0000:0f:00"),
        (first, 2, "0000:47:00"),
        (first, 3, "0000:4e:00"),
        (second, 0, "0000:07:00"),
        (second, 1, "0000:0f:00"),
        (second, 2, "0000:47:00"),
        (second, 3, "0000:4e:00"),
    ]
    assert {(s.node, s.cluster) for s in samples} == {("node042", "c3")}
    assert samples[0].source == f"{path}:9"
    assert samples[0].counters == A100_ZERO  # Retired Pages are N/A on A100: absent
    assert samples[2].counters == A100_ZERO | {
        "sbe_volatile": 5,  # SRAM 1 + DRAM 4
        "dbe_volatile": 1,
        "sbe_aggregate": 43,  # SRAM 3 + DRAM 40
        "dbe_aggregate": 2,
        "remapped_rows_correctable": 1,
        "remapped_rows_uncorrectable": 2,
        "remap_pending": 1,
    }
    assert samples[6].counters["sbe_volatile"] == 7
    assert samples[6].counters["sbe_aggregate"] == 45
    # a garbage count: dead letter, and the counter is left out of that GPU's sample
    last = dict(A100_ZERO)
    del last["remapped_rows_correctable"]
    assert samples[7].counters == last | {"remap_failure": 1}
    assert len(dead) == 1
    assert (dead[0].location, dead[0].raw) == (
        "line 1490",
        b"        Correctable Error                 : ???",
    )
    assert dead[0].reason == "Correctable Error: value '???' is not a count"


def test_v100_old_single_double_bit_layout() -> None:
    samples, dead = split(parse_file(DATA / "v100-node07.txt", ParseOptions(timezone="America/Chicago")))
    assert dead == []
    ts = parse_ts("2019-03-05T13:01:02Z")  # 07:01:02 CST
    assert [(s.ts_ms, s.node, s.gpu, s.pci_bus_id) for s in samples] == [
        (ts, "v100-node07", 0, "0000:1a:00"),
        (ts, "v100-node07", 1, "0000:1c:00"),
    ]
    assert samples[0].counters == {
        "sbe_volatile": 4,  # the Total lines, not the sum of the parts again
        "dbe_volatile": 0,
        "sbe_aggregate": 127,
        "dbe_aggregate": 2,
        "retired_pages_sbe": 1,
        "retired_pages_dbe": 2,
        "retired_pages_pending": 1,
    }
    assert samples[1].counters == dict.fromkeys(samples[0].counters, 0)


def test_h100_parity_and_sec_ded_lines_are_summed_but_sram_sources_are_not() -> None:
    samples, dead = split(parse_file(DATA / "node050.h100.txt", ParseOptions(node="h100-a")))
    assert dead == []
    assert len(samples) == 1
    sample = samples[0]
    assert (sample.ts_ms, sample.node, sample.gpu, sample.pci_bus_id) == (
        parse_ts("2024-07-10T14:05:09Z"),
        "h100-a",
        0,
        "0000:18:00",
    )
    assert sample.counters == {
        "sbe_volatile": 12,
        "dbe_volatile": 1,
        "sbe_aggregate": 35,
        "dbe_aggregate": 5,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 3,
        "remap_pending": 0,
        "remap_failure": 0,
    }


def test_gpu_without_timestamp_bad_timestamp_and_no_ecc() -> None:
    dump = [
        b"GPU 00000000:07:00.0\r\n",
        b"    Minor Number                          : 0\r\n",
        b"    Retired Pages\r\n",
        b"        Pending Page Blacklist            : No\r\n",
        b"==============NVSMI LOG==============",
        b"Timestamp                                 : Mon Jan 45 10:23:45 2024",
        b"GPU 00000000:0F:00.0",
        b"    Retired Pages",
        b"        Double Bit ECC                    : 1",
        b"==============NVSMI LOG==============",
        b"Timestamp                                 : Mon Jan 15 10:23:45 2024",
        b"GPU 0000:4E:00.0",
        b"    Product Name                          : NVIDIA GeForce RTX 4090 \xff",
        b"    Minor Number                          : N/A",
        b"    ECC Errors                            : N/A",
        b"    Remapped Rows                         : N/A",
        b"    Retired Pages",
        b"        Single Bit ECC                    : N/A",
        b"GPU 00000000:86:00.0",
        b"    Minor Number                          : N/A",
        b"    Retired Pages",
        b"        Pending Page Retirement           : Yes",
        b"    Pending                               : Yes",
    ]
    samples, dead = split(parse_nvidia_smi(dump, ParseOptions(), "/dumps/node3.smi"))
    assert [(d.location, d.raw) for d in dead] == [
        ("line 1", b"GPU 00000000:07:00.0"),
        ("line 6", b"Timestamp                                 : Mon Jan 45 10:23:45 2024"),
        ("line 7", b"GPU 00000000:0F:00.0"),
    ]
    assert "without a valid 'Timestamp'" in dead[0].reason
    assert "bad nvidia-smi Timestamp" in dead[1].reason
    assert [(s.node, s.gpu, s.pci_bus_id, dict(s.counters), s.source) for s in samples] == [
        ("node3", None, "0000:86:00", {"retired_pages_pending": 1}, "/dumps/node3.smi:19"),
    ]


def test_lines_outside_gpu_sections_and_unrelated_keys_are_ignored() -> None:
    dump = b"""Timestamp : Tue Jan 16 00:00:01 2024
Driver Version : 535.129.03
Remapped Rows
    Pending : Yes
GPU 00000000:07:00.0
    MIG Mode
        Pending                           : Enabled
    ECC Mode
        Pending                           : Enabled
    Clocks Event Reasons
        Pending                           : 12
    Remapped Rows
        Pending                           : No
""".splitlines()
    samples, dead = split(parse_nvidia_smi(dump, ParseOptions(), "n.txt"))
    assert dead == []
    assert [(s.ts_ms, dict(s.counters)) for s in samples] == [
        (parse_ts("2024-01-16T00:00:01Z"), {"remap_pending": 0})
    ]


# --- issue 13: "no value" is never a count -------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"N/A", b"[N/A]", b"Not Supported", b"[Not Supported]", b"Unknown", b"[Unknown Error]",
     b"[Insufficient Permissions]", b"[GPU requires reset]", b"[Requested functionality has been deprecated]"],
)  # fmt: skip
def test_no_value_leaves_the_counter_out(value: bytes) -> None:
    dump = [
        b"Timestamp                                 : Mon Jan 15 10:23:45 2024",
        b"GPU 00000000:07:00.0",
        b"    Minor Number                          : 0",
        b"    ECC Errors",
        b"        Volatile",
        b"            DRAM Correctable              : 3",
        b"            DRAM Uncorrectable            : " + value,
        b"    Remapped Rows",
        b"        Correctable Error                 : " + value,
        b"        Uncorrectable Error               : " + value,
        b"        Pending                           : " + value,
        b"        Remapping Failure Occurred        : " + value,
    ]
    samples, dead = split(parse_nvidia_smi(dump, ParseOptions(), "n.smi"))
    assert dead == []
    assert [dict(s.counters) for s in samples] == [{"sbe_volatile": 3}]


def test_a_localized_timestamp_is_read() -> None:
    dump = [b"Timestamp                                 : Di M\xc3\xa4r 12 10:23:45 2024", b"GPU 00000000:07:00.0",
            b"    Retired Pages", b"        Double Bit ECC                    : 1"]  # fmt: skip
    samples, dead = split(parse_nvidia_smi(dump, ParseOptions(), "n.smi"))
    assert dead == [] and [s.ts_ms for s in samples] == [parse_ts("2024-03-12T10:23:45Z")]
