"""Typed records: the three inputs (XID events, ECC samples, job state changes) and the outputs.

Inputs are validated here, at the schema boundary, because the detectors (like River) do no
validation of their own. ``from_dict`` mirrors the JSON Schemas in ``schemas/jsonschema/``
(a unit test keeps the two in agreement) but is hand-written, because replaying a month of a
large cluster cannot afford a generic validator per record.

All times are integer milliseconds since the epoch, UTC, named ``*_ms``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from msgspec.structs import force_setattr

from schemas.timeutil import format_ts, parse_iso_ts, parse_ts

__all__ = [
    "ECC_COUNTERS",
    "ECC_PLAIN_COUNT_LIMIT",
    "RECORD_KIND",
    "XID_DEVICES",
    "EccSample",
    "EccWireCounters",
    "InvalidRecord",
    "JobEvent",
    "JobState",
    "Record",
    "XidEvent",
    "finish_decoded_ecc_samples",
    "normalize_pci_bus_id",
]


#: Longest reason a dead letter carries (its Kafka header, its table row); longer ones are cut.
MAX_REASON_CHARS: Final = 1000


class InvalidRecord(ValueError):
    """A record that cannot be parsed or fails validation; it belongs in the dead letters.

    Parameters
    ----------
    reason
        Why the record was rejected, phrased for the operator who reads the dead letters.
    raw
        The original bytes or text, kept verbatim so the record can be repaired and replayed.
    source
        Where it came from: a file path or a topic name.
    location
        Where in the source: ``line 12`` or ``partition 3 offset 1200``.
    """

    def __init__(self, reason: str, raw: bytes | str = b"", source: str = "", location: str = "") -> None:
        if len(reason) > MAX_REASON_CHARS:  # a reason quoting a 1 MB value: the raw bytes have it
            reason = f"{reason[: MAX_REASON_CHARS - 40]}… ({len(reason):,} characters, cut)"
        super().__init__(reason)
        self.reason = reason
        self.raw = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
        self.source = source
        self.location = location


_PCI_RE: Final = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?$"
)


@lru_cache(maxsize=4096)
def normalize_pci_bus_id(value: str) -> str:
    """Return the canonical ``dddd:bb:dd`` form of a PCI bus id, as the kernel log prints it.

    DCGM prints ``00000000:3B:00.0`` and the kernel ``PCI:0000:3b:00``; both name the same GPU,
    so detectors key GPUs by this canonical form.

    Cached: a cluster has a handful of distinct bus ids (one per GPU slot of a board, each
    spelled a few ways), and every ECC sample and most XID events carry one. A rejected value
    raises each time (exceptions are not cached).

    >>> normalize_pci_bus_id("00000000:3B:00.0")
    '0000:3b:00'
    >>> normalize_pci_bus_id("PCI:0000:3b:00")
    '0000:3b:00'
    """
    match = _PCI_RE.match(value.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {value!r}")
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}"


# ---------------------------------------------------------------------------------------------
# Ranges: what the ClickHouse columns hold (schemas/ddl.py), and times a GPU fleet can have logged.

#: Event times (``ts``, a job's ``start`` and ``end``) from 2000-01-01 to before 2100-01-01 UTC.
#: A clock at 1970 (unset) or in 2200 (garbage) is a dead letter: stored, it would open
#: incidents at absurd times, move the event-time watermark past every real record (making
#: them all late) and reorder the worker's merge; DateTime64 and Python's datetime would not
#: even hold the most extreme ones.
TS_MIN_MS: Final = 946_684_800_000
TS_MAX_MS: Final = 4_102_444_800_000
#: Column bounds: ``xid`` and ``gpu`` are UInt16, ``pid`` and a job's ``gpus`` UInt32, ECC counters
#: UInt64. A larger value could not be inserted, and the failed insert would be retried forever.
MAX_UINT16: Final = 2**16 - 1
MAX_UINT32: Final = 2**32 - 1
MAX_UINT64: Final = 2**64 - 1

# ---------------------------------------------------------------------------------------------
# Validation helpers: each raises InvalidRecord with a reason naming the field.


def _require(data: Mapping[str, Any], name: str) -> Any:
    if name not in data or data[name] is None:
        raise InvalidRecord(f"missing required field '{name}'")
    return data[name]


def _str(data: Mapping[str, Any], name: str, *, required: bool = True, allow_empty: bool = False) -> str:
    value = _require(data, name) if required else data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRecord(f"field '{name}' must be a string, got {type(value).__name__}")
    if required and not allow_empty and not value.strip():
        raise InvalidRecord(f"field '{name}' must not be empty")
    return value


def _int(
    data: Mapping[str, Any], name: str, *, required: bool = True, minimum: int | None = 0, maximum: int
) -> int | None:
    value = _require(data, name) if required else data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRecord(f"field '{name}' must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidRecord(f"field '{name}' must be >= {minimum}, got {value}")
    if value > maximum:
        raise InvalidRecord(f"field '{name}' must be <= {maximum}, got {value}")
    return value


def _ts(data: Mapping[str, Any], name: str, *, required: bool = True) -> int | None:
    value = _require(data, name) if required else data.get(name)
    if value is None:
        return None
    try:
        ts_ms = parse_ts(value)
    except ValueError as exc:
        raise InvalidRecord(f"field '{name}': {exc}") from None
    if not TS_MIN_MS <= ts_ms < TS_MAX_MS:
        raise InvalidRecord(
            f"field '{name}' out of range ({value!r} is not between 2000-01-01 and 2100-01-01 UTC)"
        )
    return ts_ms


def _pci(data: Mapping[str, Any]) -> str:
    value = _str(data, "pci_bus_id", required=False)
    if not value:
        return ""
    try:
        return normalize_pci_bus_id(value)
    except ValueError as exc:
        raise InvalidRecord(f"field 'pci_bus_id': {exc}") from None


def _mapping(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRecord(f"a record must be a JSON object, got {type(value).__name__}")
    return value


def _drop_empty(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if value is not None and value != ""}


# ---------------------------------------------------------------------------------------------
# The fast path of ``from_dict``.
#
# Each ``from_dict`` first tries the common document: a ``dict`` (what ``orjson.loads`` returns)
# whose fields have exactly their JSON types (``type(x) is int`` also keeps ``bool`` out). It
# checks those inline, with no helper calls, and accepts only what ``_from_dict_checked`` (the
# reference validator, unchanged) accepts, building the equal record. On any doubt it hands the
# document to ``_from_dict_checked``, so every rejection, and its reason, comes from the same code
# as before. tests/unit/schemas/test_records_fast.py holds the two paths to this.
#
# The record is built without the dataclass ``__init__``: a frozen dataclass stores each field
# through ``object.__setattr__`` (its own ``__setattr__`` refuses), which cost more than all the
# validation. Instead a mutable twin with the same ``__slots__`` is filled by plain attribute
# stores and then given the record's class by ``__class__`` assignment, which Python allows
# between classes of identical ``__slots__``. From then on it is an ordinary frozen record: same
# type, fields, equality, hash and pickling.


def _mutable_twin(cls: type) -> Any:
    """A class with the ``__slots__`` of ``cls`` and nothing else, whose instances can become ``cls``.

    Typed ``Any`` so that the fast paths may store the fields, which type checkers (rightly)
    refuse on the frozen record itself.
    """
    return type(
        f"_Mutable{cls.__name__}", (), {"__slots__": cls.__dict__["__slots__"], "__module__": __name__}
    )


# ---------------------------------------------------------------------------------------------
# XID events

#: What reported an :class:`XidEvent`: a GPU's driver (``NVRM: Xid``, DCGM field 230) or an NVSwitch's
#: (``nvidia-nvswitchN: SXid``). Their code spaces overlap in number but not in meaning, so every
#: consumer of ``xid`` must look at ``device`` first.
XID_DEVICES: Final = ("gpu", "nvswitch")


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One NVIDIA XID error reported by the driver on a node.

    Attributes
    ----------
    ts_ms
        Event time on the node.
    cluster, node
        Where it happened. ``node`` is the Kafka key.
    pci_bus_id
        Canonical PCI bus id of the GPU (``0000:3b:00``), empty when the report has none.
    gpu
        GPU index on the node, when the source knows it (DCGM does, the kernel log does not).
    xid
        The XID code.
    pid, process
        The process the driver blamed, when it names one.
    message
        The driver's text after the code, or the whole line when nothing better exists.
    source
        Provenance (``file:line`` or ``topic/partition/offset``); not part of the identity.
    device
        What reported it (:data:`XID_DEVICES`): ``"gpu"`` for a GPU XID, ``"nvswitch"`` for an
        NVSwitch ``SXid``, whose ``xid`` is the SXid code, ``pci_bus_id`` the switch's PCI id and
        ``gpu`` None. Last among the fields so that positional construction keeps its meaning; left
        out of the wire form when ``"gpu"``, so GPU records are the bytes they were before.
    since_ms
        Set on an XID a gauge of the last XID code reported (DCGM field 230, whose value changed):
        the time of the gauge's previous sample, after which the XID happened (at or before
        ``ts_ms``, the sample's time); 0 when no previous sample was seen (any time before). None
        for an XID the driver logged, at its own time. The detection core pairs the two reports of
        one XID with it (:mod:`detectors.xid_reports`). Not part of the identity; wire name ``since``.
    """

    ts_ms: int
    cluster: str
    node: str
    xid: int
    pci_bus_id: str = ""
    gpu: int | None = None
    pid: int | None = None
    process: str = ""
    message: str = ""
    source: str = ""
    device: str = "gpu"
    since_ms: int | None = None

    @property
    def gpu_key(self) -> str:
        """The GPU's identity on its node: PCI bus id when known, else the index, else ``?``."""
        if self.pci_bus_id:
            return self.pci_bus_id
        return str(self.gpu) if self.gpu is not None else "?"

    @property
    def event_id(self) -> str:
        """Deterministic identity of the event: the same line read twice is one event.

        >>> XidEvent(ts_ms=0, cluster="c", node="n", xid=79).event_id
        '06dca9f3d1d29945'
        """
        key = f"{self.cluster}|{self.node}|{self.ts_ms}|{self.xid}|{self.gpu_key}|{self.message}"
        if self.device != "gpu":  # GPU events keep the ids they had before devices existed
            key += f"|{self.device}"
        return hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``xid_event.schema.json``, ``ts`` in ISO-8601.

        >>> XidEvent(ts_ms=1705314225000, cluster="c", node="n1", xid=79).to_dict()
        {'ts': '2024-01-15T10:23:45.000Z', 'cluster': 'c', 'node': 'n1', 'xid': 79}
        """
        out = self.to_wire()
        out["ts"] = format_ts(self.ts_ms)
        return out

    def to_wire(self) -> dict[str, Any]:
        """Return the wire form: the JSON form of :meth:`to_dict` with ``ts`` in epoch milliseconds.

        The schema allows both forms and :meth:`from_dict` reads both; the integer saves the
        decoder parsing a date, and the encoder formatting one.

        >>> XidEvent(ts_ms=1705314225000, cluster="c", node="n1", xid=79).to_wire()
        {'ts': 1705314225000, 'cluster': 'c', 'node': 'n1', 'xid': 79}
        """
        return _drop_empty(
            {
                "ts": self.ts_ms,
                "cluster": self.cluster,
                "node": self.node,
                "xid": self.xid,
                "pci_bus_id": self.pci_bus_id,
                "gpu": self.gpu,
                "pid": self.pid,
                "process": self.process,
                "message": self.message,
                "device": None if self.device == "gpu" else self.device,
                "since": self.since_ms,
            }
        )

    @classmethod
    def from_dict(cls, value: object, source: str = "") -> XidEvent:
        """Validate a decoded JSON object; raise :class:`InvalidRecord` naming the bad field.

        ``ts`` may be an ISO-8601 string or integer epoch milliseconds; an absent ``device`` is
        ``"gpu"``.

        >>> XidEvent.from_dict({"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n1", "xid": 79}).xid
        79
        """
        # The fast path (see "The fast path of from_dict" above); any doubt falls through.
        if type(value) is dict and cls is XidEvent:
            get = value.get
            ts = get("ts")
            cluster = get("cluster")
            node = get("node")
            xid = get("xid")
            pci = get("pci_bus_id")
            gpu = get("gpu")
            pid = get("pid")
            process = get("process")
            message = get("message")
            device = get("device")
            since = get("since")
            try:
                ts_ms = ts if type(ts) is int else parse_iso_ts(ts) if type(ts) is str else None
                pci_bus_id = (
                    ""
                    if pci is None or pci == ""
                    else normalize_pci_bus_id(pci)
                    if type(pci) is str
                    else None
                )
            except ValueError:
                ts_ms = pci_bus_id = None
            if (
                ts_ms is not None
                and TS_MIN_MS <= ts_ms < TS_MAX_MS
                and pci_bus_id is not None
                and type(cluster) is str
                and cluster.strip()
                and type(node) is str
                and node.strip()
                and type(xid) is int
                and 1 <= xid <= MAX_UINT16
                and (gpu is None or (type(gpu) is int and 0 <= gpu <= MAX_UINT16))
                and (pid is None or (type(pid) is int and 0 <= pid <= MAX_UINT32))
                and (process is None or type(process) is str)
                and (message is None or type(message) is str)
                and (device is None or device == "gpu" or device == "nvswitch")
                and (since is None or (type(since) is int and 0 <= since <= ts_ms))
            ):
                twin = _XID_TWIN()
                twin.ts_ms = ts_ms
                twin.cluster = cluster
                twin.node = node
                twin.xid = xid
                twin.pci_bus_id = pci_bus_id
                twin.gpu = gpu
                twin.pid = pid
                twin.process = process or ""
                twin.message = message or ""
                twin.source = source
                twin.device = device or "gpu"
                twin.since_ms = since
                twin.__class__ = XidEvent
                event: XidEvent = twin
                return event
        return cls._from_dict_checked(value, source)

    @classmethod
    def _from_dict_checked(cls, value: object, source: str) -> XidEvent:
        """The reference validator: every field through the helpers, in order; all rejections."""
        data = _mapping(value)
        xid = _int(data, "xid", minimum=1, maximum=MAX_UINT16)
        assert xid is not None
        device = data.get("device")
        if device is None:
            device = "gpu"
        elif device not in XID_DEVICES:
            raise InvalidRecord(f"field 'device' must be one of {', '.join(XID_DEVICES)}, got {device!r}")
        ts_ms = _ts(data, "ts") or 0
        since = _int(data, "since", required=False, maximum=TS_MAX_MS)
        if since is not None and since > ts_ms:
            raise InvalidRecord(f"field 'since' must not be after 'ts', got {since} > {ts_ms}")
        return cls(
            ts_ms=ts_ms,
            cluster=_str(data, "cluster"),
            node=_str(data, "node"),
            xid=xid,
            pci_bus_id=_pci(data),
            gpu=_int(data, "gpu", required=False, maximum=MAX_UINT16),
            pid=_int(data, "pid", required=False, maximum=MAX_UINT32),
            process=_str(data, "process", required=False),
            message=_str(data, "message", required=False),
            source=source,
            device=device,
            since_ms=since,
        )


_XID_TWIN: Final = _mutable_twin(XidEvent)
_XID_FIELDS: Final = tuple(f.name for f in fields(XidEvent))
#: The fields added after the first layout, at their defaults: what an older pickle lacks.
_XID_LATER_FIELDS: Final = {"device": "gpu", "since_ms": None}


def _xid_setstate(self: XidEvent, state: Sequence[Any]) -> None:
    """Unpickle an :class:`XidEvent`, also the layouts from before ``device`` (ten fields) and
    ``since_ms`` (eleven): worker checkpoints written by a previous version then load as events
    the driver logged instead of being refused.

    (A frozen slotted dataclass pickles as its field values in order; the generated
    ``__setstate__`` would leave a missing trailing field unset.)
    """
    for index, name in enumerate(_XID_FIELDS):
        object.__setattr__(self, name, state[index] if index < len(state) else _XID_LATER_FIELDS[name])


# Set after the class is made: Python 3.11's early releases (Debian's 3.11.2) let @dataclass(slots=True,
# frozen=True) replace a __setstate__ defined in the class body with the generated one.
XidEvent.__setstate__ = _xid_setstate  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# ECC samples

#: Counter names of an ECC sample, with the DCGM field that feeds each (SPEC section 2).
ECC_COUNTERS: Final[dict[str, int]] = {
    "sbe_volatile": 310,
    "dbe_volatile": 311,
    "sbe_aggregate": 312,
    "dbe_aggregate": 313,
    "retired_pages_sbe": 390,
    "retired_pages_dbe": 391,
    "retired_pages_pending": 392,
    "remapped_rows_correctable": 393,
    "remapped_rows_uncorrectable": 394,
    "remap_pending": 395,
    "remap_failure": 396,
}


#: DCGM's blank sentinels ("no value": not supported, not found, not permitted) are values at or
#: above these (``dcgm_structs.h``: ``DCGM_INT32_BLANK`` 0x7ffffff0 up to the int32 maximum, and
#: ``DCGM_FP64_BLANK`` 2**47, below every ``DCGM_INT64_BLANK``). An ECC counter there is not a count:
#: the schema refuses it, so no sentinel is ever stored whatever produced the record.
_INT32_BLANK: Final = 0x7FFFFFF0
_INT32_MAX: Final = 0x7FFFFFFF
_FP64_BLANK: Final = 0x800000000000


#: An ECC counter below this is never a DCGM blank: a decoder that checked each counter of a
#: sample is a known name (:data:`ECC_COUNTERS`) with ``0 <= value < ECC_PLAIN_COUNT_LIMIT`` may
#: say so to :meth:`EccSample.from_fields` (larger values, rare, take the full check).
ECC_PLAIN_COUNT_LIMIT: Final = _INT32_BLANK


def _is_blank(count: int) -> bool:
    return count >= _INT32_BLANK and (count <= _INT32_MAX or count >= _FP64_BLANK)


if TYPE_CHECKING:
    EccWireCounters = Mapping[str, int]
else:
    #: A sample's counters as a typed JSON decoder holds them (see EccSample), checked in C: a
    #: known name, a value no DCGM blank can be. Type checkers see the mapping every parser builds.
    EccWireCounters = dict[
        Literal[tuple(ECC_COUNTERS)], Annotated[int, msgspec.Meta(ge=0, lt=ECC_PLAIN_COUNT_LIMIT)]
    ]


class EccSample(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename={"ts_ms": "ts"}):
    """A snapshot of one GPU's ECC counters.

    The values are *counters* (or 0/1 flags for ``remap_pending`` and ``remap_failure``) as the
    exporter reports them; detectors work on deltas between consecutive samples of a GPU.
    A counter the source did not report is absent from ``counters``.

    A msgspec Struct, so that a typed JSON decoder (``msgspec.json.Decoder(EccSample)``) reads a
    wire line (``ts`` in epoch ms, the form the publishers write) straight into the sample, its
    types, ranges and counters checked in C; :func:`finish_decoded_ecc_samples` does the checks
    types cannot say. Nine records in ten a worker reads are samples: building each from a decoded
    line's fields took ~0.4 µs of the ~1.2 its decoding took. The type annotations are the wire
    checks; constructing a sample checks nothing (as a frozen dataclass's ``__init__`` did not):
    ``from_dict`` and ``from_fields`` validate. Keyword arguments only, ``counters`` required (the
    wire's ``counters`` is: a decoder must not default it). Not tracked by the garbage collector
    (``gc=False``): a sample refers to strings, ints and one dict of ints, never to anything that
    refers back.
    """

    ts_ms: Annotated[int, msgspec.Meta(ge=TS_MIN_MS, lt=TS_MAX_MS)]
    cluster: str
    node: str
    gpu: Annotated[int, msgspec.Meta(ge=0, le=MAX_UINT16)] | None = None
    pci_bus_id: str = ""
    counters: EccWireCounters
    source: str = ""

    @property
    def gpu_key(self) -> str:
        """The GPU's identity on its node: PCI bus id when known, else the index, else ``?``."""
        if self.pci_bus_id:
            return self.pci_bus_id
        return str(self.gpu) if self.gpu is not None else "?"

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``ecc_sample.schema.json``, ``ts`` in ISO-8601."""
        out = self.to_wire()
        out["ts"] = format_ts(self.ts_ms)
        return out

    def to_wire(self) -> dict[str, Any]:
        """Return the wire form: the JSON form of :meth:`to_dict` with ``ts`` in epoch milliseconds.

        >>> EccSample(ts_ms=0, cluster="c", node="n", gpu=0, counters={"dbe_volatile": 1}).to_wire()
        {'ts': 0, 'cluster': 'c', 'node': 'n', 'gpu': 0, 'counters': {'dbe_volatile': 1}}
        """
        out = _drop_empty(
            {
                "ts": self.ts_ms,
                "cluster": self.cluster,
                "node": self.node,
                "gpu": self.gpu,
                "pci_bus_id": self.pci_bus_id,
            }
        )
        out["counters"] = dict(self.counters)
        return out

    @classmethod
    def from_dict(cls, value: object, source: str = "") -> EccSample:
        """Validate a decoded JSON object; raise :class:`InvalidRecord` naming the bad field.

        ``ts`` may be an ISO-8601 string or integer epoch milliseconds.

        >>> EccSample.from_dict({"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0,
        ...                      "counters": {"dbe_volatile": 1}}).counters
        {'dbe_volatile': 1}
        """
        # The fast path (see "The fast path of from_dict" above); any doubt falls through.
        if type(value) is dict and cls is EccSample:
            get = value.get
            ts = get("ts")
            pci = get("pci_bus_id")
            try:
                ts_ms = ts if type(ts) is int else parse_iso_ts(ts) if type(ts) is str else None
                pci_bus_id = (
                    ""
                    if pci is None or pci == ""
                    else normalize_pci_bus_id(pci)
                    if type(pci) is str
                    else None
                )
            except ValueError:
                ts_ms = pci_bus_id = None
            if ts_ms is not None and pci_bus_id is not None:
                raw_counters = get("counters")
                sample = cls.from_fields(
                    ts_ms,
                    get("cluster"),
                    get("node"),
                    get("gpu"),
                    pci_bus_id,
                    raw_counters.copy() if type(raw_counters) is dict else raw_counters,
                    source,
                )
                if sample is not None:
                    return sample
        return cls._from_dict_checked(value, source)

    @staticmethod
    def from_fields(
        ts_ms: int,
        cluster: object,
        node: object,
        gpu: object,
        pci_bus_id: str,
        counters: object,
        source: str = "",
        counters_checked: bool = False,
    ) -> EccSample | None:
        """The sample of fields already decoded (``pci_bus_id`` canonical or ``""``), if each holds
        what :meth:`from_dict` accepts; None if any might not (then :meth:`from_dict` decides, and
        names the fault). ``counters`` becomes the sample's own: pass a dict no one else keeps.
        ``counters_checked``: the decoder has checked every counter is a known name with a value
        in ``[0, ECC_PLAIN_COUNT_LIMIT)`` (a typed JSON decoder does it in C; the per-counter loop
        was half of an ECC line's decoding).

        The worker's decoder (``stream.kafka.codec``) calls it with the fields of a typed JSON
        decoding, :meth:`from_dict` with those of a JSON object.

        >>> EccSample.from_fields(1704067200000, "c", "n", 0, "", {"sbe_volatile": 2}).counters
        {'sbe_volatile': 2}
        >>> EccSample.from_fields(1704067200000, "c", "n", 0, "", {"sbe_volatile": -2}) is None
        True
        """
        if not (
            TS_MIN_MS <= ts_ms < TS_MAX_MS
            and type(cluster) is str
            and cluster.strip()
            and type(node) is str
            and node.strip()
            and (gpu is None or (type(gpu) is int and 0 <= gpu <= MAX_UINT16))
            and (gpu is not None or pci_bus_id)
            and type(counters) is dict
            and (counters_checked or counters.keys() <= _ECC_COUNTER_NAMES)
        ):
            return None
        for count in () if counters_checked else counters.values():
            if (
                type(count) is not int
                or not 0 <= count <= MAX_UINT64
                or (count >= _INT32_BLANK and _is_blank(count))
            ):
                return None
        return _ecc_sample(ts_ms, cluster, node, gpu, pci_bus_id, counters, source)

    @classmethod
    def _from_dict_checked(cls, value: object, source: str) -> EccSample:
        """The reference validator: every field through the helpers, in order; all rejections."""
        data = _mapping(value)
        raw_counters = _require(data, "counters")
        if not isinstance(raw_counters, Mapping):
            raise InvalidRecord("field 'counters' must be an object of counter name to integer")
        counters: dict[str, int] = {}
        for name, count in raw_counters.items():
            if name not in ECC_COUNTERS:
                raise InvalidRecord(f"unknown ECC counter '{name}' (known: {', '.join(ECC_COUNTERS)})")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidRecord(f"ECC counter '{name}' must be a non-negative integer, got {count!r}")
            if count > MAX_UINT64:
                raise InvalidRecord(f"ECC counter '{name}' must be <= {MAX_UINT64}, got {count}")
            if _is_blank(count):
                raise InvalidRecord(
                    f"ECC counter '{name}' is {count}, a DCGM blank sentinel ('no value'), not a count: "
                    "leave the counter out"
                )
            counters[name] = count
        sample = cls(
            ts_ms=_ts(data, "ts") or 0,
            cluster=_str(data, "cluster"),
            node=_str(data, "node"),
            gpu=_int(data, "gpu", required=False, maximum=MAX_UINT16),
            pci_bus_id=_pci(data),
            counters=counters,
            source=source,
        )
        if sample.gpu is None and not sample.pci_bus_id:
            raise InvalidRecord("an ECC sample needs 'gpu' or 'pci_bus_id' to name its GPU")
        return sample


_ECC_COUNTER_NAMES: Final = frozenset(ECC_COUNTERS)


def _ecc_sample(
    ts_ms: int,
    cluster: str,
    node: str,
    gpu: int | None,
    pci_bus_id: str,
    counters: Mapping[str, int],
    source: str,
) -> EccSample:
    """An :class:`EccSample` of fields known to be valid. Pickles made before the sample was a
    Struct name this function to rebuild a sample: a checkpoint of that time still loads."""
    return EccSample(
        ts_ms=ts_ms,
        cluster=cluster,
        node=node,
        gpu=gpu,
        pci_bus_id=pci_bus_id,
        counters=counters,
        source=source,
    )


def finish_decoded_ecc_samples(
    samples: list[EccSample], source_prefix: str, first_number: int | None
) -> tuple[list[EccSample | None], int]:
    """Finish the samples a typed JSON decoder read from a message's lines: what
    :meth:`EccSample.from_fields` checks beyond the types (a cluster and a node that are not
    blank, a GPU named by its index or its bus id, a bus id that parses, made canonical), and each
    sample's ``source``: ``source_prefix`` followed by its line's number, counted from
    ``first_number`` (None: ``source_prefix`` alone, for one line decoded on its own). A sample
    that fails becomes None (the full validator then decides that line, and names the fault); also
    returns how many are None.

    The samples are the decoder's, seen by no one else yet: their fields are set in place.
    ``tests/unit/schemas/test_records_fast.py`` holds this and ``from_dict`` to the same answers.

    >>> import msgspec
    >>> good = b'{"ts": 1704067200000, "cluster": "c", "node": "n", "gpu": 0, "counters": {}}'
    >>> decoded = msgspec.json.Decoder(EccSample).decode_lines(good + b"\\n" + good.replace(b'"n"', b'" "'))
    >>> samples, refused = finish_decoded_ecc_samples(decoded, "ecc/0:line ", 1)
    >>> samples[0].source, samples[1], refused
    ('ecc/0:line 1', None, 1)
    """
    finished: list[EccSample | None] = list(samples)
    refused = 0
    set_field = force_setattr
    for index, sample in enumerate(samples):
        pci = sample.pci_bus_id
        try:
            canonical = normalize_pci_bus_id(pci) if pci else ""
        except ValueError:
            canonical = ""
            pci = "-"  # refused below: a bus id that does not parse
        if not (
            sample.cluster.strip()
            and sample.node.strip()
            and (canonical or (not pci and sample.gpu is not None))
        ):
            finished[index] = None
            refused += 1
            continue
        if canonical != pci:
            set_field(sample, "pci_bus_id", canonical)
        set_field(
            sample,
            "source",
            source_prefix if first_number is None else f"{source_prefix}{first_number + index}",
        )
    return finished, refused


# ---------------------------------------------------------------------------------------------
# Job state changes


class JobState(StrEnum):
    """Scheduler job states (Slurm's names; other schedulers map onto them)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"

    @property
    def is_terminal(self) -> bool:
        """True for states that end a run of the job (its exposure is then known)."""
        return self not in (JobState.PENDING, JobState.RUNNING)

    @property
    def may_be_hardware_failure(self) -> bool:
        """True for the end states that attribution examines (SPEC 4.4)."""
        return self in (JobState.FAILED, JobState.NODE_FAIL)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job entered a state.

    ``ts_ms`` is when it entered the state: the start time for RUNNING, the end time for a
    terminal state. ``start_ms``/``end_ms`` carry the run's bounds when known. ``partition`` is
    the Slurm partition (empty when the scheduler did not say); it comes last, after ``source``,
    because it was added later: positional construction and older pickles keep their meaning.
    """

    ts_ms: int
    cluster: str
    job_id: str
    state: JobState
    nodes: tuple[str, ...] = ()
    gpus: int = 0
    start_ms: int | None = None
    end_ms: int | None = None
    exit_code: str = ""
    name: str = ""
    user: str = ""
    source: str = ""
    partition: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``job_event.schema.json``, times in ISO-8601."""
        out = self.to_wire()
        out["ts"] = format_ts(self.ts_ms)
        if self.start_ms is not None:
            out["start"] = format_ts(self.start_ms)
        if self.end_ms is not None:
            out["end"] = format_ts(self.end_ms)
        return out

    def to_wire(self) -> dict[str, Any]:
        """Return the wire form: the JSON form of :meth:`to_dict` with times in epoch milliseconds.

        ``ts``, ``start`` and ``end`` are integers; an unknown ``start`` or ``end`` is left out.

        >>> JobEvent(ts_ms=9, cluster="c", job_id="7", state=JobState.FAILED, end_ms=9).to_wire()
        {'ts': 9, 'cluster': 'c', 'job_id': '7', 'state': 'FAILED', 'gpus': 0, 'end': 9, 'nodes': []}
        """
        out = _drop_empty(
            {
                "ts": self.ts_ms,
                "cluster": self.cluster,
                "job_id": self.job_id,
                "state": self.state.value,
                "gpus": self.gpus,
                "start": self.start_ms,
                "end": self.end_ms,
                "exit_code": self.exit_code,
                "name": self.name,
                "user": self.user,
                "partition": self.partition,
            }
        )
        out["nodes"] = list(self.nodes)
        return out

    @classmethod
    def from_dict(cls, value: object, source: str = "") -> JobEvent:
        """Validate a decoded JSON object; raise :class:`InvalidRecord` naming the bad field.

        ``ts``, ``start`` and ``end`` may be ISO-8601 strings or integer epoch milliseconds.

        >>> JobEvent.from_dict({"ts": 1704067200000, "cluster": "c", "job_id": "7", "state": "FAILED",
        ...                     "nodes": ["n1"], "gpus": 8}).state.may_be_hardware_failure
        True
        """
        # The fast path (see "The fast path of from_dict" above); any doubt falls through.
        if type(value) is dict and cls is JobEvent:
            get = value.get
            nodes = get("nodes", _MISSING)
            event = cls.from_fields(
                get("ts"),
                get("cluster"),
                get("job_id"),
                get("state"),
                [] if nodes is _MISSING else nodes,  # absent is no nodes; null is not a list
                get("gpus"),
                get("start"),
                get("end"),
                get("exit_code"),
                get("name"),
                get("user"),
                get("partition"),
                source,
            )
            if event is not None:
                return event
        return cls._from_dict_checked(value, source)

    @staticmethod
    def from_fields(
        ts: object,
        cluster: object,
        job_id: object,
        state_name: object,
        nodes: object,
        gpus: object,
        start: object,
        end: object,
        exit_code: object,
        name: object,
        user: object,
        partition: object,
        source: str = "",
    ) -> JobEvent | None:
        """The event of fields already decoded (times as epoch ms or ISO-8601 strings, ``start``
        and ``end`` also None), if each holds what :meth:`from_dict` accepts; None if any might
        not (then :meth:`from_dict` decides, and names the fault). ``from_dict`` calls it with a
        JSON object's fields, the worker's decoder (``stream.kafka.codec``) with those of a typed
        JSON decoding.

        >>> JobEvent.from_fields(1704067200000, "c", 7, "FAILED", ["n1"], 8, None, None, None, None,
        ...                      None, None).job_id
        '7'
        >>> JobEvent.from_fields(1704067200000, "c", "7", "FAILED", [""], 8, None, None, None, None,
        ...                      None, None) is None
        True
        """
        try:
            ts_ms = _optional_ts(ts)
            start_ms = _optional_ts(start)
            end_ms = _optional_ts(end)
        except ValueError:  # a bad time: the reference validator says which and why
            return None
        if not (
            ts_ms is not None
            and TS_MIN_MS <= ts_ms < TS_MAX_MS
            and (start_ms is None or TS_MIN_MS <= start_ms < TS_MAX_MS)
            and (end_ms is None or TS_MIN_MS <= end_ms < TS_MAX_MS)
            and type(cluster) is str
            and cluster.strip()
            and ((type(job_id) is str and job_id.strip()) or type(job_id) is int)
            and type(state_name) is str
            and state_name in _JOB_STATES
            and type(nodes) is list
            and (gpus is None or (type(gpus) is int and 0 <= gpus <= MAX_UINT32))
            and (exit_code is None or type(exit_code) is str)
            and (name is None or type(name) is str)
            and (user is None or type(user) is str)
            and (partition is None or type(partition) is str)
        ):
            return None
        for node in nodes:
            if type(node) is not str or not node:
                return None
        twin = _JOB_TWIN()
        twin.ts_ms = ts_ms
        twin.cluster = cluster
        twin.job_id = job_id if type(job_id) is str else str(job_id)
        twin.state = _JOB_STATES[state_name]
        twin.nodes = tuple(nodes)
        twin.gpus = gpus or 0
        twin.start_ms = start_ms
        twin.end_ms = end_ms
        twin.exit_code = exit_code or ""
        twin.name = name or ""
        twin.user = user or ""
        twin.source = source
        twin.partition = partition or ""
        twin.__class__ = JobEvent
        event: JobEvent = twin
        return event

    @classmethod
    def _from_dict_checked(cls, value: object, source: str) -> JobEvent:
        """The reference validator: every field through the helpers, in order; all rejections."""
        data = _mapping(value)
        state_name = _str(data, "state")
        try:
            state = JobState(state_name.upper())
        except ValueError:
            raise InvalidRecord(
                f"field 'state': unknown job state {state_name!r} (known: {', '.join(JobState)})"
            ) from None
        nodes = data.get("nodes", [])
        if not isinstance(nodes, list) or not all(isinstance(node, str) and node for node in nodes):
            raise InvalidRecord("field 'nodes' must be a list of node names")
        job_id = data.get("job_id")
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            job_id = str(job_id)
        return cls(
            ts_ms=_ts(data, "ts") or 0,
            cluster=_str(data, "cluster"),
            job_id=_str({"job_id": job_id}, "job_id"),
            state=state,
            nodes=tuple(nodes),
            gpus=_int(data, "gpus", required=False, maximum=MAX_UINT32) or 0,
            start_ms=_ts(data, "start", required=False),
            end_ms=_ts(data, "end", required=False),
            exit_code=_str(data, "exit_code", required=False),
            name=_str(data, "name", required=False),
            user=_str(data, "user", required=False),
            source=source,
            partition=_str(data, "partition", required=False),
        )


_JOB_TWIN: Final = _mutable_twin(JobEvent)
_JOB_FIELDS: Final = tuple(f.name for f in fields(JobEvent))


def _job_setstate(self: JobEvent, state: Sequence[Any]) -> None:
    """Unpickle a :class:`JobEvent`, also the twelve-field layout from before ``partition``: worker
    checkpoints written by the previous version then load with no partition (see ``_xid_setstate``).
    """
    for name, value in zip(_JOB_FIELDS, (*state, "")[: len(_JOB_FIELDS)], strict=True):
        object.__setattr__(self, name, value)


JobEvent.__setstate__ = _job_setstate  # type: ignore[attr-defined]
#: The spellings of a state the fast path takes: each state's name and its lower case (the
#: schema's enum). Others (``Failed``) the reference validator reads, through ``str.upper``.
_JOB_STATES: Final[dict[str, JobState]] = {
    **{state.value: state for state in JobState},
    **{state.value.lower(): state for state in JobState},
}
#: ``get`` default telling an absent ``nodes`` (no nodes) from an explicit ``null`` (rejected).
_MISSING: Final = object()


def _optional_ts(value: object) -> int | None:
    """An optional time for the fast path: None, epoch ms, or an ISO-8601 string parsed.

    Raises ValueError for a string that is not a time and for any other type; the caller then
    leaves the document to the reference validator, which says what is wrong.
    """
    if value is None or type(value) is int:
        return value
    if type(value) is str:
        return parse_iso_ts(value)
    raise ValueError("not a timestamp")


#: Any input record: what parsers yield, topics carry and the detection core processes.
Record = XidEvent | EccSample | JobEvent

#: The short name of each record type, as dead letters and counters name it.
RECORD_KIND: dict[type[Record], str] = {XidEvent: "xid", EccSample: "ecc", JobEvent: "job"}
