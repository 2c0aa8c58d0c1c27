"""A real cluster's fault process as the simulator's critical faults: trace mode.

With :attr:`SimulationConfig.fault_trace` set, the critical faults are not drawn: each fault of
the trace strikes its server at its time, and the lemons are the trace's worst servers. Jobs,
DCGM scrapes, application XIDs and benign noise are simulated as always. The one trace is
InfiniteHBD-Trace (``data/infinitehbd-trace/``, Apache-2.0): 584 faults on 400 GPU servers over
349 days, as ``fault_start`` / ``fault_end`` pairs of an anonymized server UUID, a time in days
and a ``Level`` / ``Class`` / ``Desc``; no XID codes, GPU indexes or jobs.

Modelling choices (docs/detection.md states them too):

* **Servers to nodes.** The trace's 231 servers with faults, by sorted UUID, are spread evenly
  over the fleet's nodes (the ``i``-th of ``K`` is node ``floor(i x nodes / K)``); the others are
  the servers without faults (169 of the trace's 400).
* **Times.** Day 0 of the trace is :attr:`SimulationConfig.start_ms` (the matrix and ``simulate
  --fault-trace`` put it at the trace's 2024-03-30); a fault whose start lies beyond the span is
  left out. A fault the telemetry shows takes its node out until the trace's ``fault_end``: at
  least :data:`MIN_DOWN_MS`, and back a minute before the node's next such fault.
* **Classes to telemetry** (:data:`OBSERVABLE`): a DBE over threshold is XID 48 (with 63) and a
  DBE on the counters; a lost or missing GPU is XID 79; an unknown device error or an
  ``nvidia-smi`` timeout (the driver's firmware stops answering) is XID 119; "GPU xid Error" names
  no code: one is drawn from the simulator's mix of hardware faults. These are ``critical_hw``
  faults of the truth; they kill the job running on the node, as any critical fault does.
* **Undetectable by design.** Every other fault (a PCIe link trained narrow, a hot GPU, low P2P
  bandwidth, silent data corruption, one GPU's correctable errors; NICs, cables, power supplies,
  fans, boards, CPUs, software and the trace's unknown errors) shows in no XID or ECC counter.
  They are in the truth as :data:`FAULT_KIND_UNOBSERVABLE` (``trace-N``), counted apart, and
  change nothing in the cluster: the trace does not say whether they stopped a server or a job.
* **Lemons.** A server with at least :data:`LEMON_MIN_HARDWARE_FAULTS` hardware faults
  (``Level`` "Hardware Failure", any class) within the span: at the trace's 0.745 hardware faults
  per server over its 349 days, a Poisson count reaches 5 with probability 0.1% (0.4 of 400
  servers by chance); 8 servers of the trace do (2% of the fleet; 11, 7, 6, 6, 5, 5, 5, 5).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import orjson

from schemas.timeutil import DAY_MS, MINUTE_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.faults import FAULT_SOURCE_TRACE, FaultPlan

__all__ = [
    "FAULT_KIND_UNOBSERVABLE",
    "LEMON_MIN_HARDWARE_FAULTS",
    "MIN_DOWN_MS",
    "OBSERVABLE",
    "TRACES",
    "FaultTrace",
    "TraceFault",
    "TraceSource",
    "load_trace",
    "trace_fault_plans",
    "trace_overrides",
]

#: Kind of a trace's fault that no input of ours shows (the truth's ``faults[].kind``).
FAULT_KIND_UNOBSERVABLE: Final = "unobservable"

#: A server with this many hardware faults in the span is a lemon (the module docstring says why).
LEMON_MIN_HARDWARE_FAULTS: Final = 5

#: A fault the telemetry shows keeps its node down at least this long (a reset and a reboot).
MIN_DOWN_MS: Final = 10 * MINUTE_MS

#: The trace's hardware level: what counts toward a lemon.
HARDWARE_LEVEL: Final = "Hardware Failure"

#: ``(Class, Desc)`` of the trace's faults that GPU telemetry shows -> the simulator's template
#: (:data:`stream.simulator.faults.FAULT_TEMPLATES_BY_NAME`; "": drawn from the hardware mix).
OBSERVABLE: Final[dict[tuple[str, str], str]] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): "dbe",
    ("GPU", "GPU Lost"): "fallen_off_bus",
    ("GPU", "GPU device not found"): "fallen_off_bus",
    ("GPU", "GPU device unknow error"): "gsp_rpc_timeout",
    ("GPU", "nvidia-smi Timeout"): "gsp_rpc_timeout",
    ("GPU", "GPU xid Error"): "",
}

_DATA = Path(__file__).resolve().parents[2] / "data"


class TraceSource(NamedTuple):
    """Where a trace is and what it is: its file and sha256, day 0 and fleet."""

    path: Path
    sha256: str
    start_ms: int  # day 0 of the trace's times (UTC)
    servers: int
    days: float  # the span that holds every fault


#: The traces by :data:`stream.simulator.config.FAULT_TRACES` name.
TRACES: Final[dict[str, TraceSource]] = {
    "infinitehbd": TraceSource(
        _DATA / "infinitehbd-trace" / "fault_trace.json",
        "5871b881b341c9526223c025eda3a9bd2f0f875cf8d53441688ccd953e11b80d",
        1_711_756_800_000,  # 2024-03-30T00:00:00Z
        400,
        349.0,
    ),
}


@dataclass(frozen=True, slots=True)
class TraceFault:
    """One fault of the trace, placed in the simulation.

    ``index`` is its rank by start in the trace (``trace-N`` is ``index + 1``); ``template`` is the
    simulator's template it strikes as, ``None`` for a fault no input shows.
    """

    index: int
    node: int
    onset_ms: int
    end_ms: int
    level: str
    fault_class: str
    desc: str
    template: str | None

    @property
    def fault_id(self) -> str:
        """``trace-000001`` ...: the fault's id in the truth (a detail of a ``critical_hw`` one)."""
        return f"trace-{self.index + 1:06d}"

    def details(self) -> dict[str, object]:
        """What the truth keeps of the trace (beside the kind's own keys)."""
        return {
            "trace_fault": self.fault_id,
            "trace_level": self.level,
            "trace_class": self.fault_class,
            "trace_desc": self.desc,
        }


