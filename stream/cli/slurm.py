"""The Slurm commands: ``slurm-jobs`` (job events from sacct) and ``remediate`` (gated node drains)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from stream.cli.common import EXIT_USAGE, Commands, add_command, add_store_arguments, parse_time_argument
from stream.settings import Settings

__all__ = ["add_remediate_parser", "add_slurm_jobs_parser", "run_remediate", "run_slurm_jobs"]


def _slurm_commands(settings: Settings):  # type: ignore[no-untyped-def]
    from stream.slurm.commands import SlurmCommands

    return SlurmCommands(settings.slurm_bin_dir, settings.slurm_command_timeout_seconds)


def add_slurm_jobs_parser(commands: Commands) -> None:
    """Add ``slurm-jobs`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    jobs = add_command(
        commands,
        "slurm-jobs",
        help="publish a running Slurm's job state changes (polled from sacct) to the jobs topic",
        description="On the Slurm controller (any host whose sacct reaches slurmdbd): polls sacct over "
        "overlapping windows and publishes each job's start and end once, as `replay --to` sends a sacct "
        "file; a restart resumes from its cursor file. For Slurm 23.02+, jobcomp/kafka can write to the "
        "jobs topic instead: docs/slurm.md.",
        example="faultstream slurm-jobs --kafka 127.0.0.1:9092 --cursor /var/lib/faultstream/slurm.cursor",
    )
    jobs.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    jobs.add_argument(
        "--cursor", type=Path, help="cursor file (default FAULTSTREAM_SLURM_CURSOR_FILE, else in --data-dir)"
    )
    jobs.add_argument("--data-dir", help="folder of the default cursor file (default ./faultstream-data)")
    jobs.add_argument(
        "--since",
        type=parse_time_argument,
        metavar="TIME",
        help="start the first window here (ISO time), whatever the cursor says: a backfill",
    )
    jobs.add_argument("--once", action="store_true", help="one successful poll, then exit")
    jobs.set_defaults(handler=run_slurm_jobs)


def run_slurm_jobs(args: argparse.Namespace) -> int:
    """Publish job state changes until SIGTERM or Ctrl-C (or after one poll with ``--once``).

    Returns
    -------
    int
        0, or ``EXIT_USAGE`` for an unreadable cursor file.
    """
    import asyncio

    from stream.kafka.reachable import wait_for_kafka
    from stream.slurm.collector import run_collector
    from stream.slurm.ledger import Cursor, CursorError

    logging.getLogger("faultstream").setLevel(logging.INFO)
    settings = Settings.from_env(kafka_bootstrap=args.kafka, data_dir=args.data_dir)
    cursor = args.cursor or Path(settings.slurm_cursor_file or Path(settings.data_dir) / "slurm-jobs.cursor")
    try:
        if args.since is not None:
            Cursor(cursor).save(args.since + int(settings.slurm_overlap_seconds * 1000))
        Cursor(cursor).load()
    except CursorError as exc:
        sys.stderr.write(f"faultstream slurm-jobs: error: {exc}\n")
        return EXIT_USAGE
    asyncio.run(wait_for_kafka(settings, "slurm-jobs"))
    published = asyncio.run(run_collector(settings, _slurm_commands(settings), cursor, once=args.once))
    if args.once:
        print(f"published {published} job event(s) to {settings.topic_jobs}")
    return 0


def add_remediate_parser(commands: Commands) -> None:
    """Add ``remediate`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    remediate = add_command(
        commands,
        "remediate",
        help="drain the nodes of critical incidents in Slurm, through a circuit breaker (dry run by default)",
        description="Reads the incidents topic (its own consumer group) and drains the node of each critical "
        "hardware incident or lemon verdict with scontrol, once per incident, through a breaker; every "
        "decision goes to the `remediations` table. Without --execute it changes nothing in Slurm. Needs a "
        "Slurm operator account: docs/slurm.md.",
        example="faultstream remediate --kafka 127.0.0.1:9092 --clickhouse http://clickhouse:8123 --execute",
    )
    remediate.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    add_store_arguments(remediate)
    remediate.add_argument(
        "--execute",
        action="store_true",
        help="drain in Slurm (default: a dry run; FAULTSTREAM_REMEDIATE_EXECUTE)",
    )
    remediate.add_argument(
        "--reset-breaker",
        action="store_true",
        help="reset an open breaker at start (audited); SIGUSR1 does it live",
    )
    remediate.set_defaults(handler=run_remediate)


def run_remediate(args: argparse.Namespace) -> int:
    """Remediate until SIGTERM or Ctrl-C.

    Returns
    -------
    int
        0, or ``EXIT_USAGE`` for a policy the settings cannot make.
    """
    import asyncio

    from stream.kafka.reachable import wait_for_kafka
    from stream.sinks.store import connect
    from stream.slurm.remediate import policy_of
    from stream.slurm.remediate import run_remediate as serve

    logging.getLogger("faultstream").setLevel(logging.INFO)
    settings = Settings.from_env(
        kafka_bootstrap=args.kafka, clickhouse_dsn=args.clickhouse, data_dir=args.data_dir
    )
    try:
        policy = policy_of(settings, args.execute)
    except ValueError as exc:
        sys.stderr.write(f"faultstream remediate: error: {exc}\n")
        return EXIT_USAGE
    client = connect(settings)
    asyncio.run(wait_for_kafka(settings, "remediate"))
    asyncio.run(serve(settings, policy, _slurm_commands(settings), client, args.reset_breaker))
    return 0
