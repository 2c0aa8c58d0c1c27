"""Scrapes sent through remote_write, split by shards and batches in any order, assemble into the
samples (and XID events) the scrape file gives."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import zlib
from pathlib import Path

import cramjam
import pytest

from schemas.records import EccSample, XidEvent
from stream.inputs.ecc_assembly import EccAssembly
from stream.inputs.parsers.dcgm import parse_dcgm
from stream.inputs.parsers.options import ParseOptions
from stream.inputs.parsers.remote_write import DcgmPoint, WriteRequest, dcgm_points, decode_write_request

ROOT = Path(__file__).resolve().parents[4]
_LINE = re.compile(r"^(\w+)\{(.*)\} (\S+) (\d+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A simulated cluster's DCGM scrapes (6 nodes, 2 days, hourly), with XID gauge series added:
    GPU 3 of node0002 reports 79 for three scrapes, then 0, then 48."""
    out = tmp_path_factory.mktemp("sim")
    subprocess.run(
        [sys.executable, "-m", "stream.cli", "simulate", "--nodes", "6", "--days", "2", "--seed", "3",
         "--ecc-interval-minutes", "60", "--out", str(out)],
        check=True, cwd=ROOT, capture_output=True,
    )  # fmt: skip
    text = (out / "dcgm.prom").read_bytes()
    series = series_of(text)
    times = sorted({ts for _, _, ts in series})
    pci = {labels["gpu"]: labels["pci_bus_id"] for labels, _, _ in series if labels["Hostname"] == "node0002"}
    gauge = {times[5]: 79, times[6]: 79, times[7]: 79, times[8]: 0, times[12]: 48}
    extra = [
        f'DCGM_FI_DEV_XID_ERRORS{{gpu="{gpu}",pci_bus_id="{pci[str(gpu)]}",Hostname="node0002"}} '
        f"{gauge.get(ts, 0) if gpu == 3 else 0} {ts}"
        for ts in times
        for gpu in range(8)
    ]
    return text + ("\n".join(extra) + "\n").encode()


def series_of(text: bytes) -> list[tuple[dict[str, str], float, int]]:
    found = []
    for line in text.decode().splitlines():
        match = _LINE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2)))
            labels["__name__"] = match.group(1)
            found.append((labels, float(match.group(3)), int(match.group(4))))
    return found


def shard_bodies(text: bytes, shards: int, batch: int, seed: int) -> list[bytes]:
    """What Prometheus' remote_write sends: series hashed to shards, each shard's samples in time
    order in batches of at most ``batch``; the shards' requests interleaved with a shard up to one
    scrape behind another (parts of a scrape come after parts of the next)."""
    rng = random.Random(seed)
    by_time: dict[int, list[tuple[dict[str, str], float, int]]] = {}
    for labels, value, ts in series_of(text):
        by_time.setdefault(ts, []).append((labels, value, ts))
    sends: list[tuple[float, int, list[tuple[dict[str, str], float, int]]]] = []
    for scrape, ts in enumerate(sorted(by_time)):
        queues: list[list[tuple[dict[str, str], float, int]]] = [[] for _ in range(shards)]
        for item in by_time[ts]:
            queues[zlib.crc32(repr(sorted(item[0].items())).encode()) % shards].append(item)
        for shard, queue in enumerate(queues):
            lag = rng.uniform(0, 1.0)
            for i in range(0, len(queue), batch):
                sends.append((scrape + lag + i * 1e-6, shard, queue[i : i + batch]))
    bodies = []
    for _, _, samples in sorted(sends, key=lambda send: (send[0], send[1])):
        request = WriteRequest()
        for labels, value, ts in samples:
            series = request.timeseries.add()
            for name, label in sorted(labels.items()):
                series.labels.add(name=name, value=label)
            series.samples.add(value=value, timestamp=ts)
        bodies.append(bytes(cramjam.snappy.compress_raw(request.SerializeToString())))
    return bodies


def plain(records: list[object]) -> list[tuple[object, ...]]:
    out = []
    for record in records:
        if isinstance(record, EccSample):
            out.append(
                (
                    "ecc",
                    record.ts_ms,
                    record.node,
                    record.gpu,
                    record.pci_bus_id,
                    tuple(sorted(record.counters.items())),
                )
            )
        elif isinstance(record, XidEvent):
            out.append(
                ("xid", record.ts_ms, record.node, record.gpu, record.pci_bus_id, record.xid, record.since_ms)
            )
    return sorted(out, key=lambda r: (r[1], r[2], r[3] or 0, r[0]))


@pytest.mark.parametrize(("shards", "batch", "seed"), [(1, 500, 1), (4, 100, 2), (16, 37, 3)])
def test_sharded_batches_assemble_into_the_scrape_file_s_records(
    scrapes: bytes, shards: int, batch: int, seed: int
) -> None:
    expected = plain(list(parse_dcgm(scrapes.splitlines(), ParseOptions(cluster="c"), "dcgm.prom")))
    assert any(r[0] == "xid" for r in expected), "the fixture must carry XID changes"
    now = [0.0]
    assembly = EccAssembly("c", settle_seconds=5.0, clock=lambda: now[0])
    got: list[object] = []
    for body in shard_bodies(scrapes, shards, batch, seed):
        points, bad, _ = dcgm_points(decode_write_request(body), "receive")
        assert bad == []
        got.extend(assembly.add(points))
        now[0] += 0.05  # requests a few tens of ms apart
        got.extend(assembly.due())
    now[0] += 10
    got.extend(assembly.due())
    assert assembly.open_gatherings == 0 and assembly.late_points == 0
    assert plain(got) == expected


def test_a_gpu_s_samples_go_out_in_time_order_and_a_late_point_is_counted() -> None:
    now = [0.0]
    assembly = EccAssembly("c", settle_seconds=5.0, clock=lambda: now[0])

    def point(counter: str, value: int, ts: int) -> DcgmPoint:
        return DcgmPoint("n1", 0, "", ts, counter, value)

    assembly.add([point("sbe_volatile", 1, 1000), point("dbe_volatile", 0, 1000)])
    now[0] = 5.0
    assert [s.ts_ms for s in assembly.due()] == [1000]  # the first settles; its counters are known now
    assembly.add([point("sbe_volatile", 2, 2000)])  # 2000 still lacks its DBE
    out = assembly.add([point("sbe_volatile", 3, 3000), point("dbe_volatile", 0, 3000)])
    assert out == []  # 3000 is complete but waits for 2000
    now[0] = 10.5
    assert [s.ts_ms for s in assembly.due()] == [2000, 3000]
    assert assembly.add([point("dbe_volatile", 0, 2000)]) == [] and assembly.late_points == 1
