"""Lemon nodes: far more critical faults, mostly NODE_FAIL, extra application XIDs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from schemas.records import JobState
from stream.simulator import FaultTruth, Truth
from stream.simulator.faults import FAULT_SOURCE_LEMON
from stream.simulator.history import ClusterHistory


def test_lemon_nodes_fail_far_more_often(big: ClusterHistory) -> None:
    lemons = set(big.lemon_nodes)
    days = big.config.days
    on_lemons = sum(1 for fault in big.faults if fault.node in lemons)
    lemon_rate = on_lemons / (len(lemons) * days)
    healthy_rate = (len(big.faults) - on_lemons) / ((big.config.nodes - len(lemons)) * days)
    assert lemon_rate >= 5 * healthy_rate
    killers = {
        job.index: big.faults[job.fault_index]
        for job in big.jobs
        if job.hardware and job.fault_index is not None
    }
    by_lemons = [index for index, fault in killers.items() if fault.node in lemons]
    assert len(by_lemons) / len(killers) >= 5 * len(lemons) / big.config.nodes
    states = {job.index: job.state for job in big.jobs}
    lemon_kills = Counter(
        states[index] for index, fault in killers.items() if fault.source == FAULT_SOURCE_LEMON
    )
    assert lemon_kills[JobState.NODE_FAIL] > lemon_kills[JobState.FAILED]
    lemon_xids = Counter(record.node for record in big.xids if record.node in lemons)
    all_xids = Counter(record.node for record in big.xids)
    assert sum(lemon_xids.values()) / len(lemons) > 3 * sum(all_xids.values()) / big.config.nodes


def test_lemon_truth(written: tuple[Path, Truth], faults_by_kind: dict[str, list[FaultTruth]]) -> None:
    _, truth = written
    lemons = faults_by_kind["lemon_node"]
    assert [fault.node for fault in lemons] == list(truth.lemon_nodes) and len(lemons) == 1
    assert all(fault.onset_ms == truth.span_start_ms for fault in lemons)
    assert set(truth.healthy_nodes) == set(truth.config.node_names) - set(truth.lemon_nodes)
    assert [(f.onset_ms, f.fault_id) for f in truth.faults] == sorted(
        (f.onset_ms, f.fault_id) for f in truth.faults
    )
