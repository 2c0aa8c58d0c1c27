"""The simulator's commands: ``simulate`` (a synthetic cluster's logs and truth) and ``evaluate``.

``evaluate`` scores the incidents in the store against the truth ``simulate`` wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
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
    simulate.add_argument("--nodes", type=int, help="fleet (default 64; --fault-trace: the trace's)")
    simulate.add_argument("--gpus-per-node", type=int, default=8)
    simulate.add_argument("--days", type=float, help="span (default 7; --fault-trace: the trace's)")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--cluster", default="sim")
    simulate.add_argument(
        "--start", type=parse_time_argument, help="first instant (ISO, default 2024-01-01T00:00:00Z)"
    )
    simulate.add_argument(
        "--ecc-interval-minutes", type=float, help="DCGM scrape period (default 360; 0.5 is 30 s)"
    )
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
    simulate.add_argument(
        "--crash-loop-pinned-users",
        type=int,
        default=0,
        help="of those, how many run every job on one node of their own, where it crashes again and "
        "again while other users' jobs there complete (default 0)",
    )
    simulate.add_argument(
        "--xid-storm-gpu-fraction",
        type=float,
        help="share of the XID storms that are a faulty GPU's (hardware XID 92), not a job's own "
        "application XIDs (default 0)",
    )
    simulate.add_argument(
        "--fault-trace",
        metavar="NAME",
        help="a real cluster's fault process instead of drawn critical faults and lemons: its fault times, "
        "servers and classes, on its fleet from its first day (infinitehbd: 584 faults on 400 GPU servers "
        "over 349 days; docs/detection.md); no other planted faults",
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
        help="score the store's incidents against a simulator's truth.json (--matrix: the scenario matrix)",
        example="faultstream evaluate --truth /tmp/sim/truth.json --clickhouse chdb:///tmp/sim-store",
    )
    evaluate.add_argument("--truth", type=Path, help="truth.json written by `faultstream simulate`")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.add_argument(
        "--baselines",
        action="store_true",
        help="also score each detector beside simple baseline rules (XID > 0, any DBE, fixed thresholds)",
    )
    evaluate.add_argument(
        "--matrix",
        type=Path,
        metavar="WORK_DIR",
        help="run the simulator's scenario matrix in WORK_DIR (simulate, replay, score each cell) and "
        "print the table; --truth and the store options are not used",
    )
    evaluate.add_argument("--quick", action="store_true", help="with --matrix: only the quick cells (CI)")
    evaluate.add_argument("--cells", nargs="+", metavar="CELL", help="with --matrix: only these cells")
    evaluate.add_argument(
        "--seeds",
        default="held-out",
        help="with --matrix: 'held-out' (default), 'tuning', or comma-separated seeds",
    )
    evaluate.add_argument(
        "--table-out", type=Path, help="with --matrix: also write the table (Markdown) here"
    )
    evaluate.add_argument(
        "--html",
        type=Path,
        help="with --matrix: also write a page with the table and a precision/recall chart",
    )
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
    from stream.simulator.trace import TRACES, trace_overrides

    overrides: dict[str, Any] = {"nodes": 64, "days": 7.0}
    if args.fault_trace:
        if args.fault_trace not in TRACES:
            known = ", ".join(TRACES)
            raise SystemExit(f"faultstream simulate: no fault trace {args.fault_trace!r} (known: {known})")
        overrides.update(trace_overrides(args.fault_trace))
    given = {"nodes": args.nodes, "days": args.days}
    overrides.update({name: value for name, value in given.items() if value is not None})
    overrides.update({"gpus_per_node": args.gpus_per_node, "seed": args.seed, "cluster": args.cluster})
    if args.start is not None:
        overrides["start_ms"] = args.start
    if args.ecc_interval_minutes is not None:
        overrides["ecc_interval_minutes"] = args.ecc_interval_minutes
    if args.dcgm_changed_only:
        overrides["dcgm_changed_only"] = True
    if args.crash_loop_users:
        overrides["crash_loop_users"] = args.crash_loop_users
    if args.crash_loop_pinned_users:
        overrides["crash_loop_pinned_users"] = args.crash_loop_pinned_users
    if args.xid_storm_gpu_fraction is not None:
        overrides["xid_storm_gpu_fraction"] = args.xid_storm_gpu_fraction
    try:
        config = SimulationConfig(**overrides)
    except ValueError as error:
        raise SystemExit(f"faultstream simulate: {error}") from None
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
    if config.fault_trace:
        kinds = Counter(fault.kind for fault in truth.faults)
        sys.stdout.write(
            f"Fault trace {config.fault_trace}: {kinds['critical_hw']:,} critical faults telemetry shows, "
            f"{kinds['unobservable']:,} it cannot show (in truth.json, not scored), "
            f"{len(truth.lemon_nodes)} lemons\n"
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
    if args.matrix is not None:
        return _run_matrix(args)
    if args.truth is None:
        raise SystemExit("faultstream evaluate: --truth is required (or --matrix WORK_DIR)")
    from stream.reports.evaluation import evaluate_store, render_evaluation
    from stream.simulator.truth import Truth
    from stream.sinks.store import connect

    settings = settings_from_args(args)
    result = evaluate_store(connect(settings), settings, Truth.load(args.truth), baselines=args.baselines)
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(render_evaluation(result) + "\n")
    return 0


def _run_matrix(args: argparse.Namespace) -> int:
    """``evaluate --matrix``: every cell and seed, then the table (and JSON with ``--json``)."""
    from stream.reports.matrix import render_matrix, run_matrix, write_matrix_html
    from stream.simulator.matrix import HELD_OUT_SEEDS, QUICK_CELLS, TUNING_SEEDS, cells_named

    if args.seeds == "held-out":
        seeds: tuple[int, ...] = HELD_OUT_SEEDS[:1] if args.quick else HELD_OUT_SEEDS
    elif args.seeds == "tuning":
        seeds = TUNING_SEEDS
    else:
        seeds = tuple(int(item) for item in args.seeds.split(","))
    names = tuple(args.cells) if args.cells else (QUICK_CELLS if args.quick else None)
    cells = cells_named(names)
    args.matrix.mkdir(parents=True, exist_ok=True)
    results = run_matrix(cells, seeds, args.matrix, progress=lambda name: sys.stderr.write(f"cell {name}\n"))
    table = render_matrix(results, seeds)
    (args.matrix / "matrix.json").write_text(json.dumps(results, indent=1, default=str))
    if args.table_out is not None:
        args.table_out.write_text(table + "\n")
    if args.html is not None:
        write_matrix_html(results, seeds, args.html)
    if args.json:
        print_json(results)
    else:
        sys.stdout.write(table + "\n")
    return 0
