"""Ground truth of a simulation (``truth.json``): what the detectors should find.

The file holds the configuration, the span, the true failure rate and its parts (exposure,
hardware-attributed job failures), every planted fault, every job that did not complete, the
XID counts of ``kernel.log``, the lemon nodes, the maintenance reboots and the crash-looping
users (``crash_loop_users``: users whose jobs crash wherever they run, no node's fault; see
:mod:`stream.simulator.planted.crashloop`; ``crash_loop_nodes``, only when some are: those of them
whose every job runs on one node, user -> node). Times are ISO 8601 UTC strings
(:func:`schemas.timeutil.format_ts`).

The ``faults`` list, ordered by onset then ``fault_id``, holds every kind (see
:mod:`stream.simulator.planted`); each fault has ``fault_id``, ``kind``, ``node``, ``onset``,
``gpu``, ``pci_bus_id``, ``xid``, ``xids``, ``job_id`` and ``repaired``, and kind-specific keys
(kept in :attr:`FaultTruth.details`; ``end``, ``failure`` and ``gpus`` are also
:attr:`FaultTruth.end_ms`, :attr:`FaultTruth.failure_ms` and :attr:`FaultTruth.gpus`):

================  ============  =================================================================
kind              fault_id      onset; kind-specific keys
================  ============  =================================================================
critical_hw       ``hw-N``      first XID line; ``template``, ``killed_job``, ``gpu_replaced``,
                                ``source`` (``base``, ``lemon``, ``ecc_degradation`` or ``trace``),
                                ``degradation_id`` (the ``deg-N`` it ends, else ``null``); from a
                                trace also ``trace_fault`` (its ``trace-N``), ``trace_level``,
                                ``trace_class``, ``trace_desc`` and ``trace_end``
ecc_degradation   ``deg-N``     first DCGM scrape where the SBE counter rose (``xid`` null);
                                ``failure`` (the uncorrectable error, ``null`` if none within the
                                span), ``critical_fault_id``, ``failure_xid``, ``end`` (failure
                                or span end), ``gpus``, ``started``, ``sbe_errors``,
                                ``sbe_rate_per_day`` ([initial, final])
xid_storm         ``storm-N``   a faulty GPU's storm (hardware XIDs): first line; ``end`` (last
                                line), ``gpus``, ``lines``, ``killed_job``, ``user`` (``job_id``
                                and ``user``: the job it ran under)
job_xid_storm     ``storm-N``   a job's storm (its own application XIDs): the same keys
nvlink_flapping   ``flap-N``    first XID 144 line; ``end`` (last line), ``gpus`` in the order
                                they joined (``gpu`` is the first), ``lines``
lemon_node        ``lemon-N``   the span's start (``gpu``, ``xid`` null); ``end`` (span end),
                                ``critical_faults`` on the node, ``fault_rate_multiplier`` (a
                                trace's lemon: its hardware faults over the fleet's mean, and
                                ``trace_hardware_faults``)
unobservable      ``trace-N``   a trace's fault that no input shows (``gpu``, ``xid`` null):
                                ``end`` (the trace's fault end), ``trace_fault``, ``trace_level``,
                                ``trace_class``, ``trace_desc`` (:mod:`stream.simulator.trace`)
================  ============  =================================================================

Keys this module does not know are kept in ``details`` too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from schemas.records import JobState
from schemas.timeutil import format_ts, parse_ts
from stream.simulator.config import SimulationConfig, pci_bus_id
from stream.simulator.history import ClusterHistory
from stream.simulator.planted import (
    FAULT_KIND_ECC_DEGRADATION,
    FAULT_KIND_LEMON_NODE,
    FAULT_KIND_NVLINK_FLAPPING,
    NVLINK_FLAP_XID,
)
from stream.simulator.trace import FAULT_KIND_UNOBSERVABLE, TraceFault

__all__ = ["FaultTruth", "JobFailureTruth", "MaintenanceTruth", "Truth", "build_truth"]


# Keys of a fault's JSON form that are fields of FaultTruth; any other key is a detail.
_FAULT_KEYS = frozenset(
    (
        "fault_id",
        "kind",
        "node",
        "gpu",
        "pci_bus_id",
        "xid",
        "xids",
        "onset",
        "job_id",
        "repaired",
    )
)


def _opt_ts(value: object) -> int | None:
    return None if value is None else parse_ts(value)


@dataclass(frozen=True, slots=True)
class FaultTruth:
    """One planted fault.

    Attributes
    ----------
    fault_id
        Stable id within the run (``hw-000001`` ... in onset order for ``critical_hw``; ``deg-``,
        ``storm-``, ``flap-``, ``lemon-`` for the other kinds).
    kind
        ``critical_hw`` for a hardware fault that needs a drain/reset/RMA at once;
        ``ecc_degradation``, ``xid_storm`` (a GPU's), ``job_xid_storm`` (a job's crash loop, no
        fault), ``nvlink_flapping`` or ``lemon_node``.
    node
        Node name.
    onset_ms
        Time of the first evidence (the first XID line, or for a degradation the first DCGM
        scrape that shows it; kernel lines carry microseconds whose sub-millisecond part is
        below 400, so rounding to ms gives exactly this).
    gpu, pci_bus_id
        The GPU (the first one, for a flapping link), when the fault has one.
    xid
        The XID at the onset, if any; ``xids`` lists every XID the fault logged.
    job_id
        Job running on the node at the onset, if any (a critical fault kills it unless it is
        already dying; a storm may kill it).
    repaired_ms
        When the node returned to service and rebooted; ``None`` if after the span.
    details
        Kind-specific extras (``template``, ``killed_job``, ``end``, ``failure``, ``gpus``,
        ``critical_fault_id`` ...), as in the JSON form; :attr:`end_ms`, :attr:`failure_ms` and
        :attr:`gpus` read the common ones.
    """

    fault_id: str
    kind: str
    node: str
    onset_ms: int
    gpu: int | None = None
    pci_bus_id: str = ""
    xid: int | None = None
    xids: tuple[int, ...] = ()
    job_id: str | None = None
    repaired_ms: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def end_ms(self) -> int | None:
        """Last evidence (storm, flapping link), failure or span end (degradation), else ``None``."""
        return _opt_ts(self.details.get("end"))

    @property
    def failure_ms(self) -> int | None:
        """Uncorrectable error that ended a degradation; ``None`` if none (or another kind)."""
        return _opt_ts(self.details.get("failure"))

    @property
    def gpus(self) -> tuple[int, ...]:
        """Every GPU involved (in the order they joined, for a flapping link)."""
        listed = self.details.get("gpus")
        if listed is not None:
            return tuple(int(gpu) for gpu in listed)
        return () if self.gpu is None else (self.gpu,)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (times as ISO strings, details merged in)."""
        out: dict[str, Any] = {
            "fault_id": self.fault_id,
            "kind": self.kind,
            "node": self.node,
            "gpu": self.gpu,
            "pci_bus_id": self.pci_bus_id,
            "xid": self.xid,
            "xids": list(self.xids),
            "onset": format_ts(self.onset_ms),
            "job_id": self.job_id,
            "repaired": None if self.repaired_ms is None else format_ts(self.repaired_ms),
        }
        out.update(self.details)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultTruth:
        """Inverse of :meth:`to_dict`; unknown keys go to ``details``."""
        return cls(
            fault_id=str(data["fault_id"]),
            kind=str(data["kind"]),
            node=str(data["node"]),
            onset_ms=parse_ts(data["onset"]),
            gpu=data.get("gpu"),
            pci_bus_id=data.get("pci_bus_id") or "",
            xid=data.get("xid"),
            xids=tuple(data.get("xids") or ()),
            job_id=data.get("job_id"),
            repaired_ms=_opt_ts(data.get("repaired")),
            details={key: value for key, value in data.items() if key not in _FAULT_KEYS},
        )


