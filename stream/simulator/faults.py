"""Critical hardware faults: their kinds, causes and templates, as planned and as they happened.

A critical fault logs a hardware-class XID on one GPU of a node, may change its ECC counters, and
takes the node out for a repair; a job running there dies minutes later. The cluster
(:mod:`stream.simulator.scheduler`) strikes each :class:`FaultPlan` and records a
:class:`FaultRecord`; :mod:`stream.simulator.kernel_lines` and :mod:`stream.simulator.ecc` write
its evidence from the :class:`HardwareFaultTemplate` it drew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from schemas.timeutil import MINUTE_MS

__all__ = [
    "FAULT_KIND_CRITICAL_HW",
    "FAULT_QUIET_AFTER_END_MS",
    "FAULT_SOURCE_BASE",
    "FAULT_SOURCE_ECC_DEGRADATION",
    "FAULT_SOURCE_LEMON",
    "FAULT_SOURCE_TRACE",
    "FAULT_TEMPLATES_BY_NAME",
    "HARDWARE_FAULT_TEMPLATES",
    "LEMON_FAULT_TEMPLATES",
    "FaultPlan",
    "FaultRecord",
    "HardwareFaultTemplate",
]

#: A fault is postponed while the last job on its node ended less than this long ago, so that a
#: job's attribution window (10 min before to 5 min after its end) never catches a fault that
#: did not kill it.
FAULT_QUIET_AFTER_END_MS: Final = 6 * MINUTE_MS

#: Kind of the critical hardware faults (the truth's ``faults[].kind``); the other kinds are in
#: :mod:`stream.simulator.planted`.
FAULT_KIND_CRITICAL_HW: Final = "critical_hw"

#: What caused a critical fault (:attr:`FaultRecord.source`): the random faults every node has,
#: the extra faults of a lemon node, the uncorrectable error that ends a degradation, a fault of a
#: real cluster's trace (:mod:`stream.simulator.trace`).
FAULT_SOURCE_BASE: Final = "base"
FAULT_SOURCE_LEMON: Final = "lemon"
FAULT_SOURCE_ECC_DEGRADATION: Final = "ecc_degradation"
FAULT_SOURCE_TRACE: Final = "trace"


class HardwareFaultTemplate(NamedTuple):
    """One kind of hardware fault: the XIDs it logs and its effect on the ECC counters.

    Attributes
    ----------
    name
        Short name, kept in the truth's fault ``details``.
    xids
        XID codes logged, the first at the onset, the others 0.5 to 3 s apart.
    weight
        Share of hardware faults of this kind.
    dbe
        Adds one uncorrectable (DBE) error to the volatile and aggregate counters.
    retire_pending
        Sets ``RETIRED_PENDING`` until the next reboot.
    remap_failure
        Sets ``ROW_REMAP_FAILURE``; a reboot clears it only if the GPU was replaced.
    """

    name: str
    xids: tuple[int, ...]
    weight: float
    dbe: bool = False
    retire_pending: bool = False
    remap_failure: bool = False


#: The hardware faults and their shares (the paper's most frequent hardware XIDs).
HARDWARE_FAULT_TEMPLATES: Final[tuple[HardwareFaultTemplate, ...]] = (
    HardwareFaultTemplate("fallen_off_bus", (79,), 0.22),
    HardwareFaultTemplate("dbe", (48, 63), 0.10, dbe=True, retire_pending=True),
    # A DBE whose damage the GPU contained: the driver logs the DBE (48, critical) and the
    # containment (94, which NVIDIA resolves by restarting the program: warn here).
    HardwareFaultTemplate("contained_ecc", (48, 94), 0.10, dbe=True),
    HardwareFaultTemplate("uncontained_ecc", (95,), 0.08, dbe=True),
    HardwareFaultTemplate("nvlink", (74,), 0.18),
    HardwareFaultTemplate("gsp_rpc_timeout", (119,), 0.14),
    HardwareFaultTemplate("gsp_task_timeout", (120,), 0.06),
    HardwareFaultTemplate("row_remap_failure", (63, 64), 0.07, retire_pending=True, remap_failure=True),
    HardwareFaultTemplate("row_remap_failure_direct", (64,), 0.05, remap_failure=True),
)

#: The extra faults of lemon nodes: the bus, GSP and micro-controller faults that take a node
#: out with its job (mostly NODE_FAIL).
LEMON_FAULT_TEMPLATES: Final[tuple[HardwareFaultTemplate, ...]] = (
    HardwareFaultTemplate("fallen_off_bus", (79,), 0.45),
    HardwareFaultTemplate("gsp_rpc_timeout", (119,), 0.35),
    HardwareFaultTemplate("micro_controller_halt", (62,), 0.20),
)
#: Every template by its name (the name a :class:`FaultRecord` keeps).
FAULT_TEMPLATES_BY_NAME: Final[dict[str, HardwareFaultTemplate]] = {
    template.name: template for template in (*HARDWARE_FAULT_TEMPLATES, *LEMON_FAULT_TEMPLATES)
}


class FaultPlan(NamedTuple):
    """A critical fault to strike a node: its cause and, for a degradation, GPU and template.

    The cluster strikes it at ``onset_ms``, or a few minutes later when a job just ended on the
    node (:data:`FAULT_QUIET_AFTER_END_MS`).
    """

    onset_ms: int
    node: int
    source: str
    gpu: int = -1  # -1: drawn at the onset among the GPUs of the running job
    template: str = ""  # "": drawn from the mix of the source
    degradation: int = -1  # DegradationPlan.index of a degradation failure
    repair_ms: int = -1  # when the node comes back (6 min after the strike at least); -1: drawn
    trace: int = -1  # TraceFault.index of a fault from a trace


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """A hardware fault planted on one GPU.

    Attributes
    ----------
    onset_ms
        Time of the first XID line (millisecond precision).
    job_index
        Index of the job running on the node at the onset, else ``None``.
    killed_job
        True when this fault killed that job (a second fault on a job that is already dying
        does not kill it again).
    repaired_ms
        When the node came back and rebooted (may lie after the span).
    gpu_replaced
        The repair replaced the GPU (clears ``ROW_REMAP_FAILURE``).
    source
        :data:`FAULT_SOURCE_BASE`, :data:`FAULT_SOURCE_LEMON` (an extra fault of a lemon node) or
        :data:`FAULT_SOURCE_ECC_DEGRADATION` (the failure ending degradation ``degradation``).
    degradation
        :attr:`~stream.simulator.planted.degradation.DegradationPlan.index` of that degradation (its
        ``deg-N`` id in the truth is ``index + 1``), else ``None``.
    trace
        :attr:`~stream.simulator.trace.TraceFault.index` of the trace's fault it is
        (:data:`FAULT_SOURCE_TRACE`), else ``None``.
    """

    index: int
    kind: str
    template: str
    node: int
    gpu: int
    xids: tuple[int, ...]
    onset_ms: int
    job_index: int | None
    killed_job: bool
    repaired_ms: int
    gpu_replaced: bool
    source: str = FAULT_SOURCE_BASE
    degradation: int | None = None
    trace: int | None = None
