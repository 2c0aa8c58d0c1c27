"""Configuration of a simulated cluster: :class:`SimulationConfig` and the fleet's constants.

The leaf of the package: every other module of :mod:`stream.simulator` reads its knobs here, and
this module imports none of them. Durations use :mod:`schemas.timeutil`'s ``MINUTE_MS``,
``HOUR_MS`` and ``DAY_MS``; :data:`SECOND_MS` is the one unit the simulator adds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from schemas.timeutil import DAY_MS, MINUTE_MS

__all__ = [
    "DEFAULT_START_MS",
    "DEGRADATION_SHAPES",
    "DGX_A100_PCI_BUS_IDS",
    "FAULT_TRACES",
    "SECOND_MS",
    "SimulationConfig",
    "pci_bus_id",
]

#: One second in milliseconds. :mod:`schemas.timeutil` stops at the minute; the simulator also
#: needs whole seconds, the resolution of sacct's times.
SECOND_MS: Final = 1_000

#: 2024-01-01T00:00:00Z in epoch milliseconds.
DEFAULT_START_MS: Final = 1_704_067_200_000

#: How a degrading GPU's correctable (SBE) rate grows from its start to its failure
#: (:mod:`stream.simulator.planted.degradation`): ``step`` jumps to a steady high rate at once;
#: ``linear`` rises linearly (the count rises quadratically); ``exponential`` doubles every 6 h
#: to 1.6 days; ``quadratic`` starts at zero and rises with the square of the time (smooth, the
#: count barely moves on the first day); ``bursty`` logs a burst at its start, then stays quiet
#: until the failure; ``slow_boil`` rises linearly from a low rate to a moderate one (use with
#: 3 to 10 days); ``mixed`` draws one of the others per degradation.
DEGRADATION_SHAPES: Final[tuple[str, ...]] = (
    "step",
    "linear",
    "exponential",
    "quadratic",
    "bursty",
    "slow_boil",
    "mixed",
)

#: Real fault traces the simulator can replay as its critical fault process
#: (:attr:`SimulationConfig.fault_trace`; :mod:`stream.simulator.trace` reads them):
#: ``infinitehbd`` is InfiniteHBD-Trace, 584 faults on 400 GPU servers over 349 days.
FAULT_TRACES: Final[tuple[str, ...]] = ("infinitehbd",)

#: PCI bus ids of the eight GPUs of a DGX A100, in GPU index order.
DGX_A100_PCI_BUS_IDS: Final[tuple[str, ...]] = (
    "0000:07:00",
    "0000:0f:00",
    "0000:47:00",
    "0000:4e:00",
    "0000:87:00",
    "0000:90:00",
    "0000:b7:00",
    "0000:bd:00",
)


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """Parameters of a simulated cluster; the defaults model RSC-1 at a small scale.

    Every field is a plain scalar so that the configuration round-trips through ``truth.json``.
    """

    nodes: int = 64
    gpus_per_node: int = 8
    days: float = 7.0
    seed: int = 0
    cluster: str = "sim"
    start_ms: int = DEFAULT_START_MS
    ecc_interval_minutes: float = 360.0  # DCGM scrape period written to dcgm.prom (0.5: 30 s)
    hardware_failure_rate: float = 6.5  # critical faults per 1000 node-days of wall time, cluster-wide
    target_load: float = 0.85  # offered load: requested node-hours / node-hours of the span
    user_failed_fraction: float = 0.12  # jobs ending FAILED for user reasons (bugs, NCCL errors)
    user_cancelled_fraction: float = 0.06  # jobs cancelled by their user or an admin while running
    user_oom_fraction: float = 0.03  # jobs ending OUT_OF_MEMORY
    user_timeout_fraction: float = 0.03  # jobs reaching their own time limit (TIMEOUT)
    timelimit_hours: float = 72.0  # partition time limit: longer runs end TIMEOUT here
    max_job_fraction: float = 0.5  # largest job, as a share of the cluster's nodes
    backfill_depth: int = 64  # queued jobs one backfill pass examines (Slurm's bf_max_job_test)
    node_fail_fraction: float = 0.3  # share of hardware-killed jobs that end NODE_FAIL (rest FAILED)
    resubmit_probability: float = 0.9  # a killed job is resubmitted (rest of its work, from checkpoint)
    resubmit_delay_max_s: float = 600.0  # ... 60 s to this long after it ended
    kill_delay_min_s: float = 30.0  # a killed job ends this long after the fault, at the least
    kill_delay_max_s: float = 240.0  # ... and at the most (uniform)
    repair_min_hours: float = 2.0  # a faulty node is down this long, at the least
    repair_max_hours: float = 24.0  # ... and at the most (uniform), then it reboots
    gpu_replace_probability: float = 0.5  # repair of a row-remap failure replaces the GPU (flag clears)
    app_xid_failed_probability: float = 0.65  # jobs FAILED for user reasons that log application XIDs
    app_xid_healthy_probability: float = 0.02  # other jobs that log a transient application XID
    sbe_gpu_fraction: float = 0.03  # GPUs that accumulate correctable (SBE) errors
    sbe_rate_per_day: float = 4.0  # median SBE rate of those GPUs (lognormal spread, sigma 1)
    noise_lines_per_xid: float = 3.0  # benign non-XID kernel lines per XID line of faults and jobs
    sbe_blip_gpu_fraction: float = 0.03  # GPUs that log 1 to 3 SBE errors once in the span (benign)
    maintenance_rate: float = 5.0  # maintenance reboots per 1000 node-days, of nodes without faults
    lemon_node_fraction: float = 0.015  # lemon nodes (at least one from 50 nodes); 1.2% on RSC-1
    lemon_fault_multiplier: float = 15.0  # critical fault rate of a lemon / that of a healthy node
    lemon_node_fail_fraction: float = 0.7  # jobs killed by a lemon's extra faults that end NODE_FAIL
    lemon_extra_xids_per_day: float = 3.0  # extra application XIDs per lemon node-day (while busy)
    ecc_degradation_gpu_fraction: float = 0.003  # GPUs that start degrading (SBE rate rising) per 30 days
    ecc_degradation_failure_probability: float = 0.7  # degradations ending in an uncorrectable error
    ecc_degradation_min_days: float = 2.0  # a degradation grows this long before its failure, at least
    ecc_degradation_max_days: float = 7.0  # ... and at most (uniform)
    ecc_degradation_shape: str = "exponential"  # how the SBE rate grows: see DEGRADATION_SHAPES
    # > 0: every degradation began up to this many days before the span (uniform), so it is under
    # way when the history begins and the GPU's own past already holds its rise; 0: within the span
    ecc_degradation_underway_days: float = 0.0
    xid_storm_rate: float = 1.0  # XID storms per 1000 node-days (only on a node running a job)
    xid_storm_kill_probability: float = 0.5  # storms that kill their job (FAILED, user-looking)
    xid_storm_lines_min: int = 40  # lines of a storm, at least (log-uniform)
    xid_storm_lines_max: int = 400  # ... and at most
    xid_storm_minutes_min: float = 20.0  # a storm lasts this long, at least (uniform)
    xid_storm_minutes_max: float = 180.0  # ... and at most
    xid_storm_gpu_fraction: float = 0.0  # storms that are a faulty GPU's (hardware XID 92), not a job's
    nvlink_flapping_rate: float = 0.5  # flapping NVLink episodes per 1000 node-days
    nvlink_reset_burst_probability: float = 0.0  # reboots whose links log a burst of XID 144 going down
    dcgm_changed_only: bool = False  # write only DCGM series that changed since the last scrape
    crash_loop_users: int = 0  # users whose jobs crash wherever they run (application XIDs, FAILED)
    crash_loop_jobs_per_day: float = 24.0  # ... each submitting this many short single-node jobs a day
    crash_loop_pinned_users: int = 0  # ... of them, this many run every job on one node of their own
    # A name of FAULT_TRACES: the critical faults and lemons are that trace's (its fault times,
    # servers and classes; hardware_failure_rate and the lemon_* knobs are then not used); "": drawn
    fault_trace: str = ""
    crash_loop_failed_fraction: float = 1.0  # share of a crash-looping user's jobs that fail (rest complete)
    # > 0: a crash-looping job's failure logs 1 to this many lines on one GPU (a debug job's few
    # lines); 0: the failure burst of any job failing for user reasons (1 to 3 GPUs, 1 to 3 lines each)
    crash_loop_max_lines: int = 0

    def __post_init__(self) -> None:
        # Same value, same bytes: days=3 and days=3.0 must write the same truth.json. (The
        # annotations are strings, ``from __future__ import annotations``: hence "float".)
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, item.name, float(value))
        checks = (
            (self.nodes >= 1, "nodes must be >= 1"),
            (1 <= self.gpus_per_node <= 64, "gpus_per_node must be within 1..64"),
            (self.days > 0, "days must be > 0"),
            (self.ecc_interval_ms >= 1000, "ecc_interval_minutes must be at least 1/60 (a second)"),
            (self.hardware_failure_rate >= 0, "hardware_failure_rate must be >= 0"),
            (0 < self.target_load <= 2, "target_load must be within (0, 2]"),
            (self.timelimit_hours > 0, "timelimit_hours must be > 0"),
            (0 < self.max_job_fraction <= 1, "max_job_fraction must be within (0, 1]"),
            (self.backfill_depth >= 0, "backfill_depth must be >= 0"),
            (
                0 <= self.kill_delay_min_s <= self.kill_delay_max_s <= 300,
                "kill delay must be within 0..300 s",
            ),
            (0 < self.repair_min_hours <= self.repair_max_hours, "repair hours must be 0 < min <= max"),
            (self.resubmit_delay_max_s >= 60, "resubmit_delay_max_s must be >= 60"),
            (self.noise_lines_per_xid >= 0, "noise_lines_per_xid must be >= 0"),
            (self.sbe_rate_per_day >= 0, "sbe_rate_per_day must be >= 0"),
            (self.maintenance_rate >= 0, "maintenance_rate must be >= 0"),
            (self.lemon_fault_multiplier >= 1, "lemon_fault_multiplier must be >= 1"),
            (self.lemon_extra_xids_per_day >= 0, "lemon_extra_xids_per_day must be >= 0"),
            (
                0 < self.ecc_degradation_min_days <= self.ecc_degradation_max_days,
                "degradation days must be 0 < min <= max",
            ),
            (self.ecc_degradation_underway_days >= 0, "ecc_degradation_underway_days must be >= 0"),
            (self.xid_storm_rate >= 0, "xid_storm_rate must be >= 0"),
            (
                1 <= self.xid_storm_lines_min <= self.xid_storm_lines_max,
                "storm lines must be 1 <= min <= max",
            ),
            (
                0 < self.xid_storm_minutes_min <= self.xid_storm_minutes_max,
                "storm minutes must be 0 < min <= max",
            ),
            (
                self.ecc_degradation_shape in DEGRADATION_SHAPES,
                f"ecc_degradation_shape must be one of {', '.join(DEGRADATION_SHAPES)}",
            ),
            (self.nvlink_flapping_rate >= 0, "nvlink_flapping_rate must be >= 0"),
            (self.crash_loop_users >= 0, "crash_loop_users must be >= 0"),
            (self.crash_loop_jobs_per_day >= 0, "crash_loop_jobs_per_day must be >= 0"),
            (
                0 <= self.crash_loop_pinned_users <= min(self.crash_loop_users, self.nodes),
                "crash_loop_pinned_users must be within 0..crash_loop_users (and at most nodes)",
            ),
            (self.crash_loop_max_lines >= 0, "crash_loop_max_lines must be >= 0"),
            (self.cluster.strip() != "", "cluster must not be empty"),
            (
                self.fault_trace in ("", *FAULT_TRACES),
                f"fault_trace must be empty or one of {', '.join(FAULT_TRACES)}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        fractions = {
            "user_failed_fraction": self.user_failed_fraction,
            "user_cancelled_fraction": self.user_cancelled_fraction,
            "user_oom_fraction": self.user_oom_fraction,
            "user_timeout_fraction": self.user_timeout_fraction,
            "node_fail_fraction": self.node_fail_fraction,
            "resubmit_probability": self.resubmit_probability,
            "gpu_replace_probability": self.gpu_replace_probability,
            "app_xid_failed_probability": self.app_xid_failed_probability,
            "app_xid_healthy_probability": self.app_xid_healthy_probability,
            "sbe_gpu_fraction": self.sbe_gpu_fraction,
            "sbe_blip_gpu_fraction": self.sbe_blip_gpu_fraction,
            "lemon_node_fraction": self.lemon_node_fraction,
            "lemon_node_fail_fraction": self.lemon_node_fail_fraction,
            "ecc_degradation_gpu_fraction": self.ecc_degradation_gpu_fraction,
            "ecc_degradation_failure_probability": self.ecc_degradation_failure_probability,
            "xid_storm_kill_probability": self.xid_storm_kill_probability,
            "xid_storm_gpu_fraction": self.xid_storm_gpu_fraction,
            "nvlink_reset_burst_probability": self.nvlink_reset_burst_probability,
            "crash_loop_failed_fraction": self.crash_loop_failed_fraction,
        }
        for name, value in fractions.items():
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be within 0..1, got {value}")
        user = self.user_failed_fraction + self.user_cancelled_fraction
        if user + self.user_oom_fraction + self.user_timeout_fraction > 1:
            raise ValueError("the user failure fractions must add up to at most 1")

    @property
    def span_ms(self) -> int:
        """Length of the simulated span in milliseconds."""
        return round(self.days * DAY_MS)

    @property
    def end_ms(self) -> int:
        """End of the simulated span (epoch ms, exclusive for arrivals and faults)."""
        return self.start_ms + self.span_ms

    @property
    def ecc_interval_ms(self) -> int:
        """DCGM scrape period in milliseconds."""
        return round(self.ecc_interval_minutes * MINUTE_MS)

    @property
    def scrape_count(self) -> int:
        """Number of DCGM scrapes: at the start and every interval up to the end, inclusive."""
        return self.span_ms // self.ecc_interval_ms + 1

    @property
    def node_names(self) -> tuple[str, ...]:
        """``node0001`` ... (at least four digits, zero-padded)."""
        width = max(4, len(str(self.nodes)))
        return tuple(f"node{index + 1:0{width}d}" for index in range(self.nodes))


def pci_bus_id(gpu: int) -> str:
    """Return the canonical PCI bus id of GPU ``gpu`` of a node.

    The first eight are those of a DGX A100; a larger node continues in PCI domain 1.

    >>> pci_bus_id(3)
    '0000:4e:00'
    >>> pci_bus_id(9)
    '0001:09:00'
    """
    if gpu < len(DGX_A100_PCI_BUS_IDS):
        return DGX_A100_PCI_BUS_IDS[gpu]
    return f"0001:{gpu:02x}:00"
