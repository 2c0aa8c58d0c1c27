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


def test_a_reboot_may_log_one_burst_of_nvlink_xids_as_its_links_go_down() -> None:
    """The negative case of flapping: with ``nvlink_reset_burst_probability`` 1, every reboot
    (repair or maintenance) logs XID 144 on two or more GPUs within two seconds, and nothing else
    moves; with 0 (the default) none does."""
    import dataclasses

    from stream.simulator import SimulationConfig
    from stream.simulator.history import run_model

    plain = SimulationConfig(nodes=40, days=10, seed=3, maintenance_rate=40.0, nvlink_flapping_rate=0.0)
    resets = run_model(dataclasses.replace(plain, nvlink_reset_burst_probability=1.0))
    base = run_model(plain)
    assert not [x for x in base.xids if x.xid == 144]
    bursts = [x for x in resets.xids if x.xid == 144]
    reboots = [(m.ts_ms, m.node) for m in resets.maintenance]
    reboots += [
        (f.repaired_ms, f.node) for f in resets.faults if f.repaired_ms + 6_000 < resets.config.end_ms
    ]
    assert len(reboots) >= 5
    for ts_ms, node in reboots:
        lines = [x for x in bursts if x.node == node and ts_ms <= x.ts_us // 1000 < ts_ms + 2_000]
        assert len({x.gpu for x in lines}) >= 2 and all(x.pid is None for x in lines)
    assert [x for x in resets.xids if x.xid != 144] == list(base.xids) and resets.jobs == base.jobs
