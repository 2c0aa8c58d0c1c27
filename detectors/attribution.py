"""Job failure attribution (SPEC 4.4): did hardware kill this job?

A job run that ends FAILED or NODE_FAIL is attributed to hardware when one of its nodes shows a
hardware-class event from ``before`` (default 10 min) before to ``after`` (default 5 min) after the
end — the window of Kokolis et al. The decision waits until the event-time watermark has passed
``end + after``, so it never depends on how fast or in what partitioning the events arrived.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.outputs import IncidentKind

__all__ = ["HardwareEvent", "NodeEvidenceLog"]


@dataclass(frozen=True, slots=True)
class HardwareEvent:
    """A hardware-class event on a node: an XID that is job evidence (``XidInfo.job_evidence``: the
    critical hardware ones, and 94), a fatal NVSwitch SXid, or a critical ECC finding."""

    ts_ms: int
    node: str
    gpu: str
    kind: IncidentKind  # the incident kind the event raised (its family)
    xid: int | None = None


class NodeEvidenceLog:
    """Recent hardware events per node, kept only as long as a pending attribution may need them.

    Parameters
    ----------
    horizon_ms
        Events older than the newest event of the node minus this are dropped.

    Examples
    --------
    >>> log = NodeEvidenceLog(horizon_ms=900_000)
    >>> log.add(HardwareEvent(1_000_000, "n1", "0000:07:00", IncidentKind.GPU_BUS, 79))
    >>> [e.xid for e in log.between(["n1", "n2"], 500_000, 1_300_000)]
    [79]
    >>> log.between(["n1"], 1_000_001, 2_000_000)
    []
    """

    def __init__(self, horizon_ms: int) -> None:
        self.horizon_ms = horizon_ms
        self._by_node: dict[str, deque[HardwareEvent]] = {}

    def add(self, event: HardwareEvent) -> None:
        """Record an event; drop this node's events that fell out of the horizon."""
        events = self._by_node.setdefault(event.node, deque())
        events.append(event)
        # What the node's newest event leaves out of the horizon left when that event came (the
        # front is then within it, and only the back grows): an event older than the newest
        # leaves nothing more, so its own time decides as well as the newest's would, without a
        # search for the newest an event (a storm of critical XIDs brings thousands within the
        # horizon, and the search made it quadratic).
        oldest_needed = event.ts_ms - self.horizon_ms
        while events and events[0].ts_ms < oldest_needed:
            events.popleft()

    def prune(self, before_ms: int) -> None:
        """Forget every event older than ``before_ms`` (no pending decision can reach it)."""
        for node in [node for node, events in self._by_node.items() if events[-1].ts_ms < before_ms]:
            del self._by_node[node]

    def between(self, nodes: Iterable[str], start_ms: int, end_ms: int) -> list[HardwareEvent]:
        """Events on any of ``nodes`` with ``start_ms <= ts <= end_ms``, by time then node."""
        found = [
            event
            for node in nodes
            for event in self._by_node.get(node, ())
            if start_ms <= event.ts_ms <= end_ms
        ]
        found.sort(key=lambda e: (e.ts_ms, e.node, e.gpu, e.kind))
        return found