@dataclass(frozen=True, slots=True)
class JobFailureTruth:
    """A job that ended within the span in a state other than COMPLETED.

    ``hardware`` is True when a planted fault killed it (``fault_id`` names the fault); only
    those count as failures in the failure rate.
    """

    job_id: str
    state: JobState
    end_ms: int
    hardware: bool
    nodes: tuple[str, ...]
    gpus: int
    fault_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "end": format_ts(self.end_ms),
            "hardware": self.hardware,
            "nodes": list(self.nodes),
            "gpus": self.gpus,
            "fault_id": self.fault_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobFailureTruth:
        """Inverse of :meth:`to_dict`."""
        return cls(
            job_id=str(data["job_id"]),
            state=JobState(data["state"]),
            end_ms=parse_ts(data["end"]),
            hardware=bool(data["hardware"]),
            nodes=tuple(data["nodes"]),
            gpus=int(data["gpus"]),
            fault_id=data.get("fault_id"),
        )


@dataclass(frozen=True, slots=True)
class MaintenanceTruth:
    """A maintenance reboot of a node without faults: benign, its volatile counters drop to 0."""

    node: str
    reboot_ms: int

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"node": self.node, "reboot": format_ts(self.reboot_ms)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MaintenanceTruth:
        """Inverse of :meth:`to_dict`."""
        return cls(node=str(data["node"]), reboot_ms=parse_ts(data["reboot"]))


