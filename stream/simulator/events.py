"""The leaf records of the simulated cluster: kernel lines and ECC counter events.

Written by the cluster's faults and jobs (:mod:`stream.simulator.kernel_lines`,
:mod:`stream.simulator.ecc`) and by the planted faults and benign noise
(:mod:`stream.simulator.planted`); read by :mod:`stream.simulator.writers`. This module imports no
other module of the package, so every one of them may import it.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np

__all__ = [
    "EccEvent",
    "EccEventKind",
    "KernelLine",
    "KernelLineKind",
    "XidRecord",
    "job_pid",
    "line_us",
]


class XidRecord(NamedTuple):
    """One ``NVRM: Xid`` kernel line; ``ts_us`` has a sub-millisecond part below 400 us, so
    rounding and truncating to milliseconds agree."""

    ts_us: int
    node: int
    gpu: int
    xid: int
    pid: int | None
    process: str


class KernelLineKind:
    """Kinds of the non-XID kernel lines."""

    NOISE: Final = 0  # benign kernel message; ``arg`` picks the template, ``variant`` its numbers
    BOOT_DRIVER: Final = 1  # "NVRM: loading NVIDIA UNIX x86_64 Kernel Module ..." after a reboot
    BOOT_NVLINK: Final = 2  # "nvidia-nvlink: Nvlink Core is being initialized ..." after a reboot
    GPU_AT: Final = 3  # "NVRM: GPU at PCI:<bus>: GPU-<uuid>" before a hardware XID; ``arg`` = GPU


class KernelLine(NamedTuple):
    """One non-XID kernel line (see :class:`KernelLineKind`)."""

    ts_us: int
    node: int
    kind: int
    arg: int
    variant: int


class EccEventKind:
    """Kinds of :class:`EccEvent`, in the order they apply at the same millisecond."""

    DBE: Final = 0  # one uncorrectable error on the GPU
    RETIRE_PENDING: Final = 1  # the GPU has a retirement/remap pending until the next reboot
    REMAP_FAILURE: Final = 2  # row remapping failed on the GPU
    REBOOT: Final = 3  # the node rebooted: volatile counters and pending flags reset (gpu = -1)
    GPU_REPLACED: Final = 4  # the GPU was replaced during the repair: remap failure clears
    SBE: Final = 5  # ``errors`` correctable (SBE) errors on the GPU


class EccEvent(NamedTuple):
    """A change of the ECC counters of a GPU (or of a whole node, for a reboot).

    ``errors`` is the number of errors of an :attr:`EccEventKind.SBE` event (1 for the others).
    """

    ts_ms: int
    kind: int
    node: int
    gpu: int
    errors: int = 1


def job_pid(job_index: int, node: int) -> int:
    """Return the deterministic pid of a job's training process on one of its nodes.

    >>> job_pid(0, 0)
    3000
    """
    return 3000 + (job_index * 2_654_435_761 + node * 40_503) % 4_000_000


def line_us(ts_ms: int, rng: np.random.Generator) -> int:
    """Return a microsecond time within ``ts_ms`` whose sub-millisecond part stays below 400 us.

    Kernel lines carry microseconds; keeping the fraction below 400 us makes rounding and
    truncating to milliseconds agree, so a line's millisecond is exactly its planted time.
    """
    return ts_ms * 1000 + int(rng.integers(0, 400))
