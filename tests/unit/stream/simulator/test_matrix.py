"""The scenario matrix: every cell makes a valid configuration, seeds are split, shapes differ."""

from __future__ import annotations

import pytest

from schemas.timeutil import DAY_MS, HOUR_MS
from stream.simulator.config import DEGRADATION_SHAPES, SimulationConfig
from stream.simulator.history import run_model
from stream.simulator.matrix import (
    CELLS,
    HELD_OUT_SEEDS,
    QUICK_CELLS,
    TUNING_SEEDS,
    cell_config,
    cells_named,
)
from stream.simulator.planted.degradation import DegradationPlan


def test_seeds_are_split_and_cells_are_unique():
    assert not set(TUNING_SEEDS) & set(HELD_OUT_SEEDS)
    assert len({cell.name for cell in CELLS}) == len(CELLS)
    assert set(QUICK_CELLS) <= {cell.name for cell in CELLS}
    with pytest.raises(KeyError):
        cells_named(("no-such-cell",))


def test_the_matrix_spans_the_required_ranges():
    nodes = {cell.nodes for cell in CELLS}
    days = {cell.days for cell in CELLS}
    scrapes = {cell.scrape_minutes for cell in CELLS}
    assert min(nodes) <= 16 and max(nodes) >= 5000
    assert min(days) <= 3 and max(days) >= 90
    assert {0.5, 15, 360} <= scrapes  # 30 s, 15 min, 6 h
    shapes = {
        cell.overrides.get("ecc_degradation_shape") for cell in CELLS if cell.family == "ecc_degradation"
    }
    assert set(DEGRADATION_SHAPES) <= shapes
    assert {cell.family for cell in CELLS} == {
        "ecc_degradation",
        "xid_storm",
        "nvlink_flapping",
        "lemon_node",
        "job_aware",
    }
    # The job-aware cells: crash loops anywhere, pinned to one node, and beside planted lemons.
    aware = [(cell.family, cell_config(cell, seed=TUNING_SEEDS[0])) for cell in CELLS]
    assert any(f == "job_aware" and c.crash_loop_users and not c.crash_loop_pinned_users for f, c in aware)
    assert any(f == "job_aware" and c.crash_loop_pinned_users for f, c in aware)
    assert any(f == "lemon_node" and c.crash_loop_users for f, c in aware)
    storms = [cell for cell in CELLS if cell.family == "xid_storm"]
    assert all(cell.kinds == ("xid_storm", "job_xid_storm") for cell in storms)
    assert all(0 < cell_config(cell, seed=1).xid_storm_gpu_fraction < 1 for cell in storms)


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.name)
def test_every_cell_makes_a_valid_configuration(cell):
    config = cell_config(cell, seed=HELD_OUT_SEEDS[0])
    assert (config.nodes, config.days, config.ecc_interval_minutes) == (
        cell.nodes,
        cell.days,
        cell.scrape_minutes,
    )
    assert config.seed == HELD_OUT_SEEDS[0] and config.dcgm_changed_only


def test_a_lemon_cell_keeps_the_healthy_rate_and_plants_its_lemons():
    config = cell_config(cells_named(("lemon-many-32n-7d",))[0], seed=TUNING_SEEDS[0])
    history = run_model(config)
    assert len(history.lemon_nodes) == 2
    lemon_faults = sum(1 for fault in history.faults if fault.node in history.lemon_nodes)
    healthy_faults = len(history.faults) - lemon_faults
    assert lemon_faults >= 5  # about five each is planted; far more than the healthy nodes' ...
    assert healthy_faults <= 5  # ... 30 nodes x 7 days x 6.5 / 1000 = 1.4 expected


def plan(shape: str) -> DegradationPlan:
    return DegradationPlan(
        index=0, node=0, gpu=0, start_ms=0, failure_ms=4 * DAY_MS, duration_ms=4 * DAY_MS,
        initial_rate=10.0, final_rate=800.0, template="dbe", shape=shape,
    )  # fmt: skip


def test_degradation_shapes_grow_as_named():
    day = {shape: [plan(shape).expected_errors(k * DAY_MS, (k + 1) * DAY_MS) for k in range(4)]
           for shape in DEGRADATION_SHAPES if shape != "mixed"}  # fmt: skip
    assert day["step"][0] == pytest.approx(200.0) and day["step"][3] == pytest.approx(200.0)
    assert day["quadratic"][0] < 30 < day["quadratic"][3]  # starts from nothing, smoothly
    assert day["quadratic"] == sorted(day["quadratic"])
    assert day["linear"][1] - day["linear"][0] == pytest.approx(day["linear"][3] - day["linear"][2])
    assert day["exponential"][3] / day["exponential"][2] == pytest.approx(
        day["exponential"][1] / day["exponential"][0]
    )
    assert day["bursty"][0] > 10 * day["bursty"][2]  # a burst, then quiet
    assert day["slow_boil"][3] < day["linear"][3] / 5
    for shape, counts in day.items():
        assert all(count >= 0 for count in counts), shape
    # The first hour of a bursty degradation is at the final rate.
    assert plan("bursty").expected_errors(0, HOUR_MS) == pytest.approx(800.0 / 24)


def test_a_mixed_cell_draws_several_shapes_and_the_default_keeps_its_draws():
    mixed = run_model(SimulationConfig(nodes=64, days=14, seed=3, ecc_degradation_gpu_fraction=0.05,
                                       ecc_degradation_shape="mixed"))  # fmt: skip
    assert len({record.plan.shape for record in mixed.degradations}) >= 3
    default = run_model(SimulationConfig(nodes=64, days=14, seed=3, ecc_degradation_gpu_fraction=0.05))
    again = run_model(SimulationConfig(nodes=64, days=14, seed=3, ecc_degradation_gpu_fraction=0.05,
                                       ecc_degradation_shape="exponential"))  # fmt: skip
    assert default.degradations == again.degradations and default.faults == again.faults
    assert {record.plan.shape for record in default.degradations} == {"exponential"}


def test_storm_density_follows_the_configuration():
    dense = run_model(SimulationConfig(nodes=64, days=7, seed=5, xid_storm_rate=30.0, xid_storm_lines_min=1000,
                                       xid_storm_lines_max=2000, xid_storm_minutes_min=60.0,
                                       xid_storm_minutes_max=120.0))  # fmt: skip
    assert dense.storms
    assert all(storm.lines <= 2000 for storm in dense.storms)
    assert max(storm.lines for storm in dense.storms) >= 500
    with pytest.raises(ValueError, match="storm lines"):
        SimulationConfig(xid_storm_lines_min=10, xid_storm_lines_max=5)
    with pytest.raises(ValueError, match="ecc_degradation_shape"):
        SimulationConfig(ecc_degradation_shape="wobbly")


def test_degradations_under_way_began_before_the_span_and_show_from_its_first_scrape():
    config = SimulationConfig(nodes=64, days=4, seed=3, ecc_degradation_gpu_fraction=0.05,
                              ecc_degradation_underway_days=2.0, ecc_degradation_min_days=3.5,
                              ecc_degradation_max_days=5.0)  # fmt: skip
    history = run_model(config)
    assert history.degradations
    for record in history.degradations:
        assert config.start_ms - 2 * DAY_MS <= record.plan.start_ms < config.start_ms
        assert record.onset_ms == config.start_ms  # its errors so far are in the first scrape
        assert record.failure_ms is None or record.failure_ms > config.start_ms
    with pytest.raises(ValueError, match="underway"):
        SimulationConfig(ecc_degradation_underway_days=-1.0)
