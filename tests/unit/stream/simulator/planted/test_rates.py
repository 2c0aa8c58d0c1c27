"""The split of the critical fault rate between healthy nodes, lemons and degradations."""

from __future__ import annotations

import pytest

from stream.simulator.config import SimulationConfig
from stream.simulator.planted.rates import fault_rates


def test_the_rate_split_keeps_the_cluster_rate() -> None:
    config = SimulationConfig(nodes=1000, days=30)
    rates = fault_rates(config, 15)
    cluster = rates.healthy + rates.lemon_extra * 15 / 1000 + rates.degradation
    assert cluster == pytest.approx(config.hardware_failure_rate)
    assert rates.lemon_extra == pytest.approx(14 * rates.healthy)
    assert 0.3 < rates.degradation < 0.7
