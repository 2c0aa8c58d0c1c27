"""The kernel lines of the cluster's faults and jobs."""

from __future__ import annotations

from stream.simulator.history import ClusterHistory
from stream.simulator.kernel_lines import APPLICATION_XIDS


def test_application_xids_dominate(mid: ClusterHistory) -> None:
    application = sum(1 for record in mid.xids if record.xid in APPLICATION_XIDS)
    assert application / len(mid.xids) > 0.5
    hardware_codes = {record.xid for record in mid.xids} - set(APPLICATION_XIDS)
    assert hardware_codes >= {79, 48, 74}
