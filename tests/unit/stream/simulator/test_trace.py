"""Trace mode: the bundled trace is the pinned file, its servers, classes and times become the
simulation's nodes, templates and onsets, and a simulation without a trace is unchanged."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import orjson
import pytest

from schemas.timeutil import DAY_MS, MINUTE_MS
from stream.simulator import SimulationConfig, simulate
from stream.simulator.faults import FAULT_SOURCE_TRACE, FAULT_TEMPLATES_BY_NAME, FaultPlan
from stream.simulator.history import run_model
from stream.simulator.trace import (
    LEMON_MIN_HARDWARE_FAULTS,
    MIN_DOWN_MS,
    OBSERVABLE,
    TRACES,
    TraceFault,
    load_trace,
    trace_fault_plans,
    trace_overrides,
)
from stream.simulator.truth import build_truth

ROOT = Path(__file__).resolve().parents[4]
SOURCE = TRACES["infinitehbd"]
FULL = SimulationConfig(seed=3, **trace_overrides("infinitehbd"))


def test_the_bundled_trace_is_the_file_its_readme_names() -> None:
    folder = ROOT / "data" / "infinitehbd-trace"
    readme = (folder / "README.md").read_text()
    for name in ("fault_trace.json", "fault_statistics.json"):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert re.search(rf"`{name}` sha256 \| `{digest}`", readme), name
    assert SOURCE.path == folder / "fault_trace.json"
    assert hashlib.sha256(SOURCE.path.read_bytes()).hexdigest() == SOURCE.sha256
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "7aacdc8c3d2352c5b784bc0ea31756e1620daed1" in readme


def test_every_class_the_mapping_names_is_in_the_trace_and_maps_to_a_template() -> None:
    events = orjson.loads(SOURCE.path.read_bytes())
    classes = {(e["fault_type"]["Class"], e["fault_type"]["Desc"]) for e in events}
    assert set(OBSERVABLE) <= classes
    assert all(name == "" or name in FAULT_TEMPLATES_BY_NAME for name in OBSERVABLE.values())


def test_the_trace_on_its_fleet_keeps_its_counts_servers_and_lemons() -> None:
    trace = load_trace(FULL)
    assert len(trace.faults) == 584  # every fault starts within the 349 days
    assert len(trace.observable) + len(trace.unobservable) == 584
    assert len(trace.observable) == 126  # DBE 60, unknown error 40, xid 11, smi timeout 9, lost 5 + 1
    nodes = {fault.node for fault in trace.faults}
    assert len(nodes) == 231 and max(nodes) < FULL.nodes
    assert max(nodes) >= 0.95 * FULL.nodes  # spread over the fleet, not packed at its start
    hardware = Counter(f.node for f in trace.faults if f.level == "Hardware Failure")
    assert sum(hardware.values()) == 298
    assert trace.lemons == tuple(sorted(n for n, c in hardware.items() if c >= LEMON_MIN_HARDWARE_FAULTS))
    assert sorted(hardware[n] for n in trace.lemons) == [5, 5, 5, 5, 6, 6, 7, 11]
    assert trace.faults[0].onset_ms == SOURCE.start_ms + round(3.8955 * DAY_MS)
    assert [f.onset_ms for f in trace.faults] == sorted(f.onset_ms for f in trace.faults)


def test_a_shorter_span_keeps_the_faults_that_start_within_it() -> None:
    config = SimulationConfig(**{**trace_overrides("infinitehbd"), "days": 30.0})
    trace = load_trace(config)
    assert trace.faults and all(fault.onset_ms < config.end_ms for fault in trace.faults)
    assert trace.faults == load_trace(FULL).faults[: len(trace.faults)]
    with pytest.raises(ValueError, match="231 servers"):
        load_trace(SimulationConfig(**{**trace_overrides("infinitehbd"), "nodes": 200}))


def test_repairs_follow_the_trace_and_never_run_into_the_nodes_next_fault() -> None:
    trace = load_trace(FULL)
    plans = trace_fault_plans(trace)
    assert len(plans) == len(trace.observable)
    by_index = {fault.index: fault for fault in trace.observable}
    by_node: dict[int, list[tuple[FaultPlan, TraceFault]]] = {}
    for plan in plans:
        fault = by_index[plan.trace]
        assert plan.source == FAULT_SOURCE_TRACE and (plan.onset_ms, plan.node) == (
            fault.onset_ms,
            fault.node,
        )
        assert plan.template == (fault.template or "")
        by_node.setdefault(plan.node, []).append((plan, fault))
    clipped = 0
    for pairs in by_node.values():
        for (plan, fault), later in zip(pairs, [*pairs[1:], None], strict=True):
            assert (
                plan.repair_ms >= fault.onset_ms + MIN_DOWN_MS
            )  # the trace's faults are 20 min apart at least
            if later is not None:
                assert plan.repair_ms < later[0].onset_ms
            if later is not None and fault.end_ms >= later[0].onset_ms - MINUTE_MS:
                clipped += 1
            elif fault.end_ms >= fault.onset_ms + MIN_DOWN_MS:
                assert plan.repair_ms == fault.end_ms
    assert clipped <= 1


def test_a_model_run_strikes_every_observable_fault_once() -> None:
    history = run_model(FULL)
    trace = load_trace(FULL)
    struck = Counter(fault.trace for fault in history.faults)
    assert set(struck) == {fault.index for fault in trace.observable}
    assert set(struck.values()) == {1}
    assert history.lemon_nodes == trace.lemons
    truth = build_truth(history)
    lemons = [f for f in truth.faults if f.kind == "lemon_node"]
    assert [f.details["trace_hardware_faults"] for f in lemons] == [
        trace.hardware_faults[n] for n in trace.lemons
    ]
    assert {f.details["source"] for f in truth.faults if f.kind == "critical_hw"} == {FAULT_SOURCE_TRACE}
    unobservable = [f for f in truth.faults if f.kind == "unobservable"]
    assert len(unobservable) == 458 and all(f.xid is None for f in unobservable)
    # Struck at the trace's time, or postponed a few minutes after a job's end on the node.
    onsets = {fault.fault_id: fault.onset_ms for fault in trace.faults}
    late = [
        fault.onset_ms - onsets[fault.details["trace_fault"]]
        for fault in truth.faults
        if fault.kind == "critical_hw"
    ]
    assert min(late) == 0 and max(late) < 60 * MINUTE_MS


def test_an_unknown_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="fault_trace"):
        SimulationConfig(fault_trace="nope")


def test_without_a_trace_truth_json_names_none(tmp_path: Path) -> None:
    simulate(SimulationConfig(nodes=8, days=1, seed=2), tmp_path)
    config = orjson.loads((tmp_path / "truth.json").read_bytes())["config"]
    assert "fault_trace" not in config and config["nodes"] == 8
