"""``faultstream replay``: log files through the detectors into the store, or onto Kafka with ``--to``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stream.cli.common import (
    Commands,
    add_command,
    add_input_arguments,
    add_mttf_window_argument,
    add_store_arguments,
    parse_options_from_args,
    print_json,
    progress_bar,
    settings_from_args,
)
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings

__all__ = ["add_replay_parser", "run_replay"]


def add_replay_parser(commands: Commands) -> None:
    """Add ``replay`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    replay = add_command(
        commands,
        "replay",
        help="replay log files through the detectors into ClickHouse, then print the report",
        example="faultstream replay examples/sim-48x14/logs",
    )
    add_input_arguments(replay)
    replay.add_argument("--dead-letters", type=Path, help="also write dead letters to this JSONL file")
    replay.add_argument(
        "--to",
        metavar="kafka://HOST:PORT",
        help="publish to the input topics for the workers instead of detecting in this process",
    )
    replay.add_argument(
        "--rate", type=float, help="with --to: records per second (default: as fast as possible)"
    )
    replay.add_argument(
        "--records-per-message",
        type=_positive_int,
        default=256,
        metavar="N",
        help="with --to: records per Kafka message, newline-delimited (default 256; 1: one record a message)",
    )
    replay.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help="the fleet's nodes (a list, a CSV node[,gpus][,model], or scontrol show nodes --oneliner): "
        "fleet MTBF counts them all (default FAULTSTREAM_INVENTORY_FILE, else the nodes the inputs name)",
    )
    replay.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_mttf_window_argument(replay)
    replay.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
    )
    add_store_arguments(replay)
    replay.set_defaults(handler=run_replay)


def _kafka_address(value: str) -> str:
    if not value.startswith("kafka://") or not value[len("kafka://") :]:
        raise ValueError(f"--to must look like kafka://HOST:PORT, got {value!r}")
    return value[len("kafka://") :]


def run_replay(args: argparse.Namespace) -> int:
    """Replay the files into the store and print what was read, what was found, and the report.

    With ``--to``, publish the records to Kafka's input topics instead, for the workers.

    Parameters
    ----------
    args
        The parsed ``replay`` command line.

    Returns
    -------
    int
        The exit code: 0 (errors are raised and turned into exit codes by :func:`stream.cli.main.main`).
    """
    from stream.gc_tuning import tune_for_streaming
    from stream.replay import replay
    from stream.reports.text import build_report, render_text
    from stream.sinks.store import connect

    settings = settings_from_args(args)
    options = parse_options_from_args(args, settings)
    if args.to:
        return _publish(args, settings.with_overrides(kafka_bootstrap=_kafka_address(args.to)), options)
    inventory_path = args.inventory or (Path(settings.inventory_file) if settings.inventory_file else None)
    inventory = None
    if inventory_path is not None:
        from stream.sinks.inventory import read_inventory

        inventory = read_inventory(inventory_path)  # a bad one stops the replay before it starts
    client = connect(settings)
    if inventory is not None:
        from stream.sinks.inventory import write_inventory

        write_inventory(client, settings.database, options.cluster, inventory, str(inventory_path))
    tune_for_streaming()
    dead_letter_file = args.dead_letters
    if dead_letter_file is None and settings.is_embedded:
        dead_letter_file = Path(settings.data_dir) / "dead-letters.jsonl"
    from stream.configuration import describe, fingerprint

    detectors = fingerprint(settings.core_config(), settings.xid_overrides())
    sys.stderr.write(f"faultstream: detector configuration {describe(settings, detectors)}\n")
    bar, update = progress_bar(args.progress)
    try:
        summary = replay(
            args.files,
            settings,
            client,
            options,
            fmt=Format(args.format) if args.format else None,
            progress=update,
            dead_letter_file=dead_letter_file,
            inventory=[node.node for node in inventory or ()],
        )
    finally:
        bar.close()
    report = build_report(client, settings)
    per_source: list[dict[str, Any]] = [
        {
            "file": s.path,
            "format": s.fmt,
            "records": dict(s.records),
            "dead_letters": s.dead_letters,
            "late": s.late,
            "notes": s.notes,
            "first_dead_letter": s.first_reason,
        }
        for s in summary.sources
    ]
    by_kind = sorted(summary.incidents_by_kind().items())
    if args.json:
        print_json(
            {
                "sources": per_source,
                "detector_configuration": detectors,
                "events": summary.events,
                "dead_letters": summary.dead_letters,
                "seconds": summary.seconds,
                "events_per_second": summary.events / summary.seconds if summary.seconds else None,
                "incidents_this_run": [{"kind": k, "severity": s, "incidents": n} for (k, s), n in by_kind],
                "attributions_this_run": dict(summary.attributions),
                "report": report,
            }
        )
        return 0
    out = sys.stdout
    out.write(
        f"Replayed {len(summary.sources)} files in {summary.seconds:.1f} s ({summary.events:,} events, "
        f"{summary.events / max(summary.seconds, 1e-9):,.0f} events/s)\n"
    )
    for source in per_source:
        records = ", ".join(f"{n:,} {kind}" for kind, n in sorted(source["records"].items())) or "no records"
        trouble = [f"{source[k]:,} {k.replace('_', ' ')}" for k in ("dead_letters", "late") if source[k]]
        out.write(f"  {source['file']} [{source['format']}]: {records}{'; ' if trouble else ''}")
        out.write(", ".join(trouble) + "\n")
        for note in source["notes"]:
            out.write(f"    note: {note}\n")
        if not source["records"] and source["first_dead_letter"]:  # nothing read: say why at once
            out.write(f"    first dead letter: {source['first_dead_letter']}\n")
    if summary.dead_letters and dead_letter_file is not None:
        out.write(f"Dead letters also written to {dead_letter_file}\n")
    store_counts = {(r["kind"], r["severity"]): r["incidents"] for r in report["incidents"]}
    if dict(by_kind) != store_counts:  # the store held incidents before: say which are this run's
        out.write("Incidents from this replay: ")
        out.write(", ".join(f"{k}/{s} {n:,}" for (k, s), n in by_kind) or "none")
        out.write("\n")
    out.write("\n" + render_text(report, args.mttf_window) + "\n")
    return 0


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


def _publish(args: argparse.Namespace, settings: Settings, options: ParseOptions) -> int:
    """``replay --to``: publish the files' records to the input topics for the workers."""
    import asyncio

    from stream.kafka.publish import publish
    from stream.kafka.reachable import wait_for_kafka

    # A wrong password or certificate: one line, at once; a broker not up yet: waited for.
    asyncio.run(wait_for_kafka(settings, "replay --to"))
    bar, update = progress_bar(args.progress)
    try:
        summary = asyncio.run(
            publish(
                args.files,
                settings,
                options,
                fmt=Format(args.format) if args.format else None,
                rate=args.rate,
                progress=update,
                records_per_message=args.records_per_message,
            )
        )
    finally:
        bar.close()
    total = sum(summary.sent.values())
    if args.json:
        print_json(
            {
                "kafka": settings.kafka_bootstrap,
                "sent": summary.sent,
                "messages": summary.messages,
                "dead_letters": summary.dead_letters,
                "seconds": summary.seconds,
                "notes": {source.path: source.notes for source in summary.sources if source.notes},
            }
        )
        return 0
    for source in summary.sources:
        for note in source.notes:
            sys.stdout.write(f"{source.path}: note: {note}\n")
    sys.stdout.write(
        f"Published {total:,} records to {settings.kafka_bootstrap} in {summary.seconds:.1f} s "
        f"({total / max(summary.seconds, 1e-9):,.0f}/s): "
        + ", ".join(f"{topic} {n:,}" for topic, n in sorted(summary.sent.items()))
        + f" in {sum(summary.messages.values()):,} messages"
        + f"; {summary.dead_letters:,} to {settings.topic_dead_letters}\n"
    )
    return 0