@dataclass(frozen=True, slots=True)
class FaultTrace:
    """A trace's faults within the span, on the simulation's nodes, and the lemons it makes.

    Attributes
    ----------
    faults
        Faults whose start lies within the span, by start (then trace order).
    hardware_faults
        Hardware-level faults per node within the span (nodes without any left out).
    lemons
        Nodes with at least :data:`LEMON_MIN_HARDWARE_FAULTS` of them, ascending.
    servers
        The trace's fleet.
    """

    name: str
    faults: tuple[TraceFault, ...]
    hardware_faults: dict[int, int]
    lemons: tuple[int, ...]
    servers: int

    @property
    def observable(self) -> tuple[TraceFault, ...]:
        """The faults GPU telemetry shows: the simulation's ``critical_hw`` faults."""
        return tuple(fault for fault in self.faults if fault.template is not None)

    @property
    def unobservable(self) -> tuple[TraceFault, ...]:
        """The faults no input shows: :data:`FAULT_KIND_UNOBSERVABLE` in the truth."""
        return tuple(fault for fault in self.faults if fault.template is None)

    def lemon_multiplier(self, node: int) -> float:
        """The node's hardware faults over the fleet's mean per server."""
        mean = sum(self.hardware_faults.values()) / self.servers
        return self.hardware_faults.get(node, 0) / mean if mean else 0.0


