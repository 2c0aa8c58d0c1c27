"""Prometheus remote_write v1 bodies -> dcgm-exporter's ECC counters and XID gauge, by GPU and time.

A remote_write request is a snappy block (raw, not framed) of a protobuf ``WriteRequest``
(``prometheus/prompb/remote.proto`` and ``types.proto``): time series, each its labels and its
samples (value, timestamp in ms). Debian's Prometheus 2.42 sends exactly that; a request may also
carry metadata only. The messages are made here from their descriptors (no generated code, no
``protoc``), parsed by protobuf's C implementation; fields this reader does not name (exemplars,
histograms, metadata) are skipped.

What is read of each series is what :mod:`stream.inputs.parsers.dcgm` reads of a scrape: the ECC and
row-remapping counters (:data:`~stream.inputs.parsers.dcgm.METRIC_COUNTERS`) and the XID gauge
``DCGM_FI_DEV_XID_ERRORS`` (the last XID code), with dcgm-exporter's labels as they come:

* the node: ``Hostname``, ``hostname``, else ``instance`` without its port;
* the GPU: ``gpu`` (its index), ``pci_bus_id`` (``00000000:3B:00.0`` -> the kernel's ``0000:3b:00``);
  ``UUID``/``uuid``, ``pod``/``namespace`` (and their ``exported_`` forms) are carried along;
* a NaN (Prometheus' stale marker is one) and DCGM's no-value sentinels are dropped, as a scrape's
  are; any other value that is not a non-negative integer is an :class:`InvalidRecord`.

Prometheus shards series by their labels, so one GPU's counters of one scrape come in several
requests: each request gives :class:`DcgmPoint` values, and :mod:`stream.inputs.ecc_assembly`
makes one sample of a GPU's counters at one time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from schemas.records import InvalidRecord
from stream.inputs.parsers.dcgm import METRIC_COUNTERS, XID_METRIC, gpu_of_labels, is_dcgm_blank

__all__ = ["DcgmPoint", "RemoteWriteError", "WriteRequest", "dcgm_points", "decode_write_request"]

#: The metrics read, and their counter ("" for the XID gauge).
_WANTED: Final[dict[str, str]] = {**METRIC_COUNTERS, XID_METRIC: ""}
#: The largest body a request may decompress to (Prometheus sends a few MB at most).
MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024


def _write_request_class() -> Any:
    """``prometheus.WriteRequest`` (with ``TimeSeries``, ``Label``, ``Sample``) from descriptors."""
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="faultstream/prometheus_remote_write.proto", package="prometheus", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        added = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            spec = added.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                spec.type_name = type_name

    optional, repeated = proto.LABEL_OPTIONAL, proto.LABEL_REPEATED
    message(
        "Label", ("name", 1, proto.TYPE_STRING, optional, ""), ("value", 2, proto.TYPE_STRING, optional, "")
    )
    message(
        "Sample",
        ("value", 1, proto.TYPE_DOUBLE, optional, ""),
        ("timestamp", 2, proto.TYPE_INT64, optional, ""),
    )
    message(
        "TimeSeries",
        ("labels", 1, proto.TYPE_MESSAGE, repeated, ".prometheus.Label"),
        ("samples", 2, proto.TYPE_MESSAGE, repeated, ".prometheus.Sample"),
    )
    message("WriteRequest", ("timeseries", 1, proto.TYPE_MESSAGE, repeated, ".prometheus.TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


#: The ``WriteRequest`` message class (``Label``, ``Sample``, ``TimeSeries`` are its fields').
WriteRequest: Final = _write_request_class()


class RemoteWriteError(ValueError):
    """A body that is not a snappy-compressed ``WriteRequest``: the reason, for the HTTP 400."""


def decode_write_request(body: bytes) -> Any:
    """The ``WriteRequest`` of a remote_write body.

    Raises
    ------
    RemoteWriteError
        For a body that is not a snappy block, decompresses past :data:`MAX_DECOMPRESSED_BYTES`, or
        is not a ``WriteRequest``.
    """
    try:
        length = cramjam.snappy.decompress_raw_len(body)
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise RemoteWriteError(f"not a snappy block ({exc})") from None
    if length > MAX_DECOMPRESSED_BYTES:
        raise RemoteWriteError(
            f"the body decompresses to {length:,} bytes, more than {MAX_DECOMPRESSED_BYTES:,}"
        )
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:
        raise RemoteWriteError(f"not a snappy block ({exc})") from None
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise RemoteWriteError(f"not a remote_write WriteRequest ({exc})") from None
    return request


@dataclass(frozen=True, slots=True)
class DcgmPoint:
    """One DCGM value of one GPU at one time: an ECC counter, or the XID gauge (``counter`` "")."""

    node: str
    gpu: int
    pci_bus_id: str
    ts_ms: int
    counter: str
    value: int
    #: Labels worth keeping with the GPU's records (UUID, Kubernetes pod and namespace).
    extra: tuple[tuple[str, str], ...] = field(default=())


_EXTRA_LABELS: Final = ("UUID", "uuid", "pod", "namespace", "exported_pod", "exported_namespace")


def _host_of(instance: str) -> str:
    """A scrape target's ``instance`` without its port.

    >>> _host_of("gpu-node-17:9400"), _host_of("[fd00::7]:9400"), _host_of("gpu-node-17"), _host_of("fd00::7")
    ('gpu-node-17', 'fd00::7', 'gpu-node-17', 'fd00::7')
    """
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    if instance.count(":") == 1:
        return instance.split(":", 1)[0]
    return instance


def _gpu_labels(labels: dict[str, str]) -> tuple[str, int, str] | str:
    """(node, GPU index, PCI id) of a series, or the reason it has none (as a scrape's line)."""
    gpu = gpu_of_labels(labels)
    if isinstance(gpu, str):
        return gpu
    node = labels.get("Hostname") or labels.get("hostname") or _host_of(labels.get("instance", ""))
    if not node:
        return "no 'Hostname', 'hostname' or 'instance' label"
    return node, *gpu


def dcgm_points(request: Any, source: str) -> tuple[list[DcgmPoint], list[InvalidRecord], int]:
    """The DCGM values of a ``WriteRequest``, its dead letters (a series or value that cannot be
    used, with the reason), and how many samples were passed over (other metrics, NaN and stale
    markers, DCGM's blanks)."""
    points: list[DcgmPoint] = []
    bad: list[InvalidRecord] = []
    skipped = 0
    for number, series in enumerate(request.timeseries):
        labels = {label.name: label.value for label in series.labels}
        counter = _WANTED.get(labels.get("__name__", ""))
        if counter is None:
            skipped += len(series.samples)
            continue
        where = f"series {number} ({labels['__name__']})"
        found = _gpu_labels(labels)
        if isinstance(found, str):
            bad.append(InvalidRecord(found, raw=_shown(labels), source=source, location=where))
            continue
        node, gpu, pci = found
        extra = tuple((name, labels[name]) for name in _EXTRA_LABELS if labels.get(name))
        for sample in series.samples:
            value = sample.value
            if math.isnan(value):
                skipped += 1  # a stale marker, or no value
                continue
            if math.isinf(value) or value < 0 or value != int(value):
                reason = f"value {value!r} is not a non-negative integer"
                bad.append(InvalidRecord(reason, raw=_shown(labels), source=source, location=where))
                continue
            if is_dcgm_blank(int(value)):
                skipped += 1
                continue
            points.append(DcgmPoint(node, gpu, pci, sample.timestamp, counter, int(value), extra))
    return points, bad, skipped


def _shown(labels: dict[str, str]) -> bytes:
    """A series' labels as the dead letter's raw bytes (``{name="value",...}``)."""
    return ("{" + ",".join(f'{name}="{value}"' for name, value in sorted(labels.items())) + "}").encode()
