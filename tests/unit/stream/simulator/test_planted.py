"""Planted faults with onsets (degradations, storms, flapping links, lemons) and benign noise."""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from schemas.records import JobState
from schemas.timeutil import parse_ts
from stream.simulator import FaultTruth, SimulationConfig, Truth, simulate
from stream.simulator.model import (
    FAULT_SOURCE_ECC_DEGRADATION,
    FAULT_SOURCE_LEMON,
    ClusterHistory,
    EccEventKind,
    pci_bus_id,
    run_model,
)
from stream.simulator.planted import STORM_XIDS, fault_rates

# A small cluster with raised rates, written to disk: every kind shows in a short run.
PLANTED = SimulationConfig(
    nodes=50,
    days=14,
    seed=2,
    ecc_interval_minutes=240,
    hardware_failure_rate=30,
    ecc_degradation_gpu_fraction=0.06,
    xid_storm_rate=20,
    nvlink_flapping_rate=10,
    maintenance_rate=40,
)

XID_LINE_RE = re.compile(
    r"^(?P<ts>\S+) (?P<node>node\d{4}) kernel: NVRM: Xid \(PCI:(?P<bus>[0-9a-f:]+)\): (?P<xid>\d+), "
)
DCGM_RE = re.compile(
    r'^(?P<metric>DCGM_FI_DEV_\w+)\{gpu="(?P<gpu>\d+)",.*Hostname="(?P<node>[^"]+)"\} (?P<value>\d+) (?P<ts>\d+)$'
)
HOUR = 3_600_000
# Series that drop at a reboot (the remap-failure flag at a repair that replaced the GPU).
VOLATILE = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)


@pytest.fixture(scope="module")
def big() -> ClusterHistory:
    """The default model at 1000 nodes x 30 days (no files)."""
    return run_model(SimulationConfig(nodes=1000, days=30, seed=1))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    out = tmp_path_factory.mktemp("planted")
    return out, simulate(PLANTED, out)


@pytest.fixture(scope="module")
def xid_lines(written: tuple[Path, Truth]) -> list[tuple[int, str, str, int]]:
    """``(ms, node, pci bus, xid)`` of every XID line of kernel.log."""
    out, _ = written
    lines = []
    for line in (out / "kernel.log").read_text().splitlines():
        match = XID_LINE_RE.match(line)
        if match is not None:
            lines.append((parse_ts(match["ts"]), match["node"], match["bus"], int(match["xid"])))
    return lines


@pytest.fixture(scope="module")
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


def _by_kind(truth: Truth, kind: str) -> list[FaultTruth]:
    return [fault for fault in truth.faults if fault.kind == kind]


def test_planted_runs_are_byte_identical(written: tuple[Path, Truth], tmp_path: Path) -> None:
    out, _ = written
    simulate(PLANTED, tmp_path)
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


def test_the_rate_split_keeps_the_cluster_rate() -> None:
    config = SimulationConfig(nodes=1000, days=30)
    rates = fault_rates(config, 15)
    cluster = rates.healthy + rates.lemon_extra * 15 / 1000 + rates.degradation
    assert cluster == pytest.approx(config.hardware_failure_rate)
    assert rates.lemon_extra == pytest.approx(14 * rates.healthy)
    assert 0.3 < rates.degradation < 0.7


def test_lemon_truth(written: tuple[Path, Truth]) -> None:
    _, truth = written
    lemons = _by_kind(truth, "lemon_node")
    assert [fault.node for fault in lemons] == list(truth.lemon_nodes) and len(lemons) == 1
    assert all(fault.onset_ms == truth.span_start_ms for fault in lemons)
    assert set(truth.healthy_nodes) == set(truth.config.node_names) - set(truth.lemon_nodes)
    assert [(f.onset_ms, f.fault_id) for f in truth.faults] == sorted(
        (f.onset_ms, f.fault_id) for f in truth.faults
    )


def test_degradations_rise_until_their_uncorrectable_error(
    written: tuple[Path, Truth],
    xid_lines: list[tuple[int, str, str, int]],
    dcgm: dict[tuple[str, str, int], list[tuple[int, int]]],
) -> None:
    _, truth = written
    degradations = _by_kind(truth, "ecc_degradation")
    critical = {fault.fault_id: fault for fault in _by_kind(truth, "critical_hw")}
    seen_xids = set(xid_lines)
    failed = 0
    for fault in degradations:
        assert fault.gpu is not None
        sbe = dcgm[("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", fault.node, fault.gpu)]
        stop = fault.failure_ms if fault.failure_ms is not None else truth.span_end_ms + 1
        rising = [(ts, value) for ts, value in sbe if fault.onset_ms <= ts < stop]
        assert rising and rising[0][0] == fault.onset_ms
        # No SBE error on the GPU before the degradation: the onset is the first rise.
        assert all(value == 0 for ts, value in sbe if ts < fault.onset_ms), fault.fault_id
        assert rising[0][1] > 0
        assert all(b[1] < a[1] for b, a in itertools.pairwise(rising)), fault.fault_id
        if fault.failure_ms is None:
            assert fault.details["critical_fault_id"] is None
            continue
        failed += 1
        dying = critical[fault.details["critical_fault_id"]]
        assert dying.onset_ms == fault.failure_ms and (dying.node, dying.gpu) == (fault.node, fault.gpu)
        assert (
            dying.details["source"] == "ecc_degradation" and dying.details["degradation_id"] == fault.fault_id
        )
        assert dying.xid in (48, 94, 95)
        assert (fault.failure_ms, fault.node, fault.pci_bus_id, dying.xid) in seen_xids
        dbe = dcgm[("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", fault.node, fault.gpu)]
        after = next(k for k, (ts, _) in enumerate(dbe) if ts >= fault.failure_ms)
        assert dbe[after][1] == dbe[after - 1][1] + 1
        assert fault.onset_ms < fault.failure_ms
    assert failed >= 3 and len(degradations) > failed


