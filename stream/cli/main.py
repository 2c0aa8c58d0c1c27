"""The ``faultstream`` command line: the argument parser and the entry point.

Each command lives in the module of its family, which adds its parser and sets its handler
(``set_defaults(handler=...)``); this module wires them in the order ``--help`` lists them and
turns the errors every command may raise into exit codes. Heavy modules (the store client, Faust,
the simulator) are imported inside the handlers, so that ``faultstream --help`` starts fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from stream.cli import agent, diff, explain, kafka, replay, simulate, slurm, store
from stream.cli.common import EXIT_DEAD_LETTERS, EXIT_KAFKA, EXIT_STORE, EXIT_USAGE
from stream.kafka.security import KafkaAccessError
from stream.settings import CONFIG_FILE_VARIABLE, SettingsError
from stream.sinks.dead_letters import DeadLetterLimitExceeded
from stream.sinks.errors import StoreError

__all__ = [
    "EXIT_DEAD_LETTERS",
    "EXIT_KAFKA",
    "EXIT_STORE",
    "EXIT_USAGE",
    "build_parser",
    "main",
    "package_version",
]


def package_version() -> str:
    """The installed package's version (``pyproject.toml``), or ``unknown`` when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("faultstream")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the commands in README).

    Returns
    -------
    argparse.ArgumentParser
        The ``faultstream`` parser; a parsed command line's ``handler`` runs its command.
    """
    parser = argparse.ArgumentParser(
        prog="faultstream",
        description="Streaming reliability monitor for GPU clusters: XID, ECC and job events to incidents "
        "and MTTF windows in ClickHouse.",
        epilog="example:\n  faultstream replay examples/sim-48x14/logs\n\n"
        "`faultstream COMMAND --help` says what a command is for and shows an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a TOML file of settings (FAULTSTREAM_CONFIG_FILE); the environment wins over it, a command's "
        "flags over both: docs/configuration.md",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    # `faultstream --help` lists the commands in the order they are added: replay and report first,
    # whatever their family.
    replay.add_replay_parser(commands)
    store.add_report_parser(commands)
    diff.add_diff_parser(commands)
    kafka.add_init_kafka_parser(commands)
    kafka.add_worker_parser(commands)
    kafka.add_receive_parser(commands)
    kafka.add_tail_parser(commands)
    kafka.add_notify_parser(commands)
    slurm.add_slurm_jobs_parser(commands)
    slurm.add_remediate_parser(commands)
    agent.add_agent_parser(commands)
    store.add_init_db_parser(commands)
    simulate.add_simulate_parser(commands)
    simulate.add_evaluate_parser(commands)
    store.add_query_parser(commands)
    store.add_config_parser(commands)
    explain.add_explain_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``faultstream`` console script.

    Parameters
    ----------
    argv
        The arguments after the program name; ``None`` reads ``sys.argv``.

    Returns
    -------
    int
        The exit code: 0, or ``EXIT_USAGE`` (bad settings, options or input files),
        ``EXIT_DEAD_LETTERS`` (too many unusable records), ``EXIT_STORE`` (ClickHouse failed) or
        ``EXIT_KAFKA`` (Kafka cannot be reached or refuses us, or ``tail``'s options). argparse
        itself exits with 2 on a usage error.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="faultstream: %(message)s")
    before = os.environ.get(CONFIG_FILE_VARIABLE)
    if args.config is not None:  # read by every Settings.from_env of the command
        os.environ[CONFIG_FILE_VARIABLE] = str(args.config)
    try:
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except (SettingsError, FileNotFoundError, ValueError) as exc:
        sys.stderr.write(f"faultstream: error: {exc}\n")
        return EXIT_USAGE
    except DeadLetterLimitExceeded as exc:
        sys.stderr.write(f"faultstream: stopped: {exc}\n")
        return EXIT_DEAD_LETTERS
    except KafkaAccessError as exc:
        sys.stderr.write(f"faultstream: Kafka: {exc}\n")
        return EXIT_KAFKA
    except StoreError as exc:
        sys.stderr.write(f"faultstream: ClickHouse: {exc}\n")
        return EXIT_STORE
    except BrokenPipeError:  # `faultstream report | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0
    finally:
        # As it was (main() runs in tests' processes too: a --config must not outlive its command).
        if args.config is not None:
            if before is None:
                os.environ.pop(CONFIG_FILE_VARIABLE, None)
            else:
                os.environ[CONFIG_FILE_VARIABLE] = before


if __name__ == "__main__":
    raise SystemExit(main())
