"""Fixtures shared by the end-to-end tests of the worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.slurm import Slurm
from tests.services.worker import cli, query, results

EXAMPLE_LOGS = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14" / "logs"


@pytest.fixture(scope="session")
def embedded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded store (chdb folder) holding the example logs, replayed once per session. Read it
    only in subprocesses (`cli`, `query`): one process per chdb path."""
    store = tmp_path_factory.mktemp("embedded") / "store"
    cli({}, "replay", str(EXAMPLE_LOGS), "--clickhouse", f"chdb://{store}", "--no-progress")
    return store


@pytest.fixture(scope="session")
def embedded(embedded_store: Path) -> tuple[dict[str, list[dict]], str]:
    """The embedded replay's results for the example logs, and the hour they are compared up to
    (computed once for every worker test that compares with it)."""
    store = embedded_store
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    expected = results([store], last["t"])
    assert len(expected["incidents"]) > 10 and len(expected["mttf"]) > 100
    return expected, last["t"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A real Slurm (munged, MariaDB, slurmdbd, slurmctld, four slurmd: ``gpu-node-1`` to
    ``gpu-node-4``, one CPU and 8 GPUs each) for the module's tests, with the ``jobcomp/script``
    that records its environment (:meth:`Slurm.jobcomp_env`). Tests leave every node idle."""
    with Slurm(tmp_path_factory.mktemp("slurm"), cluster="faultstream", nodes=4, jobcomp=True) as cluster:
        yield cluster
