"""Benign noise: maintenance reboots reset the counters of nodes without faults."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

from stream.simulator import Truth

# Series that drop at a reboot (the remap-failure flag at a repair that replaced the GPU).
VOLATILE = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)


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
