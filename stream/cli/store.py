"""The store's commands: ``report`` (text, JSON or HTML), ``init-db``, ``query``; and ``config``.

``config`` lists the settings, among them where the store is.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from stream.cli.common import (
    Commands,
    add_command,
    add_mttf_window_argument,
    add_store_arguments,
    print_json,
    settings_from_args,
)
from stream.settings import Settings

__all__ = [
    "add_config_parser",
    "add_init_db_parser",
    "add_query_parser",
    "add_report_parser",
    "run_config",
    "run_init_db",
    "run_query",
    "run_report",
]


def add_report_parser(commands: Commands) -> None:
    """Add ``report`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    report = add_command(
        commands,
        "report",
        help="print incidents, MTTF windows and ETTR guidance from the store",
        example="faultstream report --html report.html",
    )
    report.add_argument("--json", action="store_true", help="print JSON")
    report.add_argument("--top", type=int, default=20, help="open critical incidents to list (--json)")
    add_mttf_window_argument(report)
    report.add_argument(
        "--fleet-window",
        default="auto",
        choices=["auto", "day", "week", "month", "quarter"],
        help="fleet reliability (hardware failures, MTBF) per calendar window, UTC; auto: about a dozen",
    )
    report.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML report (charts, incidents, lemon nodes, XID mix) to FILE",
    )
    report.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
    )
    add_store_arguments(report)
    report.set_defaults(handler=run_report)


def add_init_db_parser(commands: Commands) -> None:
    """Add ``init-db`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    init_db = add_command(
        commands,
        "init-db",
        help="create the database and tables (idempotent)",
        example="faultstream init-db --clickhouse http://clickhouse:8123",
    )
    add_store_arguments(init_db)
    init_db.set_defaults(handler=run_init_db)


def add_query_parser(commands: Commands) -> None:
    """Add ``query`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    query = add_command(
        commands,
        "query",
        help="run SQL on the store and print the rows as JSON Lines",
        example='faultstream query "SELECT kind, count() FROM faultstream.incidents FINAL GROUP BY kind"',
    )
    query.add_argument("sql", help="a SELECT; tables live in database `faultstream` (FAULTSTREAM_DATABASE)")
    add_store_arguments(query)
    query.set_defaults(handler=run_query)


def add_config_parser(commands: Commands) -> None:
    """Add ``config`` (no options).

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    config = add_command(
        commands,
        "config",
        help="list every setting, its environment variable and default; or check a configuration",
        example="faultstream config --check /etc/faultstream/faultstream.toml",
    )
    config.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="FILE",
        help="check the configuration (FILE, else --config or FAULTSTREAM_CONFIG_FILE, under the "
        "environment): one line per problem, exit 1 if there is any; else its detector fingerprint",
    )
    config.set_defaults(handler=run_config)


def run_report(args: argparse.Namespace) -> int:
    """Build the report from the store and print it (text or ``--json``) or write it (``--html``).

    Parameters
    ----------
    args
        The parsed ``report`` command line.

    Returns
    -------
    int
        The exit code: 0 (an unwritable ``--html`` file raises ``ValueError`` before any query).
    """
    from tqdm import tqdm

    from stream.reports.text import REPORT_STEPS, build_report, render_text
    from stream.sinks.store import connect

    settings = settings_from_args(args)
    if args.html is not None:
        from stream.reports.html import check_writable

        check_writable(args.html)  # before the queries, not after
    disable = None if args.progress is None else not args.progress
    with tqdm(total=len(REPORT_STEPS), desc="report", unit="step", disable=disable) as bar:

        def progress(step: str) -> None:  # called as each step starts: the ones before are done
            bar.update(REPORT_STEPS.index(step) - bar.n)
            bar.set_postfix_str(step)

        report = build_report(
            connect(settings), settings, top=args.top, progress=progress, fleet_window=args.fleet_window
        )
        bar.update(bar.total - bar.n)
    if args.html is not None:
        from stream.reports.html import write_html

        size = write_html(report, args.html)
        (sys.stderr if args.json else sys.stdout).write(
            f"Wrote {args.html} ({size / 1024:,.0f} KiB) from {report['store']}\n"
        )
    if args.json:
        print_json(report)
    elif args.html is None:
        sys.stdout.write(render_text(report, args.mttf_window) + "\n")
    return 0


def run_init_db(args: argparse.Namespace) -> int:
    """Create the database and its tables (idempotent) and say how many statements ran.

    Parameters
    ----------
    args
        The parsed ``init-db`` command line.

    Returns
    -------
    int
        The exit code: 0.
    """
    from stream.sinks.store import connect, init_db, redact_dsn

    settings = settings_from_args(args)
    statements = init_db(connect(settings, apply_schema=False), settings)
    sys.stdout.write(
        f"{redact_dsn(settings.dsn)}: {len(statements)} DDL statements applied to {settings.database}\n"
    )
    return 0


def run_query(args: argparse.Namespace) -> int:
    """Run the SQL on the store and print each row as one line of JSON.

    Parameters
    ----------
    args
        The parsed ``query`` command line.

    Returns
    -------
    int
        The exit code: 0.

    Raises
    ------
    StoreError
        When ClickHouse refuses the SQL: its one-line message, no traceback (exit code 4).
    """
    from clickhouse_connect.driver.exceptions import DatabaseError

    from stream.sinks.store import StoreError, clickhouse_message, connect, query_rows

    settings = settings_from_args(args)
    client = connect(settings)
    try:
        rows = query_rows(client, args.sql)
    except DatabaseError as exc:  # the SQL's fault, not the program's: ClickHouse says what is wrong
        raise StoreError(f"query failed: {clickhouse_message(exc)}") from None
    for row in rows:
        sys.stdout.write(orjson.dumps(row, default=str).decode() + "\n")
    return 0


def run_config(args: argparse.Namespace) -> int:
    """Print every setting (its environment variable, its default and what it does), or check a
    configuration (``--check``).

    Parameters
    ----------
    args
        The parsed ``config`` command line.

    Returns
    -------
    int
        The exit code: 0, or 1 when ``--check`` found problems.
    """
    if args.check is not None:
        from stream.configuration import check_configuration, fingerprint

        settings, problems = check_configuration(os.environ, Path(args.check) if args.check else None)
        for problem in problems:
            sys.stdout.write(f"{problem}\n")
        if settings is None:
            sys.stderr.write(f"faultstream: {len(problems)} problem(s) in the configuration\n")
            return 1
        print_fingerprint = fingerprint(settings.core_config(), settings.xid_overrides())
        sys.stdout.write(f"configuration OK: detector fingerprint {print_fingerprint}\n")
        return 0
    for name, default, doc in Settings.reference():
        sys.stdout.write(f"{name} (default {default})\n    {doc}\n")
    return 0
