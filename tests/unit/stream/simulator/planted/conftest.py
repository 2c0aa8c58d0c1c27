"""Fixtures shared by the tests of the planted faults: a large model run and a small written one."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from schemas.timeutil import parse_ts
from stream.simulator import FaultTruth, SimulationConfig, Truth, simulate
from stream.simulator.history import ClusterHistory, run_model

# A small cluster with raised rates, written to disk: every kind shows in a short run.
PLANTED = SimulationConfig(
    nodes=50,
    days=14,
    seed=2,
    ecc_interval_minutes=240,
    hardware_failure_rate=30,
    ecc_degradation_gpu_fraction=0.06,
    xid_storm_rate=20,
    xid_storm_gpu_fraction=0.4,
    nvlink_flapping_rate=10,
    maintenance_rate=40,
)

XID_LINE_RE = re.compile(
    r"^(?P<ts>\S+) (?P<node>node\d{4}) kernel: NVRM: Xid \(PCI:(?P<bus>[0-9a-f:]+)\): (?P<xid>\d+), "
)
DCGM_RE = re.compile(
    r'^(?P<metric>DCGM_FI_DEV_\w+)\{gpu="(?P<gpu>\d+)",.*Hostname="(?P<node>[^"]+)"\} (?P<value>\d+) (?P<ts>\d+)$'
)


@pytest.fixture(scope="session")
def planted_config() -> SimulationConfig:
    """The configuration of :func:`written`."""
    return PLANTED


@pytest.fixture(scope="session")
def big() -> ClusterHistory:
    """The default model at 1000 nodes x 30 days (no files)."""
    return run_model(SimulationConfig(nodes=1000, days=30, seed=1))


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    """The files and truth of a run of :data:`PLANTED`."""
    out = tmp_path_factory.mktemp("planted")
    return out, simulate(PLANTED, out)


@pytest.fixture(scope="session")
def faults_by_kind(written: tuple[Path, Truth]) -> dict[str, list[FaultTruth]]:
    """The truth's faults of each kind, in truth order."""
    _, truth = written
    by_kind: dict[str, list[FaultTruth]] = defaultdict(list)
    for fault in truth.faults:
        by_kind[fault.kind].append(fault)
    return by_kind


@pytest.fixture(scope="session")
def xid_lines(written: tuple[Path, Truth]) -> list[tuple[int, str, str, int]]:
    """``(ms, node, pci bus, xid)`` of every XID line of kernel.log."""
    out, _ = written
    lines = []
    for line in (out / "kernel.log").read_text().splitlines():
        match = XID_LINE_RE.match(line)
        if match is not None:
            lines.append((parse_ts(match["ts"]), match["node"], match["bus"], int(match["xid"])))
    return lines


@pytest.fixture(scope="session")
def dcgm(written: tuple[Path, Truth]) -> dict[tuple[str, str, int], list[tuple[int, int]]]:
    """``(metric, node, gpu) -> [(ts, value)]`` of the ECC series in dcgm.prom."""
    out, _ = written
    series: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for line in (out / "dcgm.prom").read_text().splitlines():
        match = DCGM_RE.match(line)
        if match is not None:
            key = (match["metric"], match["node"], int(match["gpu"]))
            series[key].append((int(match["ts"]), int(match["value"])))
    return series