@dataclass(frozen=True, slots=True)
class Truth:
    """Ground truth of one simulation run.

    Attributes
    ----------
    true_rf_per_1000_node_days
        ``1000 x hardware_failures / exposure_node_days``.
    exposure_node_days
        Node-days of all runs within the span, each ending at its end or at the span's end.
    hardware_failures
        Jobs killed by a planted fault that ended within the span.
    jobs
        Jobs in ``sacct.txt`` (all that started).
    jobs_failed
        Jobs that ended in a state other than COMPLETED (``len(job_failures)``).
    utilization
        Exposure as a share of all node-time of the span.
    xid_counts
        XID lines in ``kernel.log`` per code.
    lemon_nodes
        Names of the lemon nodes (also ``lemon_node`` faults); the others are healthy.
    maintenance
        Maintenance reboots, in time order.
    crash_loop_users
        Users whose jobs crash wherever they run (not a fault of any node): an incident should
        be addressed to each, and no node judged for their failures.
    crash_loop_nodes
        Those of them whose every job runs on one node: user -> node (the issue's case: one
        user's crash loop on the same node day after day).
    """

    config: SimulationConfig
    span_start_ms: int
    span_end_ms: int
    true_rf_per_1000_node_days: float
    exposure_node_days: float
    hardware_failures: int
    jobs: int
    jobs_failed: int
    utilization: float
    faults: tuple[FaultTruth, ...]
    job_failures: tuple[JobFailureTruth, ...]
    xid_counts: Mapping[int, int]
    lemon_nodes: tuple[str, ...] = ()
    maintenance: tuple[MaintenanceTruth, ...] = ()
    crash_loop_users: tuple[str, ...] = ()
    crash_loop_nodes: Mapping[str, str] = field(default_factory=dict)

    @property
    def healthy_nodes(self) -> tuple[str, ...]:
        """Names of the nodes that are not lemons."""
        lemons = set(self.lemon_nodes)
        return tuple(name for name in self.config.node_names if name not in lemons)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form of ``truth.json`` (``config.fault_trace`` only when set)."""
        config = dataclasses.asdict(self.config)
        if not config["fault_trace"]:
            del config["fault_trace"]
        return {
            "config": config,
            "span": {"start": format_ts(self.span_start_ms), "end": format_ts(self.span_end_ms)},
            "true_rf_per_1000_node_days": self.true_rf_per_1000_node_days,
            "exposure_node_days": self.exposure_node_days,
            "hardware_failures": self.hardware_failures,
            "jobs": self.jobs,
            "jobs_failed": self.jobs_failed,
            "utilization": self.utilization,
            "faults": [fault.to_dict() for fault in self.faults],
            "job_failures": [failure.to_dict() for failure in self.job_failures],
            "xid_counts": {str(code): count for code, count in sorted(self.xid_counts.items())},
            "lemon_nodes": list(self.lemon_nodes),
            "maintenance": [item.to_dict() for item in self.maintenance],
            "crash_loop_users": list(self.crash_loop_users),
            **({"crash_loop_nodes": dict(self.crash_loop_nodes)} if self.crash_loop_nodes else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Truth:
        """Inverse of :meth:`to_dict`; configuration keys this version does not know are ignored."""
        known = {item.name for item in dataclasses.fields(SimulationConfig)}
        config = SimulationConfig(**{key: value for key, value in data["config"].items() if key in known})
        return cls(
            config=config,
            span_start_ms=parse_ts(data["span"]["start"]),
            span_end_ms=parse_ts(data["span"]["end"]),
            true_rf_per_1000_node_days=float(data["true_rf_per_1000_node_days"]),
            exposure_node_days=float(data["exposure_node_days"]),
            hardware_failures=int(data["hardware_failures"]),
            jobs=int(data["jobs"]),
            jobs_failed=int(data["jobs_failed"]),
            utilization=float(data.get("utilization", 0.0)),
            faults=tuple(FaultTruth.from_dict(fault) for fault in data["faults"]),
            job_failures=tuple(JobFailureTruth.from_dict(failure) for failure in data["job_failures"]),
            xid_counts={int(code): int(count) for code, count in data["xid_counts"].items()},
            lemon_nodes=tuple(data.get("lemon_nodes") or ()),
            maintenance=tuple(MaintenanceTruth.from_dict(item) for item in data.get("maintenance") or ()),
            crash_loop_users=tuple(data.get("crash_loop_users") or ()),
            crash_loop_nodes=dict(data.get("crash_loop_nodes") or {}),
        )

    def write(self, path: Path) -> None:
        """Write ``truth.json`` (indented, keys in a fixed order: byte-identical for equal truths)."""
        path.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")

    @classmethod
    def load(cls, path: Path) -> Truth:
        """Read a ``truth.json`` written by :meth:`write`."""
        return cls.from_dict(orjson.loads(path.read_bytes()))


def _fault_id(index: int) -> str:
    return f"hw-{index + 1:06d}"


def _planted_id(prefix: str, index: int) -> str:
    return f"{prefix}-{index + 1:06d}"


def _critical_faults(history: ClusterHistory) -> list[FaultTruth]:
    config = history.config
    names = config.node_names
    job_ids = {job.index: job.job_id for job in history.jobs}
    traced = {fault.index: fault for fault in history.trace.faults} if history.trace is not None else {}
    return [
        FaultTruth(
            fault_id=_fault_id(fault.index),
            kind=fault.kind,
            node=names[fault.node],
            onset_ms=fault.onset_ms,
            gpu=fault.gpu,
            pci_bus_id=pci_bus_id(fault.gpu),
            xid=fault.xids[0],
            xids=fault.xids,
            job_id=job_ids[fault.job_index] if fault.job_index is not None else None,
            repaired_ms=fault.repaired_ms if fault.repaired_ms <= config.end_ms else None,
            details={
                "template": fault.template,
                "killed_job": fault.killed_job,
                "gpu_replaced": fault.gpu_replaced,
                "source": fault.source,
                "degradation_id": (
                    _planted_id("deg", fault.degradation) if fault.degradation is not None else None
                ),
                **(_traced(traced[fault.trace]) if fault.trace is not None else {}),
            },
        )
        for fault in history.faults
    ]


def _traced(fault: TraceFault) -> dict[str, Any]:
    """A trace fault's own keys in the truth: its id, level, class and description, and end."""
    return {**fault.details(), "trace_end": format_ts(fault.end_ms)}


