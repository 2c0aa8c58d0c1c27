"""One ECC sample of a GPU's counters at one time, from the pieces remote_write requests bring.

Prometheus shards series by their labels: the ~11 DCGM series of one GPU at one scrape reach a
receiver in several requests, in any order, a request's worth at a time. The detection core
compares each sample's counters with the GPU's previous sample (:mod:`detectors.ecc`), so a sample
must hold all the counters of its scrape, as a scrape file's does (:mod:`stream.inputs.parsers.dcgm`):
split, a counter missing from one sample would lose or double its delta.

:class:`EccAssembly` gathers :class:`~stream.inputs.parsers.remote_write.DcgmPoint` values by
(node, GPU, time). A gathering is complete, and becomes an :class:`~schemas.records.EccSample`,
when it holds every counter the GPU's previous sample held; a GPU's first, or one whose exporter
stopped sending a counter, is complete once it has gathered for ``settle_seconds`` of wall time
(Prometheus sends a shard's batch within its ``batch_send_deadline``, 5 s by default). A GPU's
samples go out in time order: a complete one waits for the GPU's earlier ones.

The XID gauge (``DCGM_FI_DEV_XID_ERRORS``, the last XID code) becomes an
:class:`~schemas.records.XidEvent` when its value is > 0 and differs from the GPU's previous value,
as a scrape file's does, with ``since_ms`` the time of the gauge's previous sample.

>>> from stream.inputs.parsers.remote_write import DcgmPoint
>>> now = [0.0]
>>> assembly = EccAssembly("c", settle_seconds=5, clock=lambda: now[0])
>>> def point(counter, value, ts=60_000):
...     return DcgmPoint("n1", 0, "0000:3b:00", ts, counter, value)
>>> assembly.add([point("sbe_volatile", 3)])        # the GPU's first: waits to settle
[]
>>> assembly.add([point("dbe_volatile", 0)])
[]
>>> now[0] = 5.0
>>> [sorted(s.counters.items()) for s in assembly.due()]
[[('dbe_volatile', 0), ('sbe_volatile', 3)]]
>>> assembly.add([point("dbe_volatile", 0, ts=120_000)])     # the next scrape: its counters known
[]
>>> [sorted(s.counters.items()) for s in assembly.add([point("sbe_volatile", 4, ts=120_000)])]
[[('dbe_volatile', 0), ('sbe_volatile', 4)]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from schemas.records import EccSample, XidEvent
from stream.inputs.parsers.dcgm import XID_MESSAGE
from stream.inputs.parsers.remote_write import DcgmPoint

__all__ = ["EccAssembly"]

_Gpu = tuple[str, int]  # (node, GPU index)


@dataclass(slots=True)
class _Gathering:
    pci_bus_id: str
    started: float
    counters: dict[str, int] = field(default_factory=dict)
    xid: int | None = None

    def held(self) -> frozenset[str]:
        """The counters gathered, "" for the XID gauge."""
        return frozenset(self.counters) | (frozenset({""}) if self.xid is not None else frozenset())


@dataclass(slots=True)
class _GpuState:
    #: Gatherings by time, not yet out.
    open: dict[int, _Gathering] = field(default_factory=dict)
    #: The counters the GPU's last sample held, "" for the XID gauge (empty: none yet).
    known: frozenset[str] = frozenset()
    #: The time of the GPU's last sample out: a point at or before it comes too late.
    last_ms: int = -1
    last_xid: int = 0
    #: The time of the GPU's last sample of the XID gauge out (0: none yet).
    xid_ms: int = 0


class EccAssembly:
    """Gatherings of DCGM points by GPU and time; samples out when complete (see the module)."""

    def __init__(
        self, cluster: str, settle_seconds: float = 10.0, clock: Callable[[], float] | None = None
    ) -> None:
        import time

        self.cluster = cluster
        self.settle_seconds = settle_seconds
        self._clock = clock or time.monotonic
        self._gpus: dict[_Gpu, _GpuState] = {}
        #: Points that came after their GPU's sample of that time (or a later one) was out.
        self.late_points = 0
        #: (node, GPU, time) of each gathering out since the caller last took them (:meth:`take_closed`).
        self._closed: list[tuple[str, int, int]] = []

    @property
    def open_gatherings(self) -> int:
        """Samples still gathering."""
        return sum(len(state.open) for state in self._gpus.values())

    def add(self, points: Iterable[DcgmPoint]) -> list[EccSample | XidEvent]:
        """Gather points; return the samples (and XID events) they complete, per GPU in time order."""
        now = self._clock()
        touched: set[_Gpu] = set()
        for point in points:
            key = (point.node, point.gpu)
            state = self._gpus.get(key)
            if state is None:
                state = self._gpus[key] = _GpuState()
            if point.ts_ms <= state.last_ms:
                self.late_points += 1
                continue
            gathering = state.open.get(point.ts_ms)
            if gathering is None:
                gathering = state.open[point.ts_ms] = _Gathering(point.pci_bus_id, now)
            if point.counter:
                gathering.counters[point.counter] = point.value
            else:
                gathering.xid = point.value
            touched.add(key)
        out: list[EccSample | XidEvent] = []
        for key in sorted(touched):
            out.extend(self._ready(key, self._gpus[key], now))
        return out

    def due(self) -> list[EccSample | XidEvent]:
        """The samples that have gathered for ``settle_seconds`` (and those waiting on them)."""
        now = self._clock()
        out: list[EccSample | XidEvent] = []
        for key in sorted(self._gpus):
            out.extend(self._ready(key, self._gpus[key], now))
        return out

    def flush(self) -> list[EccSample | XidEvent]:
        """Every gathering out, complete or not (a stop)."""
        out: list[EccSample | XidEvent] = []
        for key in sorted(self._gpus):
            out.extend(self._ready(key, self._gpus[key], float("inf")))
        return out

    def take_closed(self) -> list[tuple[str, int, int]]:
        """(node, GPU, time) of the gatherings out since the last call: what they gathered may be
        forgotten (a receiver's saved parts)."""
        closed, self._closed = self._closed, []
        return closed

    def gpu_state(self, node: str, gpu: int) -> tuple[int, int, tuple[str, ...], int] | None:
        """(time of its last sample out, its last XID gauge value, the counters it held, the time
        of its last XID gauge sample) of a GPU."""
        state = self._gpus.get((node, gpu))
        if state is None:
            return None
        return state.last_ms, state.last_xid, tuple(sorted(state.known)), state.xid_ms

    def restore_gpu(
        self, node: str, gpu: int, last_ms: int, last_xid: int, known: Iterable[str], xid_ms: int = 0
    ) -> None:
        """Take up a GPU where a previous assembly left it (a receiver's restart)."""
        state = self._gpus.setdefault((node, gpu), _GpuState())
        state.last_ms, state.last_xid, state.known = last_ms, last_xid, frozenset(known)
        state.xid_ms = xid_ms

    def _ready(self, key: _Gpu, state: _GpuState, now: float) -> list[EccSample | XidEvent]:
        """The GPU's gatherings that are complete, oldest first, up to the first that is not."""
        out: list[EccSample | XidEvent] = []
        for ts_ms in sorted(state.open):
            gathering = state.open[ts_ms]
            held = gathering.held()
            complete = bool(state.known) and state.known <= held
            if not complete and now - gathering.started < self.settle_seconds:
                break
            del state.open[ts_ms]
            state.last_ms = ts_ms
            state.known = held
            node, gpu = key
            self._closed.append((node, gpu, ts_ms))
            xid = gathering.xid  # the XID event before the sample, as a scrape file gives them
            if xid is not None:
                if xid > 0 and xid != state.last_xid:
                    out.append(
                        XidEvent(
                            ts_ms=ts_ms,
                            cluster=self.cluster,
                            node=node,
                            xid=xid,
                            pci_bus_id=gathering.pci_bus_id,
                            gpu=gpu,
                            message=XID_MESSAGE,
                            since_ms=state.xid_ms,
                        )
                    )
                state.last_xid = xid
                state.xid_ms = ts_ms
            if gathering.counters:
                out.append(
                    EccSample(
                        ts_ms=ts_ms,
                        cluster=self.cluster,
                        node=node,
                        gpu=gpu,
                        pci_bus_id=gathering.pci_bus_id,
                        counters=gathering.counters,
                    )
                )
        return out
