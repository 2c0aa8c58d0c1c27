"""Planted faults with onsets (degradations, storms, flapping links, lemons) and benign noise,
taken together: every kind shows, and a run is reproducible."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from stream.simulator import SimulationConfig, Truth, simulate
from stream.simulator.events import EccEventKind
from stream.simulator.faults import FAULT_SOURCE_ECC_DEGRADATION, FAULT_SOURCE_LEMON
from stream.simulator.history import ClusterHistory


def test_planted_runs_are_byte_identical(
    written: tuple[Path, Truth], planted_config: SimulationConfig, tmp_path: Path
) -> None:
    out, _ = written
    simulate(planted_config, tmp_path)
    for name in ("kernel.log", "sacct.txt", "dcgm.prom", "truth.json"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_every_kind_appears_with_sensible_counts_at_1000_nodes(big: ClusterHistory) -> None:
    assert 130 <= len(big.faults) <= 260
    sources = Counter(fault.source for fault in big.faults)
    assert sources[FAULT_SOURCE_LEMON] >= 10 and sources[FAULT_SOURCE_ECC_DEGRADATION] >= 5
    # 0.3% of 8000 GPUs per 30 days; about 70% fail, fewer within the span (late starts).
    assert 10 <= len(big.degradations) <= 45
    failed = sum(item.failure_ms is not None for item in big.degradations)
    assert 0.3 <= failed / len(big.degradations) <= 0.85
    assert 10 <= len(big.storms) <= 45  # ~1 per 1000 node-days, on busy nodes
    assert any(storm.killed_job for storm in big.storms)
    assert any(not storm.killed_job for storm in big.storms)
    assert 5 <= len(big.flaps) <= 30  # ~0.5 per 1000 node-days
    assert len(big.lemon_nodes) == 15
    assert 80 <= len(big.maintenance) <= 220
    degrading = {(item.plan.node, item.plan.gpu) for item in big.degradations}
    blips = [
        event
        for event in big.ecc.events
        if event.kind == EccEventKind.SBE and (event.node, event.gpu) not in degrading
    ]
    assert len(blips) == round(0.03 * 8000)
    assert all(1 <= event.errors <= 3 for event in blips)