def _unobservable_faults(history: ClusterHistory) -> list[FaultTruth]:
    """A trace's faults that no input shows: in the truth, apart from the critical faults."""
    if history.trace is None:
        return []
    return [
        FaultTruth(
            fault_id=fault.fault_id,
            kind=FAULT_KIND_UNOBSERVABLE,
            node=history.config.node_names[fault.node],
            onset_ms=fault.onset_ms,
            details={"end": format_ts(fault.end_ms), **fault.details()},
        )
        for fault in history.trace.unobservable
    ]


def _planted_faults(history: ClusterHistory) -> list[FaultTruth]:
    """The degradations, storms, flapping links and lemon nodes."""
    config = history.config
    names = config.node_names
    job_ids = {job.index: job.job_id for job in history.jobs}
    out: list[FaultTruth] = []
    for item in history.degradations:
        plan = item.plan
        failure = history.faults[item.fault_index] if item.fault_index is not None else None
        out.append(
            FaultTruth(
                fault_id=_planted_id("deg", plan.index),
                kind=FAULT_KIND_ECC_DEGRADATION,
                node=names[plan.node],
                onset_ms=item.onset_ms,
                gpu=plan.gpu,
                pci_bus_id=pci_bus_id(plan.gpu),
                details={
                    "end": format_ts(item.failure_ms if item.failure_ms is not None else config.end_ms),
                    "failure": None if item.failure_ms is None else format_ts(item.failure_ms),
                    "gpus": [plan.gpu],
                    "critical_fault_id": _fault_id(failure.index) if failure is not None else None,
                    "failure_xid": failure.xids[0] if failure is not None else None,
                    "started": format_ts(plan.start_ms),
                    "sbe_errors": item.sbe_errors,
                    "sbe_rate_per_day": [round(plan.initial_rate, 3), round(plan.final_rate, 3)],
                    "shape": plan.shape,
                },
            )
        )
    users = {job.index: job.user for job in history.jobs}
    for storm in history.storms:
        out.append(
            FaultTruth(
                fault_id=_planted_id("storm", storm.index),
                kind=storm.kind,
                node=names[storm.node],
                onset_ms=storm.start_ms,
                gpu=storm.gpu,
                pci_bus_id=pci_bus_id(storm.gpu),
                xid=storm.xid,
                xids=(storm.xid,),
                job_id=job_ids[storm.job_index],
                details={
                    "end": format_ts(storm.end_ms),
                    "gpus": [storm.gpu],
                    "lines": storm.lines,
                    "killed_job": storm.killed_job,
                    "user": users[storm.job_index],
                },
            )
        )
    for flap in history.flaps:
        out.append(
            FaultTruth(
                fault_id=_planted_id("flap", flap.index),
                kind=FAULT_KIND_NVLINK_FLAPPING,
                node=names[flap.node],
                onset_ms=flap.onset_ms,
                gpu=flap.gpus[0],
                pci_bus_id=pci_bus_id(flap.gpus[0]),
                xid=NVLINK_FLAP_XID,
                xids=(NVLINK_FLAP_XID,),
                details={"end": format_ts(flap.end_ms), "gpus": list(flap.gpus), "lines": flap.lines},
            )
        )
    critical = Counter(fault.node for fault in history.faults)
    trace = history.trace
    for index, node in enumerate(history.lemon_nodes):
        details: dict[str, Any] = {
            "end": format_ts(config.end_ms),
            "critical_faults": critical[node],
            "fault_rate_multiplier": config.lemon_fault_multiplier,
        }
        if trace is not None:
            details["fault_rate_multiplier"] = round(trace.lemon_multiplier(node), 3)
            details["trace_hardware_faults"] = trace.hardware_faults[node]
        out.append(
            FaultTruth(
                fault_id=_planted_id("lemon", index),
                kind=FAULT_KIND_LEMON_NODE,
                node=names[node],
                onset_ms=config.start_ms,
                details=details,
            )
        )
    return out


