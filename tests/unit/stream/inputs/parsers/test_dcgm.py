"""DCGM exporter (Prometheus text) parser: grouping per scrape, XID field 230, dead letters."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from schemas.records import ECC_COUNTERS, EccSample, InvalidRecord, XidEvent
from schemas.timeutil import format_ts
from stream.inputs.files import MergedInputs
from stream.inputs.parsers import Format, ParseOptions, detect_format, parse_file, scrape_time_fallback
from stream.inputs.parsers.dcgm import DCGM_BLANKS, METRIC_COUNTERS, XID_MESSAGE, XID_METRIC, parse_dcgm

DATA = Path(__file__).resolve().parents[4] / "data" / "dcgm"
T0 = 1705312800000
T1 = T0 + 30_000
ZERO = dict.fromkeys(ECC_COUNTERS, 0)


def split(items: Iterable[object]) -> tuple[list[EccSample | XidEvent], list[InvalidRecord]]:
    records: list[EccSample | XidEvent] = []
    dead: list[InvalidRecord] = []
    for item in items:
        if isinstance(item, InvalidRecord):
            dead.append(item)
        else:
            assert isinstance(item, EccSample | XidEvent)
            records.append(item)
    return records, dead


def labels(gpu: str = "0", host: str = "node001", pci: str = "00000000:3B:00.0") -> str:
    return f'gpu="{gpu}",UUID="GPU-0b4a1c9e",pci_bus_id="{pci}",device="nvidia{gpu}",Hostname="{host}"'


def line(metric: str, value: str, ts: int | None = T0, **label_args: str) -> bytes:
    text = f"{metric}{{{labels(**label_args)}}} {value}" + (f" {ts}" if ts is not None else "")
    return text.encode()


def test_metric_table_covers_every_counter() -> None:
    assert sorted(METRIC_COUNTERS.values()) == sorted(ECC_COUNTERS)


def test_federated_sample_file() -> None:
    path = DATA / "dcgm-federate.prom"
    records, dead = split(parse_file(path, ParseOptions(cluster="c1")))
    assert [(type(r).__name__, r.ts_ms, r.node, r.gpu, r.source) for r in records] == [
        ("EccSample", T0, "node001", 0, f"{path}:35"),
        ("EccSample", T0, "node001", 1, f"{path}:36"),
        ("EccSample", T0, "node002", 0, f"{path}:115"),
        ("XidEvent", T0, "node002", 1, f"{path}:108"),
        ("EccSample", T0, "node002", 1, f"{path}:116"),
        ("XidEvent", T1, "node001", 0, f"{path}:187"),
        ("EccSample", T1, "node001", 0, f"{path}:195"),
        ("EccSample", T1, "node001", 1, f"{path}:196"),
        ("EccSample", T1, "node002", 0, f"{path}:275"),
        ("EccSample", T1, "node002", 1, f"{path}:276"),
    ]
    samples = {(r.ts_ms, r.node, r.gpu): r for r in records if isinstance(r, EccSample)}
    assert samples[(T0, "node001", 0)].counters == ZERO | {"sbe_aggregate": 10}
    assert samples[(T0, "node001", 1)].counters == ZERO
    assert samples[(T0, "node002", 0)].counters == ZERO | {
        "sbe_volatile": 5,
        "sbe_aggregate": 5,
        "remapped_rows_correctable": 3,
    }
    assert samples[(T1, "node001", 0)].counters == ZERO | {
        "sbe_volatile": 2,
        "dbe_volatile": 1,
        "sbe_aggregate": 12,
        "dbe_aggregate": 1,
        "remapped_rows_uncorrectable": 1,
        "remap_pending": 1,
    }
    # "5.0" and "5e0" are integral: accepted
    assert samples[(T1, "node002", 0)].counters == samples[(T0, "node002", 0)].counters
    # every damaged counter of node002 GPU 1 is left out, the rest of the sample is kept
    assert samples[(T1, "node002", 1)].counters == {
        "sbe_volatile": 0,
        "dbe_volatile": 0,
        "remap_failure": 0,
        "remap_pending": 0,
    }
    assert {(r.pci_bus_id, r.gpu) for r in records} == {("0000:07:00", 0), ("0000:0f:00", 1)}
    assert {r.cluster for r in records} == {"c1"}

    xids = [r for r in records if isinstance(r, XidEvent)]
    # node002 GPU 1 reports 79 in both scrapes: one event; node001 GPU 0 goes 0 -> 48: one event
    assert [(x.node, x.gpu, x.xid, x.ts_ms, x.pci_bus_id, x.message) for x in xids] == [
        ("node002", 1, 79, T0, "0000:0f:00", XID_MESSAGE),
        ("node001", 0, 48, T1, "0000:07:00", XID_MESSAGE),
    ]
    assert XID_MESSAGE == "reported by DCGM field 230"

    lines = path.read_bytes().split(b"\n")
    assert [(d.location, d.reason) for d in dead] == [
        ("line 284", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL: value -1 is negative"),
        ("line 288", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL: value 'NaN' is not a non-negative integer"),
        ("line 292", "DCGM_FI_DEV_RETIRED_SBE: value '2.5' is not a non-negative integer"),
        ("line 296", "DCGM_FI_DEV_RETIRED_DBE: 'gpu' label must be an integer, got 'x1'"),
        ("line 300", "unterminated label set"),
        ("line 304", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: time stamp '17053128x0000' is not integer ms"),
        ("line 308", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: invalid UTF-8 in the labels"),
    ]
    assert [d.raw for d in dead] == [lines[n - 1] for n in (284, 288, 292, 296, 300, 304, 308)]
    assert {d.source for d in dead} == {str(path)}


def test_exporter_scrape_without_timestamps() -> None:
    path = DATA / "node001.prom"
    records, dead = split(parse_dcgm(path.read_bytes().split(b"\n"), ParseOptions(), str(path)))
    assert records == []
    assert len(dead) == 1  # the file's cause, once: 12 metrics we read x 2 GPUs
    assert (
        dead[0].reason.startswith("24 samples have no time stamp") and "pass --scrape-time" in dead[0].reason
    )
    assert dead[0].location.startswith("lines ") and dead[0].location.endswith("(24 lines)")

    records, dead = split(parse_file(path, ParseOptions(scrape_time_ms=T0, node="ignored")))
    assert dead == []
    assert [(r.ts_ms, r.node, r.gpu, r.pci_bus_id) for r in records] == [
        (T0, "node001", 0, "0000:07:00"),  # the Hostname label wins over options.node
        (T0, "node001", 1, "0000:0f:00"),
    ]
    assert all(
        isinstance(r, EccSample) and r.counters == ZERO | {"sbe_aggregate": 10 * (r.gpu == 0)}
        for r in records
    )


def test_all_fields_of_a_gpu_and_time_make_one_sample() -> None:
    lines = [b"# HELP DCGM_FI_DEV_ECC_SBE_VOL_TOTAL x", b"# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter"]
    for metric, counter in METRIC_COUNTERS.items():
        lines += [
            line(metric, str(len(counter)), gpu="0"),
            line(metric, "1", gpu="1", pci="00000000:86:00.0"),
        ]
    records, dead = split(parse_dcgm(lines, ParseOptions(), "scrape.prom"))
    assert dead == []
    assert len(records) == 2
    first, second = records
    assert isinstance(first, EccSample) and isinstance(second, EccSample)
    assert first.counters == {counter: len(counter) for counter in ECC_COUNTERS}
    assert second.counters == dict.fromkeys(ECC_COUNTERS, 1)
    assert (first.gpu, first.pci_bus_id, second.gpu, second.pci_bus_id) == (0, "0000:3b:00", 1, "0000:86:00")
    assert (first.source, second.source) == ("scrape.prom:3", "scrape.prom:4")


def test_a_repeated_metric_family_starts_a_new_scrape_and_output_is_time_ordered() -> None:
    lines = [
        line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0", ts=T1),
        line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "4", ts=T1),
        line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "1", ts=T0, gpu="3"),  # new scrape, older time
        line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2", ts=T0, gpu="2"),
        line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0", ts=T0, gpu="2"),
        line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0", ts=T1 + 5, gpu="2"),
    ]
    records, dead = split(parse_dcgm(lines, ParseOptions(), "x"))
    assert dead == []
    got = [(r.ts_ms, r.gpu, dict(r.counters)) for r in records if isinstance(r, EccSample)]
    assert got == [
        (T1, 0, {"dbe_volatile": 0, "sbe_volatile": 4}),
        (T0, 2, {"dbe_volatile": 2, "sbe_volatile": 0}),
        (T0, 3, {"dbe_volatile": 1}),
        (T1 + 5, 2, {"dbe_volatile": 0}),
    ]


def test_series_major_dump_groups_by_time() -> None:
    # one series with all its samples, then the next series (as a TSDB dump prints them)
    lines = [line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", str(n), ts=T0 + n * 1000) for n in range(3)]
    lines += [line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", str(10 + n), ts=T0 + n * 1000) for n in range(3)]
    records, _ = split(parse_dcgm(lines, ParseOptions(), "x"))
    assert [(r.ts_ms, dict(r.counters)) for r in records if isinstance(r, EccSample)] == [
        (T0 + n * 1000, {"dbe_volatile": n, "sbe_volatile": 10 + n}) for n in range(3)
    ]


def test_xid_field_emits_on_change_and_after_a_reset() -> None:
    values = ["0", "79", "79", "0", "79", "48", "48"]
    lines = [line("DCGM_FI_DEV_XID_ERRORS", value, ts=T0 + n) for n, value in enumerate(values)]
    records, dead = split(parse_dcgm(lines, ParseOptions(cluster="c2"), "xid.prom"))
    assert dead == []
    assert all(isinstance(r, XidEvent) for r in records)
    assert [(r.ts_ms - T0, r.xid if isinstance(r, XidEvent) else None, r.source) for r in records] == [
        (1, 79, "xid.prom:2"),
        (4, 79, "xid.prom:5"),
        (5, 48, "xid.prom:6"),
    ]
    # Each change happened after the gauge's previous sample (what the core pairs kernel lines by).
    assert [r.since_ms for r in records if isinstance(r, XidEvent)] == [T0, T0 + 3, T0 + 4]
    first = list(parse_dcgm(lines[1:2], ParseOptions(), "xid.prom"))
    assert [r.since_ms for r in first if isinstance(r, XidEvent)] == [0]  # no previous sample
    event = records[0]
    assert isinstance(event, XidEvent)
    assert (event.cluster, event.node, event.gpu, event.pci_bus_id, event.pid) == (
        "c2",
        "node001",
        0,
        "0000:3b:00",
        None,
    )


def test_irrelevant_metrics_and_comments_are_skipped_even_when_malformed() -> None:
    lines = [
        b"# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        b"# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} hot',
        b"DCGM_FI_DEV_POWER_USAGE{gpu=",
        b'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",Hostname="n"} 0.981234 1705312800000',
        b'go_gc_duration_seconds{quantile="0"} 2.1e-05',
        b"",
        b"   ",
        b"\xff\xfe",
        b'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL_EXTRA{gpu="0"} 1',
    ]
    assert list(parse_dcgm(lines, ParseOptions(), "x")) == []


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 3 1705312800000", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL has no labels"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname="n1"} 3 1705312800000', "no 'gpu' label"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="-1"} 3 1705312800000', "'gpu' label must be an integer"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",pci_bus_id="3B"} 3 1705312800000', "label 'pci_bus_id'"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0" pci} 3 1705312800000', "malformed labels"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"}', "expected 'VALUE [TIMESTAMP_MS]'"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} 1 2 3', "expected 'VALUE [TIMESTAMP_MS]'"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} three 1705312800000', "value 'three' is not a number"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} +Inf 1705312800000', "not a non-negative integer"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} -0.5 1705312800000', "not a non-negative integer"),
        (b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} -3 1705312800000', "value -3 is negative"),
    ],
)
def test_dead_letters(raw: bytes, reason: str) -> None:
    records, dead = split(parse_dcgm([raw + b"\r\n"], ParseOptions(), "/scrapes/node9.prom"))
    assert records == []
    assert len(dead) == 1
    assert reason in dead[0].reason
    assert (dead[0].raw, dead[0].location, dead[0].source) == (raw, "line 1", "/scrapes/node9.prom")


def test_node_from_label_then_option_then_file_stem_and_escaped_labels() -> None:
    raw = b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="2", modelName="A \\"B\\" C\\\\",} 1e1 1705312800000'
    (from_stem,), _ = split(parse_dcgm([raw], ParseOptions(), "/scrapes/node9.prom.gz"))
    (from_option,), _ = split(parse_dcgm([raw], ParseOptions(node="gpu-a"), "/scrapes/node9.prom.gz"))
    assert (from_stem.node, from_option.node) == ("node9", "gpu-a")
    assert isinstance(from_stem, EccSample)
    assert (from_stem.gpu, from_stem.pci_bus_id, dict(from_stem.counters)) == (2, "", {"dbe_volatile": 10})
    _, dead = split(parse_dcgm([raw], ParseOptions(), ""))
    assert "pass --node" in dead[0].reason


# --- issue 13: the file's modification time, DCGM blanks ------------------------------------------


def test_a_scrape_without_time_stamps_falls_back_to_the_file_modification_time(tmp_path: Path) -> None:
    path = tmp_path / "node001.prom"
    path.write_bytes((DATA / "node001.prom").read_bytes())
    os.utime(path, ns=(T0 * 1_000_000, T0 * 1_000_000))
    options, note = scrape_time_fallback(path, Format.DCGM, ParseOptions())
    assert options.scrape_time_ms == T0
    assert note is not None and format_ts(T0) in note and "--scrape-time" in note
    records, dead = split(parse_file(path, ParseOptions()))
    assert dead == [] and {r.ts_ms for r in records} == {T0} and len(records) == 2
    given, note = scrape_time_fallback(path, Format.DCGM, ParseOptions(scrape_time_ms=5))
    assert given.scrape_time_ms == 5 and note is None  # --scrape-time wins, nothing to announce
    timed = DATA / "dcgm-federate.prom"
    assert scrape_time_fallback(timed, Format.DCGM, ParseOptions())[1] is None


def test_the_replay_summary_announces_the_fallback(tmp_path: Path) -> None:
    path = tmp_path / "node001.prom"
    path.write_bytes((DATA / "node001.prom").read_bytes())
    inputs = MergedInputs([path], ParseOptions(), None, 60_000)
    assert len(list(inputs)) == 2
    [stats] = inputs.sources
    assert len(stats.notes) == 1 and "modification time" in stats.notes[0]


@pytest.mark.parametrize(("name", "value"), sorted(DCGM_BLANKS.items()))
@pytest.mark.parametrize(
    "metric",
    [
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        XID_METRIC,
    ],
)
def test_every_dcgm_blank_is_no_value_never_a_count(name: str, value: float, metric: str) -> None:
    """A blank sentinel leaves the counter out (an older exporter once made two false critical
    gpu_row_remap incidents of them); other counters of the sample are kept."""
    spellings = {repr(value)} | ({str(int(value))} if float(value).is_integer() else set())
    for text in spellings:
        lines = [line(metric, text), line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "4")]
        records, dead = split(parse_dcgm(lines, ParseOptions(), "n.prom"))
        assert dead == [], (name, text)
        assert [type(r).__name__ for r in records] == ["EccSample"], (name, text)  # no XID from a blank
        assert dict(records[0].counters) == {"sbe_volatile": 4}, (name, text)


def test_values_just_below_the_blanks_are_counts() -> None:
    for value in (0x7FFFFFF0 - 1, 140737488355328 - 1):
        records, dead = split(
            parse_dcgm([line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", str(value))], ParseOptions(), "n")
        )
        assert dead == [] and dict(records[0].counters) == {"dbe_volatile": value}


def test_a_sample_of_blanks_only_is_not_emitted() -> None:
    lines = [line(metric, "9223372036854775794") for metric in METRIC_COUNTERS]
    assert list(parse_dcgm(lines, ParseOptions(), "n.prom")) == []


def test_an_exporter_scrape_with_blanks_stores_no_sentinel_and_raises_no_incident() -> None:
    """The issue's case: an older exporter printed blanks for a V100's row-remap fields, and they were
    stored as counts (two false critical gpu_row_remap incidents). Two scrapes of it now give samples
    without those counters, and the detection core finds nothing."""
    from detectors.core import CoreConfig, DetectionCore

    path = DATA / "gpu-a100-01.exporter-blanks.prom"
    assert detect_format(path) is Format.DCGM
    core = DetectionCore(CoreConfig())
    incidents = []
    for scrape_ms in (T0, T0 + 60_000):
        records, dead = split(parse_file(path, ParseOptions(scrape_time_ms=scrape_ms)))
        assert dead == []
        # Two samples and no XID: field 230's blank is no code.
        assert [type(r).__name__ for r in records] == ["EccSample", "EccSample"]
        a100, v100 = records
        assert dict(a100.counters) == {
            "sbe_volatile": 2, "dbe_volatile": 0, "sbe_aggregate": 11, "dbe_aggregate": 0,
            "remapped_rows_uncorrectable": 0, "remapped_rows_correctable": 0, "remap_failure": 0, "remap_pending": 0,
        }  # fmt: skip
        assert dict(v100.counters) == {
            "sbe_volatile": 0, "dbe_volatile": 0, "sbe_aggregate": 3, "dbe_aggregate": 0,
            "retired_pages_sbe": 0, "retired_pages_dbe": 0, "retired_pages_pending": 0,
        }  # fmt: skip
        for record in records:
            assert core.process(record)
        incidents += core.drain().incidents
    incidents += core.finish().incidents
    assert incidents == []