def test_storm_lines_are_on_one_gpu_within_the_storm(
    written: tuple[Path, Truth], xid_lines: list[tuple[int, str, str, int]]
) -> None:
    _, truth = written
    storms = _by_kind(truth, "xid_storm")
    assert len(storms) >= 5
    failures = {failure.job_id: failure for failure in truth.job_failures}
    for storm in storms:
        assert storm.xid in STORM_XIDS and storm.end_ms is not None
        inside = [
            line for line in xid_lines if line[1] == storm.node and storm.onset_ms <= line[0] <= storm.end_ms
        ]
        on_gpu = [line for line in inside if line[2] == storm.pci_bus_id and line[3] == storm.xid]
        assert len(on_gpu) >= storm.details["lines"] >= 2
        assert on_gpu[0][0] == storm.onset_ms and on_gpu[-1][0] == storm.end_ms
        # Other lines of the same code on the node within the storm: at most a stray one or two.
        assert sum(1 for line in inside if line[3] == storm.xid) - len(on_gpu) <= 2
        if storm.details["killed_job"]:
            assert storm.job_id is not None
            failure = failures[storm.job_id]
            assert failure.state is JobState.FAILED and not failure.hardware and failure.fault_id is None
            assert 0 < failure.end_ms - storm.end_ms <= 301_000
    assert any(storm.details["killed_job"] for storm in storms)


def test_flapping_lines_are_xid_144_on_the_named_node(
    written: tuple[Path, Truth], xid_lines: list[tuple[int, str, str, int]]
) -> None:
    _, truth = written
    flaps = _by_kind(truth, "nvlink_flapping")
    assert len(flaps) >= 3
    lines_144 = [line for line in xid_lines if line[3] == 144]
    for flap in flaps:
        assert flap.xid == 144 and flap.end_ms is not None
        mine = [
            line for line in lines_144 if line[1] == flap.node and flap.onset_ms <= line[0] <= flap.end_ms
        ]
        assert len(mine) == flap.details["lines"]
        assert mine[0][0] == flap.onset_ms and mine[-1][0] == flap.end_ms
        buses = [pci_bus_id(gpu) for gpu in flap.gpus]
        assert {line[2] for line in mine} == set(buses) and mine[0][2] == buses[0] == flap.pci_bus_id
        # Bursts for 6 to 48 hours (the last within 2 hours of the end), unless the span ends first.
        length = flap.end_ms - flap.onset_ms
        assert length <= 48 * HOUR + 10 * 60_000
        assert length >= 4 * HOUR or flap.end_ms > truth.span_end_ms - 48 * HOUR
    # Every XID 144 line belongs to a flapping link of its node.
    assert sum(flap.details["lines"] for flap in flaps) == len(lines_144)
    assert any(len(flap.gpus) >= 2 for flap in flaps)
    # No job dies of a flapping link: no job failure is attributed to one.
    hardware_ids = {failure.fault_id for failure in truth.job_failures if failure.hardware}
    assert not any(fault_id.startswith("flap-") for fault_id in hardware_ids if fault_id)


def test_maintenance_reboots_reset_counters_of_nodes_without_faults(
    written: tuple[Path, Truth], dcgm: dict[tuple[str, str, int], list[tuple[int, int]]]
) -> None:
    _, truth = written
    assert len(truth.maintenance) >= 5
    faulty = {fault.node for fault in truth.faults}
    assert not faulty & {item.node for item in truth.maintenance}
    resets: dict[str, list[int]] = defaultdict(list)
    for fault in truth.faults:
        if fault.repaired_ms is not None:
            resets[fault.node].append(fault.repaired_ms)
    maintained: dict[str, list[int]] = defaultdict(list)
    for item in truth.maintenance:
        maintained[item.node].append(item.reboot_ms)
    maintenance_drops = 0
    for (metric, node, _), samples in dcgm.items():
        for (before_ts, before), (after_ts, after) in itertools.pairwise(samples):
            if after >= before:
                continue
            assert metric in VOLATILE, (metric, node)
            if any(before_ts < ts <= after_ts for ts in maintained[node]):
                assert after == 0 or metric == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
                maintenance_drops += 1
            else:
                assert any(before_ts < ts <= after_ts for ts in resets[node]), (metric, node)
    assert maintenance_drops > 0
