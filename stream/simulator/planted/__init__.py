"""Planted faults with onsets, and the benign noise around them: pure, seeded, no I/O.

:mod:`stream.simulator.history` runs the cluster; this package plans what it plants besides the
random critical hardware faults, and writes their evidence as kernel lines and ECC events. One
module per kind (each module's docstring describes its kind):

================  ==============================================  ============================
kind              what                                            module
================  ==============================================  ============================
ecc_degradation   SBE rate of a GPU grows to an uncorrectable     :mod:`.degradation`
                  error (a ``critical_hw`` fault of the cluster)
job_xid_storm     hundreds of application XIDs from one GPU of    :mod:`.storms`
                  a running job, which may die of it (the job's)
xid_storm         hundreds of hardware-class XIDs (92) from one   :mod:`.storms`
                  GPU, whatever job runs there (the GPU's)
nvlink_flapping   bursts of non-fatal XID 144 for hours           :mod:`.flapping`
lemon_node        a node failing ``lemon_fault_multiplier`` x as  :mod:`.lemons`
                  often, with extra application XIDs
================  ==============================================  ============================

Benign noise that no detector should flag (:mod:`.noise`): single SBE increments of 1 to 3 on a
few percent of the GPUs, maintenance reboots (volatile counters drop to 0) of nodes that have
no fault, and (when configured) a burst of NVLink XIDs as a rebooting node's links go down.

**Rate split.** ``hardware_failure_rate`` stays the cluster-wide rate of critical faults per 1000
node-days; :mod:`.rates` splits it between healthy nodes, lemons and degradation failures.

Determinism: every function draws from the generator it is given, in a fixed order.

The modules of this package import only :mod:`stream.simulator.config`,
:mod:`stream.simulator.events` and :mod:`stream.simulator.workload` (and each other), never the
cluster or the history that use them.
"""

from __future__ import annotations

from stream.simulator.planted.degradation import (
    DEGRADATION_FAILURE_TEMPLATES,
    FAULT_KIND_ECC_DEGRADATION,
    DegradationPlan,
    DegradationRecord,
    degradation_record,
    plan_degradations,
)
from stream.simulator.planted.flapping import (
    FAULT_KIND_NVLINK_FLAPPING,
    NVLINK_FLAP_XID,
    FlapRecord,
    plan_flapping,
)
from stream.simulator.planted.lemons import (
    FAULT_KIND_LEMON_NODE,
    LEMON_MIN_CLUSTER_NODES,
    choose_lemons,
    lemon_xids,
)
from stream.simulator.planted.noise import (
    RESET_BURST_XID,
    MaintenanceRecord,
    plan_maintenance,
    plan_reset_bursts,
    plan_sbe_blips,
)
from stream.simulator.planted.rates import FaultRates, fault_rates
from stream.simulator.planted.storms import (
    FAULT_KIND_JOB_XID_STORM,
    FAULT_KIND_XID_STORM,
    GPU_STORM_XIDS,
    STORM_XIDS,
    StormDraw,
    StormRecord,
    plan_storms,
    storm_evidence,
    storm_lines,
    storm_window,
)

__all__ = [
    "DEGRADATION_FAILURE_TEMPLATES",
    "FAULT_KIND_ECC_DEGRADATION",
    "FAULT_KIND_JOB_XID_STORM",
    "FAULT_KIND_LEMON_NODE",
    "FAULT_KIND_NVLINK_FLAPPING",
    "FAULT_KIND_XID_STORM",
    "GPU_STORM_XIDS",
    "LEMON_MIN_CLUSTER_NODES",
    "NVLINK_FLAP_XID",
    "RESET_BURST_XID",
    "STORM_XIDS",
    "DegradationPlan",
    "DegradationRecord",
    "FaultRates",
    "FlapRecord",
    "MaintenanceRecord",
    "StormDraw",
    "StormRecord",
    "choose_lemons",
    "degradation_record",
    "fault_rates",
    "lemon_xids",
    "plan_degradations",
    "plan_flapping",
    "plan_maintenance",
    "plan_reset_bursts",
    "plan_sbe_blips",
    "plan_storms",
    "storm_evidence",
    "storm_lines",
    "storm_window",
]
