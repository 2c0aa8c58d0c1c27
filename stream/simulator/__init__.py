"""Synthetic GPU cluster with known ground truth, written in real log formats.

:func:`simulate` runs the model (:func:`.history.run_model`), writes ``kernel.log``,
``sacct.txt`` and ``dcgm.prom`` (:mod:`.writers`) and the ground truth ``truth.json``
(:mod:`.truth`) into a directory. The same :class:`SimulationConfig` gives byte-identical files.

The package, by concept (each module imports only those above it, and the standard library,
numpy, orjson and :mod:`schemas`):

* :mod:`.config`: :class:`SimulationConfig`, the fleet's constants, PCI bus ids.
* :mod:`.events`: the leaf records, kernel lines and ECC counter events.
* :mod:`.workload`: the jobs users submit, and :class:`~.workload.JobRecord`.
* :mod:`.faults`: critical hardware faults, their templates and records.
* :mod:`.trace`: trace mode, a real cluster's fault trace as the critical faults and lemons
  (``SimulationConfig.fault_trace``; the trace's other faults are ``unobservable`` in the truth).
* :mod:`.planted`: planted faults (degradations, XID storms, flapping NVLinks, lemon nodes) and
  benign noise (maintenance reboots, SBE blips), one module per kind.
* :mod:`.scheduler`: the event-driven cluster (FIFO with EASY backfill) that runs the jobs and
  strikes the faults.
* :mod:`.kernel_lines`, :mod:`.ecc`: the evidence of the cluster's faults and jobs in the
  kernel log and the ECC counters.
* :mod:`.history`: :class:`~.history.ClusterHistory` and :func:`~.history.run_model`, which ties
  the above together.
* :mod:`.truth`, :mod:`.writers`: the ground truth and the files, from a history.
* :mod:`.matrix`: the scenario matrix (cells of fault shapes, scrape intervals, fleet sizes and
  histories; tuning and held-out seeds) that ``faultstream evaluate --matrix`` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stream.simulator.config import SimulationConfig
from stream.simulator.history import run_model
from stream.simulator.truth import FaultTruth, JobFailureTruth, Truth, build_truth
from stream.simulator.writers import write_dcgm, write_kernel_log, write_sacct

__all__ = [
    "DCGM_FILE",
    "KERNEL_LOG_FILE",
    "SACCT_FILE",
    "TRUTH_FILE",
    "FaultTruth",
    "JobFailureTruth",
    "SimulationConfig",
    "Truth",
    "simulate",
]

KERNEL_LOG_FILE = "kernel.log"
SACCT_FILE = "sacct.txt"
DCGM_FILE = "dcgm.prom"
TRUTH_FILE = "truth.json"


def simulate(
    config: SimulationConfig, out_dir: Path, progress: Callable[[int, int], None] | None = None
) -> Truth:
    """Simulate a cluster and write its telemetry and ground truth into ``out_dir``.

    Parameters
    ----------
    config
        Cluster size, span, seed and model knobs.
    out_dir
        Directory to write ``kernel.log``, ``sacct.txt``, ``dcgm.prom`` and ``truth.json`` into
        (created if missing; existing files are overwritten).
    progress
        Called as ``progress(done, total)`` after each step; the steps are the model, the kernel
        log, sacct, each DCGM scrape and the truth, so ``total = scrape_count + 4``.

    Returns
    -------
    Truth
        The ground truth, as written to ``truth.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    total = config.scrape_count + 4
    done = 0

    def step(count: int = 1) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    history = run_model(config)
    step()
    write_kernel_log(history, out_dir / KERNEL_LOG_FILE)
    step()
    write_sacct(history, out_dir / SACCT_FILE)
    step()
    write_dcgm(history, out_dir / DCGM_FILE, on_scrape=lambda _: step())
    truth = build_truth(history)
    truth.write(out_dir / TRUTH_FILE)
    step()
    return truth
