"""Fixtures shared by the tests of the simulator's modules."""

from __future__ import annotations

import pytest

from stream.simulator.config import SimulationConfig
from stream.simulator.history import ClusterHistory, run_model


@pytest.fixture(scope="session")
def mid() -> ClusterHistory:
    """A mid-size run: 500 nodes x 30 days (session-wide: several test modules read it)."""
    return run_model(SimulationConfig(nodes=500, days=30, seed=1))
