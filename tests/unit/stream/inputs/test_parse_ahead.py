"""Large input files parsed in a helper process (stream.inputs.parse_ahead): the same stream as
parsing in process, item for item, and a helper that fails or is left behind is dealt with."""

from __future__ import annotations

import gzip
import io
import os
import signal
import struct
from pathlib import Path

import pytest

from schemas.records import InvalidRecord
from stream.inputs.files import MergedInputs
from stream.inputs.parse_ahead import ParseAheadError, ParsedAhead
from stream.inputs.parsers import open_input, parse_open_file
from stream.inputs.parsers.options import Format, ParseOptions
from stream.settings import Settings
from stream.simulator import SimulationConfig, simulate

OPTIONS = ParseOptions(cluster="test")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A small simulated cluster's three files, a gzip copy of its scrape, and a kernel log with
    lines that claim to be XIDs and are not (dead letters)."""
    folder = tmp_path_factory.mktemp("ahead")
    simulate(SimulationConfig(nodes=6, days=6, seed=4), folder)  # a scrape file of more than one block
    dcgm = folder / "dcgm.prom"
    (folder / "gz").mkdir()
    with gzip.open(folder / "gz" / "dcgm.prom.gz", "wb") as out:
        out.write(dcgm.read_bytes())
    bad = folder / "bad.log"
    bad.write_bytes(
        (folder / "kernel.log").read_bytes()
        + b"[Mon Jan 15 10:23:45 2024] NVRM: Xid (PCI:0000:3b:00): not-a-number, pid=1\n"
        + b"\xff\xfe garbage\n"
    )
    return [folder / "kernel.log", folder / "sacct.txt", dcgm, folder / "gz" / "dcgm.prom.gz", bad]


def _stream(paths: list[Path], min_bytes: int) -> list[tuple[str, str]]:
    merged = MergedInputs(paths, OPTIONS, None, 300_000, min_bytes)
    try:
        return [(repr(item), stats.path) for item, stats in merged]
    finally:
        merged.close()


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_helpers_give_the_stream_parsed_in_process(cluster: list[Path]) -> None:
    in_process = _stream(cluster, 0)
    ahead = MergedInputs(cluster, OPTIONS, None, 300_000, 1)
    assert len(ahead._helpers) == len(cluster)
    ahead.close()
    assert _stream(cluster, 1) == in_process
    assert any("InvalidRecord" in item for item, _ in in_process)  # the dead letters came across too


def test_items_and_progress_of_one_helper(cluster: list[Path]) -> None:
    dcgm = cluster[2]
    with open_input(dcgm) as handle:
        expected = list(parse_open_file(handle, Format.DCGM, OPTIONS, str(dcgm)))
    helper = ParsedAhead(dcgm, Format.DCGM, OPTIONS, str(dcgm), chunk_items=100)
    seen, positions = [], []
    for item in helper:
        seen.append(item)
        positions.append(helper.position())
    assert seen == expected and not any(isinstance(item, InvalidRecord) for item in seen)
    # read to the end (-1 when the last items came with the helper's last frame)
    assert 0 < positions[0] < positions[-200] and positions[-1] in (-1, dcgm.stat().st_size)
    assert helper._process.returncode == 0


def test_a_helper_that_dies_stops_the_replay_with_a_clear_error(cluster: list[Path]) -> None:
    dcgm = cluster[2]
    helper = ParsedAhead(dcgm, Format.DCGM, OPTIONS, str(dcgm), chunk_items=10)
    items = iter(helper)
    next(items)
    os.kill(helper._process.pid, signal.SIGKILL)
    with pytest.raises(
        ParseAheadError,
        match=r"ended without finishing \(exit status -9\).*FAULTSTREAM_PARSE_AHEAD_MIN_BYTES=0",
    ):
        for _ in items:
            pass


def test_a_file_that_vanishes_is_reported_by_the_helper(tmp_path: Path, cluster: list[Path]) -> None:
    helper = ParsedAhead(tmp_path / "gone.prom", Format.DCGM, OPTIONS, "gone.prom")
    with pytest.raises(ParseAheadError, match=r"gone.prom: the parser process failed: FileNotFoundError"):
        list(helper)


def test_closing_early_stops_the_helpers(cluster: list[Path]) -> None:
    merged = MergedInputs(cluster, OPTIONS, None, 300_000, 1)
    next(iter(merged))
    merged.close()
    assert all(helper._process.returncode is not None for helper in merged._helpers)


def test_small_files_zero_and_one_cpu_parse_in_process(
    cluster: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    default = Settings().parse_ahead_min_bytes
    assert MergedInputs(cluster, OPTIONS, None, 300_000, default)._helpers == []  # all below 8 MiB
    assert MergedInputs(cluster, OPTIONS, None, 300_000, 0)._helpers == []
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert MergedInputs(cluster, OPTIONS, None, 300_000, 1)._helpers == []


def test_a_frame_cut_short_is_the_same_clear_error(cluster: list[Path]) -> None:
    dcgm = cluster[2]
    helper = ParsedAhead(dcgm, Format.DCGM, OPTIONS, str(dcgm))
    helper._process.kill()
    helper._out = io.BytesIO(struct.pack(">Q", 1000) + b"only part of a pickle")
    with pytest.raises(ParseAheadError, match=r"ended without finishing \(exit status -9\)"):
        list(helper)


def test_samples_cross_as_messagepack_and_come_back_equal_in_order() -> None:
    from schemas.records import EccSample, XidEvent
    from stream.inputs.parse_ahead import pack_items, unpack_items

    def sample(ts_ms: int, value: int) -> EccSample:
        return EccSample(
            ts_ms=ts_ms, cluster="c", node="n1", gpu=0, counters={"sbe_volatile": value}, source="f:1"
        )

    xid = XidEvent(ts_ms=1_705_312_800_000, cluster="c", node="n1", xid=79, source="f:2")
    letter = InvalidRecord("bad", raw=b"x", source="f", location="line 3")
    # the last run holds a time stamp and a count the wire's checks refuse: it still comes back as it was
    items = [
        sample(1_705_312_800_000, 1),
        sample(1_705_312_800_001, 2),
        xid,
        letter,
        sample(5, 2**40),
        sample(6, 0),
    ]
    segments = pack_items(items)
    assert [type(segment) for segment in segments] == [bytes, list, bytes]
    back = list(unpack_items(segments))
    assert back == items and [type(item) for item in back] == [type(item) for item in items]
    assert back[0].counters == {"sbe_volatile": 1} and back[3] is letter
