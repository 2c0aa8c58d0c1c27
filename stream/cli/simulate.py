"""The simulator's commands: ``simulate`` (a synthetic cluster's logs and truth) and ``evaluate``.

``evaluate`` scores the incidents in the store against the truth ``simulate`` wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stream.cli.common import (
    Commands,
    add_command,
    add_store_arguments,
    parse_time_argument,
    print_json,
    settings_from_args,
)

__all__ = ["add_evaluate_parser", "add_simulate_parser", "run_evaluate", "run_simulate"]


def add_simulate_parser(commands: Commands) -> None:
    """Add ``simulate`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    simulate = add_command(
        commands,
        "simulate",
        help="write a synthetic cluster's logs and its ground truth",
        example="faultstream simulate --nodes 1000 --days 30 --seed 1 --out /tmp/sim",
    )
    simulate.add_argument("--nodes", type=int, default=64)
    simulate.add_argument("--gpus-per-node", type=int, default=8)
    simulate.add_argument("--days", type=float, default=7.0)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--cluster", default="sim")
    simulate.add_argument(
        "--start", type=parse_time_argument, help="first instant (ISO, default 2024-01-01T00:00:00Z)"
    )
    simulate.add_argument("--ecc-interval-minutes", type=int, help="DCGM scrape period (default 360)")
    simulate.add_argument(
        "--dcgm-changed-only",
        action="store_true",
        help="after the first scrape, write only the DCGM series that changed (files 50-100x smaller)",
    )
    simulate.add_argument(
        "--crash-loop-users",
        type=int,
        default=0,
        help="users whose jobs crash wherever they run, with application XIDs (default 0)",
    )
    simulate.add_argument("--out", type=Path, required=True, help="output folder")
    simulate.set_defaults(handler=run_simulate)


def add_evaluate_parser(commands: Commands) -> None:
    """Add ``evaluate`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    evaluate = add_command(
        commands,
        "evaluate",
        help="score the store's incidents against a simulator's truth.json",
        example="faultstream evaluate --truth /tmp/sim/truth.json --clickhouse chdb:///tmp/sim-store",
    )
    evaluate.add_argument(
        "--truth", type=Path, required=True, help="truth.json written by `faultstream simulate`"
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    add_store_arguments(evaluate)
    evaluate.set_defaults(handler=run_evaluate)


def run_simulate(args: argparse.Namespace) -> int:
    """Simulate the cluster, write its logs and truth to ``--out``, and print the true failure rate.

    Parameters
    ----------
    args
        The parsed ``simulate`` command line.

    Returns
    -------
    int
        The exit code: 0.
    """
    from tqdm import tqdm

    from stream.simulator import SimulationConfig, simulate

    overrides: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "days": args.days,
        "seed": args.seed,
        "cluster": args.cluster,
    }
    if args.start is not None:
        overrides["start_ms"] = args.start
    if args.ecc_interval_minutes is not None:
        overrides["ecc_interval_minutes"] = args.ecc_interval_minutes
    if args.dcgm_changed_only:
        overrides["dcgm_changed_only"] = True
    if args.crash_loop_users:
        overrides["crash_loop_users"] = args.crash_loop_users
    config = SimulationConfig(**overrides)
    with tqdm(total=0, desc="simulate", disable=None) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        truth = simulate(config, args.out, progress=progress)
    sys.stdout.write(
        f"Wrote {args.out}: {truth.jobs:,} jobs, {truth.jobs_failed:,} failed, {truth.hardware_failures:,} "
        f"killed by hardware; true r_f = {truth.true_rf_per_1000_node_days:.2f} per 1000 node-days over "
        f"{truth.exposure_node_days:,.0f} node-days of exposure\n"
    )
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """Score the store's incidents against the simulator's truth and print the scores (text or JSON).

    Parameters
    ----------
    args
        The parsed ``evaluate`` command line.

    Returns
    -------
    int
        The exit code: 0.
    """
    from stream.reports.evaluation import evaluate_store, render_evaluation
    from stream.simulator.truth import Truth
    from stream.sinks.store import connect

    settings = settings_from_args(args)
    result = evaluate_store(connect(settings), settings, Truth.load(args.truth))
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(render_evaluation(result) + "\n")
    return 0
