"""The hardware evidence a node keeps for job attribution: what a search for the node's newest
event kept, without the search (a storm of critical XIDs brings thousands within the horizon)."""

from __future__ import annotations

import pickle
import random
from collections import deque

import pytest

from detectors.attribution import HardwareEvent, NodeEvidenceLog
from schemas.outputs import IncidentKind

HORIZON_MS = 900_000


def scanning_add(log: dict[str, deque[HardwareEvent]], event: HardwareEvent) -> None:
    """How an event was added before: the horizon from the node's newest event, searched for."""
    events = log.setdefault(event.node, deque())
    events.append(event)
    oldest_needed = max(e.ts_ms for e in events) - HORIZON_MS
    while events and events[0].ts_ms < oldest_needed:
        events.popleft()


@pytest.mark.parametrize("seed", range(5))
def test_the_log_keeps_what_a_scan_kept(seed: int) -> None:
    """Events of three nodes, now and then out of time order, pruned now and then, and the log
    checkpointed: it holds the events a search for the newest would have held."""
    rng = random.Random(seed)
    log, scan = NodeEvidenceLog(HORIZON_MS), {}
    t = 0
    for step in range(2000):
        t += rng.choice((rng.randrange(1_000), rng.randrange(600_000)))
        at = t - rng.randrange(1_200_000) if rng.random() < 0.1 else t
        event = HardwareEvent(at, f"n{rng.randrange(3)}", "0000:07:00", IncidentKind.GPU_BUS, 79)
        log.add(event)
        scanning_add(scan, event)
        if step % 101 == 0:
            before = t - 2 * HORIZON_MS
            log.prune(before)
            scan = {node: events for node, events in scan.items() if events[-1].ts_ms >= before}
            log = pickle.loads(pickle.dumps(log))
        assert log.between(["n0", "n1", "n2"], -(2**62), 2**62) == sorted(
            (e for events in scan.values() for e in events), key=lambda e: (e.ts_ms, e.node, e.gpu, e.kind)
        ), step