def trace_overrides(name: str) -> dict[str, Any]:
    """:class:`SimulationConfig` fields of the trace's cluster: its fleet, day 0 and span, and no
    planted faults but the trace's (no degradations, storms, flapping links or drawn lemons)."""
    source = TRACES[name]
    return {
        "fault_trace": name,
        "nodes": source.servers,
        "days": source.days,
        "start_ms": source.start_ms,
        "lemon_node_fraction": 0.0,
        "ecc_degradation_gpu_fraction": 0.0,
        "xid_storm_rate": 0.0,
        "nvlink_flapping_rate": 0.0,
    }


def load_trace(config: SimulationConfig) -> FaultTrace:
    """Read :attr:`SimulationConfig.fault_trace` and place its faults on the configured fleet.

    Raises
    ------
    ValueError
        When the file is not the one pinned (sha256), its events do not pair up, or the fleet
        has fewer nodes than the trace has servers with faults.
    """
    source = TRACES[config.fault_trace]
    raw = source.path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != source.sha256:
        raise ValueError(f"{source.path}: sha256 {digest}, expected {source.sha256}")
    events = orjson.loads(raw)
    servers = sorted({str(event["node_id"]) for event in events})
    if config.nodes < len(servers):
        raise ValueError(f"the trace has faults on {len(servers)} servers: nodes must be at least that")
    node_of = {server: index * config.nodes // len(servers) for index, server in enumerate(servers)}
    opened: dict[tuple[str, str, str, str], list[float]] = {}
    pairs: list[tuple[float, float, str, str, str, str]] = []
    for event in events:
        kind = event["fault_type"]
        key = (str(event["node_id"]), str(kind["Level"]), str(kind["Class"]), str(kind["Desc"]))
        if event["event_type"] == "fault_start":
            opened.setdefault(key, []).append(float(event["event_time"]))
        elif event["event_type"] == "fault_end" and opened.get(key):
            pairs.append((opened[key].pop(0), float(event["event_time"]), *key))
        else:
            raise ValueError(f"{source.path}: unpaired {event['event_type']} of {key}")
    if any(opened.values()):
        raise ValueError(f"{source.path}: a fault_start without its fault_end")
    pairs.sort(key=lambda pair: pair[0])  # stable: trace order among equal starts
    faults: list[TraceFault] = []
    for index, (start, end, server, level, fault_class, desc) in enumerate(pairs):
        onset = config.start_ms + round(start * DAY_MS)
        if onset >= config.end_ms:
            continue
        template = OBSERVABLE.get((fault_class, desc))
        end_ms = config.start_ms + round(end * DAY_MS)
        faults.append(TraceFault(index, node_of[server], onset, end_ms, level, fault_class, desc, template))
    hardware = Counter(fault.node for fault in faults if fault.level == HARDWARE_LEVEL)
    lemons = tuple(sorted(node for node, count in hardware.items() if count >= LEMON_MIN_HARDWARE_FAULTS))
    counts = dict(sorted(hardware.items()))
    return FaultTrace(config.fault_trace, tuple(faults), counts, lemons, source.servers)


def trace_fault_plans(trace: FaultTrace) -> list[FaultPlan]:
    """The observable faults as critical faults to strike, each with its repair time.

    The node is back at the trace's ``fault_end``, at least :data:`MIN_DOWN_MS` after the onset
    and a minute before the node's next observable fault (so that no fault of the trace finds its
    node already down and is lost).
    """
    observable = trace.observable
    following: dict[int, int] = {}
    next_onset: dict[int, int] = {}
    for fault in reversed(observable):
        following[fault.index] = next_onset.get(fault.node, -1)
        next_onset[fault.node] = fault.onset_ms
    plans = []
    for fault in observable:
        repair = max(fault.end_ms, fault.onset_ms + MIN_DOWN_MS)
        later = following[fault.index]
        if later >= 0:
            repair = min(repair, later - MINUTE_MS)
        plans.append(
            FaultPlan(
                fault.onset_ms,
                fault.node,
                FAULT_SOURCE_TRACE,
                template=fault.template or "",
                repair_ms=repair,
                trace=fault.index,
            )
        )
    return plans
