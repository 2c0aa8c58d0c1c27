"""ECC rules: counter deltas that survive resets, and the findings that are always critical (SPEC 4.3).

ECC values are counters; what matters is how much they moved between two samples of one GPU.
A counter that went *down* was reset (GPU reset, reboot, board swap): the delta is then the new
value, the count since the reset, which never invents errors and never hides new ones.

Rules (NVIDIA's guidance and the paper):

* any increase of an uncorrectable count (volatile or aggregate DBE, uncorrectable remapped rows,
  pages retired for DBE) is ``critical``;
* a row-remap failure flag that becomes set is ``critical`` (the GPU needs an RMA);
* a pending page retirement or row remap that becomes set is ``critical`` (reset to apply).

The first sample of a GPU is its baseline: counts accumulated before we watched are history, not
news. Flags are read as state, so a flag already set in the first sample does raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from schemas.outputs import IncidentKind, Severity

__all__ = ["EccFinding", "EccStep", "ecc_step"]

#: Counters whose increase means an uncorrectable error reached the GPU's memory.
UNCORRECTABLE: Final = ("dbe_volatile", "dbe_aggregate", "remapped_rows_uncorrectable", "retired_pages_dbe")
#: 0/1 state flags, not counters.
FLAGS: Final = frozenset({"remap_failure", "remap_pending"})
#: Counters reported as gauges of pending work: read as "set" when > 0.
PENDING: Final = ("retired_pages_pending", "remap_pending")


@dataclass(frozen=True, slots=True)
class EccFinding:
    """A rule that fired on one sample.

    ``kind`` is the incident family shared with the XID classifier (``gpu_memory`` for XID 48/94/95
    and DBE counters, ``gpu_row_remap`` for XID 63/64 and the remap flags), so a fault seen both in
    the kernel log and in the counters is one incident with two kinds of evidence.
    """

    kind: IncidentKind
    severity: Severity
    title: str
    action: str
    counter_deltas: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class EccStep:
    """What one sample changed for its GPU.

    Attributes
    ----------
    deltas
        Increase of each counter present in both samples (after reset handling).
    reset
        True when some counter went down: the GPU's counters were reset since the last sample.
    findings
        The rules that fired.
    """

    deltas: Mapping[str, int]
    reset: bool
    findings: tuple[EccFinding, ...]


def ecc_step(previous: Mapping[str, int] | None, current: Mapping[str, int]) -> EccStep:
    """Compare a GPU's sample with its previous one.

    Parameters
    ----------
    previous
        Counters of the previous sample of the same GPU, or None for the first sample.
    current
        Counters of this sample.

    Examples
    --------
    >>> step = ecc_step({"dbe_volatile": 2, "sbe_volatile": 10}, {"dbe_volatile": 1, "sbe_volatile": 12})
    >>> step.reset, dict(step.deltas), [f.kind.value for f in step.findings]
    (True, {'dbe_volatile': 1, 'sbe_volatile': 2}, ['gpu_memory'])
    >>> ecc_step(None, {"dbe_aggregate": 5}).findings
    ()
    """
    if previous is not None and previous == current:
        return _UNCHANGED  # the common case: most GPUs never see an error
    deltas: dict[str, int] = {}
    reset = False
    if previous is not None:
        for name, value in current.items():
            if name in FLAGS:
                continue
            before = previous.get(name)
            if before is None:
                continue
            if value < before:
                reset = True
                if value > 0:
                    deltas[name] = value
            elif value > before:
                deltas[name] = value - before
    findings: list[EccFinding] = []
    uncorrectable = tuple((name, deltas[name]) for name in UNCORRECTABLE if deltas.get(name, 0) > 0)
    if uncorrectable:
        findings.append(
            EccFinding(
                IncidentKind.GPU_MEMORY,
                Severity.CRITICAL,
                "Uncorrectable ECC error",
                "RESET_GPU: drain the node, reset the GPU, run diagnostics before returning it",
                uncorrectable,
            )
        )
    if _became_set(previous, current, "remap_failure"):
        findings.append(
            EccFinding(
                IncidentKind.GPU_ROW_REMAP,
                Severity.CRITICAL,
                "Row remapping failed",
                "CONTACT_SUPPORT: drain the node, run field diagnostics, open an RMA",
                (("remap_failure", current["remap_failure"]),),
            )
        )
    pending = tuple((name, current[name]) for name in PENDING if _became_set(previous, current, name))
    if pending:
        findings.append(
            EccFinding(
                IncidentKind.GPU_ROW_REMAP,
                Severity.CRITICAL,
                "Pending page retirement / row remap",
                "RESET_GPU at the next drain: the pending retirement applies on reset",
                pending,
            )
        )
    return EccStep(deltas, reset, tuple(findings))


_UNCHANGED: Final = EccStep({}, False, ())


def _became_set(previous: Mapping[str, int] | None, current: Mapping[str, int], name: str) -> bool:
    if current.get(name, 0) <= 0:
        return False
    return previous is None or previous.get(name, 0) <= 0
