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
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from schemas.timeutil import format_ts, parse_ts

__all__ = [
    "ECC_COUNTERS",
    "RECORD_KIND",
    "EccSample",
    "InvalidRecord",
    "JobEvent",
    "JobState",
    "Record",
    "XidEvent",
    "normalize_pci_bus_id",
]


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
        super().__init__(reason)
        self.reason = reason
        self.raw = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
        self.source = source
        self.location = location


_PCI_RE: Final = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?$"
)


def normalize_pci_bus_id(value: str) -> str:
    """Return the canonical ``dddd:bb:dd`` form of a PCI bus id, as the kernel log prints it.

    DCGM prints ``00000000:3B:00.0`` and the kernel ``PCI:0000:3b:00``; both name the same GPU,
    so detectors key GPUs by this canonical form.

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


def _int(data: Mapping[str, Any], name: str, *, required: bool = True, minimum: int | None = 0) -> int | None:
    value = _require(data, name) if required else data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRecord(f"field '{name}' must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidRecord(f"field '{name}' must be >= {minimum}, got {value}")
    return value


def _ts(data: Mapping[str, Any], name: str, *, required: bool = True) -> int | None:
    value = _require(data, name) if required else data.get(name)
    if value is None:
        return None
    try:
        return parse_ts(value)
    except ValueError as exc:
        raise InvalidRecord(f"field '{name}': {exc}") from None


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
# XID events


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
        return hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``xid_event.schema.json``."""
        return _drop_empty(
            {
                "ts": format_ts(self.ts_ms),
                "cluster": self.cluster,
                "node": self.node,
                "xid": self.xid,
                "pci_bus_id": self.pci_bus_id,
                "gpu": self.gpu,
                "pid": self.pid,
                "process": self.process,
                "message": self.message,
            }
        )

    @classmethod
    def from_dict(cls, value: object, source: str = "") -> XidEvent:
        """Validate a decoded JSON object; raise :class:`InvalidRecord` naming the bad field.

        >>> XidEvent.from_dict({"ts": "2024-01-15T10:00:00Z", "cluster": "c", "node": "n1", "xid": 79}).xid
        79
        """
        data = _mapping(value)
        xid = _int(data, "xid", minimum=1)
        assert xid is not None
        return cls(
            ts_ms=_ts(data, "ts") or 0,
            cluster=_str(data, "cluster"),
            node=_str(data, "node"),
            xid=xid,
            pci_bus_id=_pci(data),
            gpu=_int(data, "gpu", required=False),
            pid=_int(data, "pid", required=False),
            process=_str(data, "process", required=False),
            message=_str(data, "message", required=False),
            source=source,
        )


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


@dataclass(frozen=True, slots=True)
class EccSample:
    """A snapshot of one GPU's ECC counters.

    The values are *counters* (or 0/1 flags for ``remap_pending`` and ``remap_failure``) as the
    exporter reports them; detectors work on deltas between consecutive samples of a GPU.
    A counter the source did not report is absent from ``counters``.
    """

    ts_ms: int
    cluster: str
    node: str
    gpu: int | None = None
    pci_bus_id: str = ""
    counters: Mapping[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def gpu_key(self) -> str:
        """The GPU's identity on its node: PCI bus id when known, else the index, else ``?``."""
        if self.pci_bus_id:
            return self.pci_bus_id
        return str(self.gpu) if self.gpu is not None else "?"

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``ecc_sample.schema.json``."""
        out = _drop_empty(
            {
                "ts": format_ts(self.ts_ms),
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

        >>> EccSample.from_dict({"ts": 0, "cluster": "c", "node": "n", "gpu": 0,
        ...                      "counters": {"dbe_volatile": 1}}).counters
        {'dbe_volatile': 1}
        """
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
            counters[name] = count
        sample = cls(
            ts_ms=_ts(data, "ts") or 0,
            cluster=_str(data, "cluster"),
            node=_str(data, "node"),
            gpu=_int(data, "gpu", required=False),
            pci_bus_id=_pci(data),
            counters=counters,
            source=source,
        )
        if sample.gpu is None and not sample.pci_bus_id:
            raise InvalidRecord("an ECC sample needs 'gpu' or 'pci_bus_id' to name its GPU")
        return sample


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
    terminal state. ``start_ms``/``end_ms`` carry the run's bounds when known.
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

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form described by ``job_event.schema.json``."""
        out = _drop_empty(
            {
                "ts": format_ts(self.ts_ms),
                "cluster": self.cluster,
                "job_id": self.job_id,
                "state": self.state.value,
                "gpus": self.gpus,
                "start": format_ts(self.start_ms) if self.start_ms is not None else None,
                "end": format_ts(self.end_ms) if self.end_ms is not None else None,
                "exit_code": self.exit_code,
                "name": self.name,
                "user": self.user,
            }
        )
        out["nodes"] = list(self.nodes)
        return out

    @classmethod
    def from_dict(cls, value: object, source: str = "") -> JobEvent:
        """Validate a decoded JSON object; raise :class:`InvalidRecord` naming the bad field.

        >>> JobEvent.from_dict({"ts": 0, "cluster": "c", "job_id": "7", "state": "FAILED",
        ...                     "nodes": ["n1"], "gpus": 8}).state.may_be_hardware_failure
        True
        """
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
            gpus=_int(data, "gpus", required=False) or 0,
            start_ms=_ts(data, "start", required=False),
            end_ms=_ts(data, "end", required=False),
            exit_code=_str(data, "exit_code", required=False),
            name=_str(data, "name", required=False),
            user=_str(data, "user", required=False),
            source=source,
        )


#: Any input record: what parsers yield, topics carry and the detection core processes.
Record = XidEvent | EccSample | JobEvent

#: The short name of each record type, as dead letters and counters name it.
RECORD_KIND: dict[type[Record], str] = {XidEvent: "xid", EccSample: "ecc", JobEvent: "job"}
