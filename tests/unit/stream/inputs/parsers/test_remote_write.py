"""Prometheus remote_write bodies: real ones from Prometheus 2.42, and every way one can be bad."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import cramjam
import pytest

from schemas.records import InvalidRecord
from stream.inputs.parsers.remote_write import (
    MAX_DECOMPRESSED_BYTES,
    RemoteWriteError,
    WriteRequest,
    dcgm_points,
    decode_write_request,
)

DATA = Path(__file__).resolve().parents[4] / "data" / "remote_write"
#: Prometheus' stale marker: a NaN of its own bits (0x7ff0000000000002).
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def body(*series: tuple[dict[str, str], list[tuple[float, int]]]) -> bytes:
    request = WriteRequest()
    for labels, samples in series:
        added = request.timeseries.add()
        for name, value in sorted(labels.items()):
            added.labels.add(name=name, value=value)
        for value, ts in samples:
            added.samples.add(value=value, timestamp=ts)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def gpu_labels(name: str, **more: str) -> dict[str, str]:
    return {"__name__": name, "gpu": "1", "pci_bus_id": "00000000:3C:00.0", "Hostname": "n7", **more}


def test_a_real_prometheus_body_gives_the_counters_and_the_xid_gauge_of_each_gpu() -> None:
    request = decode_write_request((DATA / "prometheus-2.42-scrape-5.bin").read_bytes())
    points, bad, skipped = dcgm_points(request, "receive")
    assert bad == []
    assert len(request.timeseries) == 15
    # Two GPUs x (SBE, DBE, XID gauge); the blank RETIRED_SBE, the temperature and Prometheus' own
    # five series are passed over.
    assert skipped == 2 + 2 + 5
    by_gpu = {(p.gpu, p.counter): p for p in points}
    assert sorted(by_gpu) == [
        (0, ""),
        (0, "dbe_volatile"),
        (0, "sbe_volatile"),
        (1, ""),
        (1, "dbe_volatile"),
        (1, "sbe_volatile"),
    ]
    sbe1 = by_gpu[(1, "sbe_volatile")]
    assert (sbe1.node, sbe1.pci_bus_id, sbe1.value) == (
        "gpu-node-17",
        "0000:3c:00",
        2 * by_gpu[(0, "sbe_volatile")].value,
    )
    assert len({p.ts_ms for p in points}) == 1  # one scrape, one time
    assert ("UUID", "GPU-1abc") in sbe1.extra


def test_nan_stale_markers_and_blanks_are_passed_over_and_bad_values_are_dead_letters() -> None:
    request = decode_write_request(
        body(
            (
                gpu_labels("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                [(3, 1000), (STALE_NAN, 2000), (9.223372036854775794e18, 3000)],
            ),
            (gpu_labels("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), [(-1, 1000), (2.5, 2000), (math.inf, 3000)]),
        )
    )
    points, bad, skipped = dcgm_points(request, "receive")
    assert [(p.counter, p.value, p.ts_ms) for p in points] == [("sbe_volatile", 3, 1000)]
    assert skipped == 2
    assert [letter.reason for letter in bad] == [
        "value -1.0 is not a non-negative integer",
        "value 2.5 is not a non-negative integer",
        "value inf is not a non-negative integer",
    ]
    assert all(
        isinstance(letter, InvalidRecord) and letter.location == "series 1 (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)"
        for letter in bad
    )


@pytest.mark.parametrize(
    ("labels", "node_or_reason"),
    [
        ({"Hostname": "", "hostname": "h1"}, "h1"),
        ({"Hostname": "", "instance": "gpu-node-3:9400"}, "gpu-node-3"),
        ({"Hostname": "", "instance": "[fd00::7]:9400"}, "fd00::7"),
        ({"Hostname": ""}, "no 'Hostname', 'hostname' or 'instance' label"),
        ({"gpu": "zero"}, "'gpu' label must be an integer, got 'zero'"),
        ({"pci_bus_id": "nonsense"}, "label 'pci_bus_id'"),
    ],
)
def test_the_node_comes_from_hostname_or_instance_and_bad_labels_are_named(
    labels: dict[str, str], node_or_reason: str
) -> None:
    request = decode_write_request(body((gpu_labels("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", **labels), [(1, 1000)])))
    points, bad, _ = dcgm_points(request, "receive")
    if points:
        assert points[0].node == node_or_reason
    else:
        assert node_or_reason in bad[0].reason


def test_a_series_without_a_gpu_label_is_one_dead_letter() -> None:
    labels = {"__name__": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Hostname": "n1"}
    points, bad, _ = dcgm_points(decode_write_request(body((labels, [(1, 1000), (2, 2000)]))), "receive")
    assert points == [] and [letter.reason for letter in bad] == ["no 'gpu' label"]


def test_a_metadata_only_request_gives_nothing() -> None:
    metadata_only = bytes(cramjam.snappy.compress_raw(b"\x1a\x04\x08\x01\x12\x00"))  # field 3: MetricMetadata
    assert dcgm_points(decode_write_request(metadata_only), "receive") == ([], [], 0)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "not a snappy block"),
        (b"\x0a\xff\xff\xff", "not a snappy block"),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\x05\x0a\x03\x0a\x01")), "not a remote_write WriteRequest"),
        (
            bytes(cramjam.snappy.compress_raw(b"plain text, not protobuf at all")),
            "not a remote_write WriteRequest",
        ),
    ],
)
def test_a_body_that_is_not_a_write_request_is_refused_with_the_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(RemoteWriteError, match=reason):
        decode_write_request(raw)


def test_a_truncated_snappy_block_is_refused() -> None:
    whole = (DATA / "prometheus-2.42-scrape-1.bin").read_bytes()
    with pytest.raises(RemoteWriteError, match="not a snappy block"):
        decode_write_request(whole[: len(whole) // 2])


def test_a_body_that_would_decompress_past_the_limit_is_refused_before_it_is() -> None:
    varint = bytearray()
    length = MAX_DECOMPRESSED_BYTES + 1
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    with pytest.raises(RemoteWriteError, match="decompresses to"):
        decode_write_request(bytes(varint) + b"\x00" * 16)


def test_ten_thousand_series_decode() -> None:
    series = [
        (gpu_labels("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu=str(n % 8), Hostname=f"n{n // 8}"), [(n, 1000)])
        for n in range(10_000)
    ]
    points, bad, _ = dcgm_points(decode_write_request(body(*series)), "receive")
    assert len(points) == 10_000 and bad == []
