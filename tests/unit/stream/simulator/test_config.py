"""Validation and normalisation of the simulation's configuration."""

from __future__ import annotations

import pytest

from stream.simulator.config import DGX_A100_PCI_BUS_IDS, SimulationConfig, pci_bus_id


@pytest.mark.parametrize(
    "changes",
    [
        {"nodes": 0},
        {"days": 0},
        {"gpus_per_node": 0},
        {"ecc_interval_minutes": 0},
        {"user_failed_fraction": 1.5},
        {"user_failed_fraction": 0.5, "user_cancelled_fraction": 0.6},
        {"repair_min_hours": 5, "repair_max_hours": 2},
        {"cluster": " "},
    ],
)
def test_bad_config_is_rejected(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SimulationConfig(**changes)  # type: ignore[arg-type]


def test_int_and_float_spans_are_the_same_config() -> None:
    assert SimulationConfig(days=3) == SimulationConfig(days=3.0)
    assert isinstance(SimulationConfig(days=3).days, float)


def test_pci_bus_ids_are_distinct_beyond_a_dgx() -> None:
    ids = [pci_bus_id(gpu) for gpu in range(64)]
    assert ids[: len(DGX_A100_PCI_BUS_IDS)] == list(DGX_A100_PCI_BUS_IDS)
    assert len(set(ids)) == len(ids)
