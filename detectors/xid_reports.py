"""One XID, two reporters: the driver's kernel-log line and a gauge of the last XID (DCGM field 230).

A GPU's XID reaches the pipeline once as the line the driver logged (``NVRM: Xid ...``, at the
XID's own time) and, where dcgm-exporter's series are collected too, once more as a change of
``DCGM_FI_DEV_XID_ERRORS``, the gauge of the last XID code, at the time of the scrape that first
showed it. That second report says: an XID of this code happened on this GPU after the gauge's
previous sample and at or before this one (:attr:`schemas.records.XidEvent.since_ms`; a first
sample bounds nothing: any time before). Counted as two XIDs, it would be a second piece of
evidence, or a second incident when the scrape came after the first incident's quiet period.

The rule, per GPU (its PCI id: the kernel names a GPU by it, dcgm-exporter's ``pci_bus_id`` label
gives it) and code: **a gauge report and a driver report of the same XID are one XID, and the one
processed first stands for both**; the other is a *repeat*, which the core passes over (no
evidence, no storm score, no signal) and the runtimes do not store.

* A gauge report is a repeat when the driver reported that code on that GPU after the gauge's
  previous sample and at or before its own time: the usual order, since the scrape comes later.
* A driver report is a repeat when a gauge report that stood alone (no driver report was in its
  interval when it came) covers its time, and no driver report was paired with it yet: the gauge
  came first (a kernel log that arrived out of time order).

Every other report counts: a gauge change with no driver line in its interval is an XID the kernel
log lost (DCGM is the fallback), a second driver line of one failure is the driver's own repeat,
counted as it is without DCGM. Two gauge reports of one code never cover the same instant (the
next one's interval starts at the previous one's sample or later), so a driver report is never
paired twice. Reports are matched only by PCI id: a GPU named by index alone (an exporter without
the ``pci_bus_id`` label) is another GPU to the kernel log, and its reports all count.

State: per GPU with XIDs, the time of the last driver report of each code and the last gauge
report of each code that stood alone; a handful of entries a GPU.

>>> from schemas.records import XidEvent
>>> reports = XidReports()
>>> def xid(ts_ms, since=None):
...     return XidEvent(ts_ms=ts_ms, cluster="c", node="n1", xid=79, pci_bus_id="0000:3b:00", since_ms=since)
>>> reports.take(xid(1_000)), reports.repeats(xid(30_000, since=0)), reports.take(xid(30_000, since=0))
(False, True, True)
>>> reports.take(xid(90_000, since=60_000))  # a change after another scrape, no driver line in between
False
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.records import XidEvent

__all__ = ["XidReports"]

_Gpu = tuple[str, str, str]  # (cluster, node, PCI id)


@dataclass(slots=True)
class _GaugeReport:
    """A gauge report that stood alone: the XID happened in ``(since_ms, ts_ms]``."""

    since_ms: int
    ts_ms: int
    paired: bool = False


@dataclass(slots=True)
class _GpuReports:
    #: Per code, the time of the driver's last report.
    logged: dict[int, int] = field(default_factory=dict)
    #: Per code, the last gauge report that stood alone.
    gauged: dict[int, _GaugeReport] = field(default_factory=dict)


class XidReports:
    """Which XID reports repeat one already taken (see the module)."""

    __slots__ = ("_gpus",)

    def __init__(self) -> None:
        self._gpus: dict[_Gpu, _GpuReports] = {}

    def repeats(self, event: XidEvent) -> bool:
        """Whether ``event`` repeats a report already taken (nothing is remembered)."""
        if event.device != "gpu" or not event.pci_bus_id:
            return False
        reports = self._gpus.get((event.cluster, event.node, event.pci_bus_id))
        if reports is None:
            return False
        if event.since_ms is not None:
            logged = reports.logged.get(event.xid)
            return logged is not None and event.since_ms < logged <= event.ts_ms
        gauged = reports.gauged.get(event.xid)
        return gauged is not None and not gauged.paired and gauged.since_ms < event.ts_ms <= gauged.ts_ms

    def take(self, event: XidEvent) -> bool:
        """Remember ``event``; return whether it repeats a report already taken (then it is
        paired with that one, and otherwise forgotten)."""
        if event.device != "gpu" or not event.pci_bus_id:
            return False
        repeat = self.repeats(event)
        key = (event.cluster, event.node, event.pci_bus_id)
        reports = self._gpus.get(key)
        if reports is None:
            reports = self._gpus[key] = _GpuReports()
        if event.since_ms is not None:
            if not repeat:
                reports.gauged[event.xid] = _GaugeReport(event.since_ms, event.ts_ms)
        elif repeat:
            reports.gauged[event.xid].paired = True
        else:
            last = reports.logged.get(event.xid)
            if last is None or event.ts_ms > last:
                reports.logged[event.xid] = event.ts_ms
        return repeat