def build_truth(history: ClusterHistory) -> Truth:
    """Derive the ground truth of a simulated history.

    Parameters
    ----------
    history
        Output of :func:`stream.simulator.history.run_model`.

    Returns
    -------
    Truth
        Faults of every kind by onset (then fault id), job failures in end order (then job id).
    """
    config = history.config
    names = config.node_names
    faults = sorted(
        [*_critical_faults(history), *_planted_faults(history), *_unobservable_faults(history)],
        key=lambda fault: (fault.onset_ms, fault.fault_id),
    )
    failures: list[JobFailureTruth] = []
    for job in history.jobs:
        if job.end_ms is None or job.state is JobState.COMPLETED:
            continue
        failures.append(
            JobFailureTruth(
                job_id=job.job_id,
                state=job.state,
                end_ms=job.end_ms,
                hardware=job.hardware,
                nodes=tuple(names[node] for node in job.nodes),
                gpus=job.gpus,
                fault_id=_fault_id(job.fault_index) if job.fault_index is not None else None,
            )
        )
    failures.sort(key=lambda failure: (failure.end_ms, int(failure.job_id)))
    return Truth(
        config=config,
        span_start_ms=config.start_ms,
        span_end_ms=config.end_ms,
        true_rf_per_1000_node_days=history.true_rf_per_1000_node_days,
        exposure_node_days=history.exposure_node_days,
        hardware_failures=history.hardware_failures,
        jobs=len(history.jobs),
        jobs_failed=len(failures),
        utilization=history.utilization,
        faults=tuple(faults),
        job_failures=tuple(failures),
        xid_counts=dict(sorted(Counter(record.xid for record in history.xids).items())),
        lemon_nodes=tuple(names[node] for node in history.lemon_nodes),
        maintenance=tuple(MaintenanceTruth(names[item.node], item.ts_ms) for item in history.maintenance),
        crash_loop_users=history.crash_loop_users,
        crash_loop_nodes={user: names[node] for user, node in history.crash_loop_nodes.items()},
    )
