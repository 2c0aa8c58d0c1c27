"""Flapping NVLinks: bursts of XID 144 on the named node and GPUs, killing no job."""

from __future__ import annotations

from pathlib import Path

from schemas.timeutil import HOUR_MS, MINUTE_MS
from stream.simulator import FaultTruth, Truth
from stream.simulator.config import pci_bus_id


def test_flapping_lines_are_xid_144_on_the_named_node(
    written: tuple[Path, Truth],
    faults_by_kind: dict[str, list[FaultTruth]],
    xid_lines: list[tuple[int, str, str, int]],
) -> None:
    _, truth = written
    flaps = faults_by_kind["nvlink_flapping"]
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
        assert length <= 48 * HOUR_MS + 10 * MINUTE_MS
        assert length >= 4 * HOUR_MS or flap.end_ms > truth.span_end_ms - 48 * HOUR_MS
    # Every XID 144 line belongs to a flapping link of its node.
    assert sum(flap.details["lines"] for flap in flaps) == len(lines_144)
    assert any(len(flap.gpus) >= 2 for flap in flaps)
    # No job dies of a flapping link: no job failure is attributed to one.
    hardware_ids = {failure.fault_id for failure in truth.job_failures if failure.hardware}
    assert not any(fault_id.startswith("flap-") for fault_id in hardware_ids if fault_id)
