"""ECC degradations: the SBE counter rises at every scrape until the uncorrectable error."""

from __future__ import annotations

import itertools
from pathlib import Path

from stream.simulator import FaultTruth, Truth


def test_degradations_rise_until_their_uncorrectable_error(
    written: tuple[Path, Truth],
    faults_by_kind: dict[str, list[FaultTruth]],
    xid_lines: list[tuple[int, str, str, int]],
    dcgm: dict[tuple[str, str, int], list[tuple[int, int]]],
) -> None:
    _, truth = written
    degradations = faults_by_kind["ecc_degradation"]
    critical = {fault.fault_id: fault for fault in faults_by_kind["critical_hw"]}
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
