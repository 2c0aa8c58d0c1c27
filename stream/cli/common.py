"""What the command modules share: exit codes, the store options, settings from options, JSON output.

Kept apart from :mod:`stream.cli.main` because ``main`` imports every command module: the command
modules import this one, never ``main``, so there is no import cycle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TypeAlias

import orjson

from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings

__all__ = [
    "EXIT_DEAD_LETTERS",
    "EXIT_KAFKA",
    "EXIT_STORE",
    "EXIT_USAGE",
    "Commands",
    "add_command",
    "add_input_arguments",
    "add_mttf_window_argument",
    "add_store_arguments",
    "parse_options_from_args",
    "parse_time_argument",
    "print_json",
    "progress_bar",
    "settings_from_args",
]

EXIT_USAGE = 2
EXIT_DEAD_LETTERS = 3
EXIT_STORE = 4
EXIT_KAFKA = 5

#: What ``ArgumentParser.add_subparsers`` returns: each command module adds its commands to it.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_command(
    commands: Commands, name: str, *, help: str, example: str, description: str | None = None
) -> argparse.ArgumentParser:
    """Add a subcommand whose ``--help`` says what it is for in one line and shows one example.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    name
        The command's name.
    help
        What it is for, one line (``faultstream --help`` lists it beside the name).
    example
        One command line that uses it, starting with ``faultstream``.
    description
        A longer first paragraph for the command's own ``--help`` (default: ``help``).

    Returns
    -------
    argparse.ArgumentParser
        The command's parser, for its options.
    """
    return commands.add_parser(
        name,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--clickhouse`` and ``--data-dir``, the options of every command that uses the store.

    Parameters
    ----------
    parser
        The command's parser.
    """
    parser.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="chdb:///abs/path (embedded) or http(s)://host:8123; default: FAULTSTREAM_CLICKHOUSE_DSN, "
        "else the embedded store in --data-dir",
    )
    parser.add_argument("--data-dir", help="embedded store folder (default ./faultstream-data)")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the input files and how to read them, the options of every command that replays files.

    Parameters
    ----------
    parser
        The command's parser (``replay``, ``diff``).
    """
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="kernel logs, sacct -P, DCGM text, nvidia-smi -q, JSONL; or folders of them",
    )
    parser.add_argument(
        "--cluster", help="cluster name for records that carry none (default: FAULTSTREAM_CLUSTER)"
    )
    parser.add_argument("--node", help="node name for kernel logs and nvidia-smi files without a host field")
    parser.add_argument(
        "--year", type=int, help="year of syslog / journalctl-short timestamps, which have none"
    )
    parser.add_argument(
        "--boot-time", type=parse_time_argument, help="boot time (ISO) of a plain dmesg file's node"
    )
    parser.add_argument(
        "--scrape-time", type=parse_time_argument, help="time (ISO) of DCGM samples without timestamps"
    )
    parser.add_argument(
        "--timezone", default="UTC", help="zone of sacct and dmesg -T local times (default UTC)"
    )
    parser.add_argument(
        "--format", choices=[f.value for f in Format], help="force one input format for all files"
    )


def parse_options_from_args(args: argparse.Namespace, settings: Settings) -> ParseOptions:
    """The parser options of :func:`add_input_arguments`' command line.

    Parameters
    ----------
    args
        The parsed command line.
    settings
        The settings (the cluster and GPUs per node records that state none get).

    Returns
    -------
    ParseOptions
        How to read the files.
    """
    return ParseOptions(
        cluster=args.cluster or settings.cluster,
        node=args.node,
        year=args.year,
        boot_time_ms=args.boot_time,
        scrape_time_ms=args.scrape_time,
        gpus_per_node=settings.gpus_per_node,
        timezone=args.timezone,
    )


def add_mttf_window_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--mttf-window``, which MTTF table a text report shows.

    Parameters
    ----------
    parser
        The command's parser (``replay``, ``report``).
    """
    parser.add_argument(
        "--mttf-window",
        default="auto",
        metavar="LENGTH",
        help="MTTF table of the text report: auto (1d windows for weeks of data, 1h for a day or two), "
        "a window length (1h, 1d) or all",
    )


def parse_time_argument(value: str) -> int:
    """An option's ISO time in epoch milliseconds (an argparse ``type``).

    Parameters
    ----------
    value
        The option's text.

    Returns
    -------
    int
        Milliseconds since the epoch (UTC).

    Raises
    ------
    argparse.ArgumentTypeError
        If ``value`` is not a time, so that argparse reports a usage error (exit code 2).
    """
    try:
        return parse_ts(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings: the environment, overridden by the command's store options (and ``--cluster``).

    Parameters
    ----------
    args
        The parsed command line; ``--clickhouse`` and ``--data-dir`` if the command has them, and
        ``--cluster`` of ``replay``.

    Returns
    -------
    Settings
        The settings to run the command with.
    """
    return Settings.from_env(
        clickhouse_dsn=getattr(args, "clickhouse", None),
        data_dir=getattr(args, "data_dir", None),
        cluster=getattr(args, "cluster", None) if args.command == "replay" else None,
    )


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on standard output (what ``--json`` prints).

    Parameters
    ----------
    data
        Plain data; values JSON has no type for (times, paths) are printed as their ``str``.
    """
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def progress_bar(enabled: bool | None, desc: str = "replay") -> tuple[Any, Any]:
    """A bar of the bytes read and the callback that moves it; ``None`` shows it on a terminal only."""
    from tqdm import tqdm

    bar = tqdm(
        total=0, unit="B", unit_scale=True, desc=desc, disable=None if enabled is None else not enabled
    )

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return bar, update
