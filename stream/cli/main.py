"""The ``faultstream`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings, SettingsError
from stream.sinks.dead_letters import DeadLetterLimitExceeded
from stream.sinks.store import StoreError

EXIT_USAGE = 2
EXIT_DEAD_LETTERS = 3
EXIT_STORE = 4
EXIT_KAFKA = 5


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="chdb:///abs/path (embedded) or http(s)://host:8123; default: FAULTSTREAM_CLICKHOUSE_DSN, "
        "else the embedded store in --data-dir",
    )
    parser.add_argument("--data-dir", help="embedded store folder (default ./faultstream-data)")


def _time(value: str) -> int:
    try:
        return parse_ts(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the commands in README)."""
    parser = argparse.ArgumentParser(
        prog="faultstream",
        description="Streaming reliability monitor for GPU clusters: XID, ECC and job events to incidents "
        "and MTTF windows in ClickHouse.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="replay log files through the detectors into ClickHouse")
    replay.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="kernel logs, sacct -P, DCGM text, nvidia-smi -q, JSONL; or folders of them",
    )
    replay.add_argument(
        "--cluster", help="cluster name for records that carry none (default: FAULTSTREAM_CLUSTER)"
    )
    replay.add_argument("--node", help="node name for kernel logs and nvidia-smi files without a host field")
    replay.add_argument(
        "--year", type=int, help="year of syslog / journalctl-short timestamps, which have none"
    )
    replay.add_argument("--boot-time", type=_time, help="boot time (ISO) of a plain dmesg file's node")
    replay.add_argument("--scrape-time", type=_time, help="time (ISO) of DCGM samples without timestamps")
    replay.add_argument(
        "--timezone", default="UTC", help="zone of sacct and dmesg -T local times (default UTC)"
    )
    replay.add_argument(
        "--format", choices=[f.value for f in Format], help="force one input format for all files"
    )
    replay.add_argument("--dead-letters", type=Path, help="also write dead letters to this JSONL file")
    replay.add_argument(
        "--to",
        metavar="kafka://HOST:PORT",
        help="publish to the input topics for the workers instead of detecting in this process",
    )
    replay.add_argument(
        "--rate", type=float, help="with --to: records per second (default: as fast as possible)"
    )
    replay.add_argument("--json", action="store_true", help="print the summary as JSON")
    replay.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
    )
    _store_arguments(replay)

    report = commands.add_parser(
        "report", help="print incidents, MTTF windows and ETTR guidance from the store"
    )
    report.add_argument("--json", action="store_true", help="print JSON")
    report.add_argument("--top", type=int, default=20, help="open critical incidents to list")
    report.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML report (charts, incidents, lemon nodes, XID mix) to FILE",
    )
    report.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
    )
    _store_arguments(report)

    init_kafka = commands.add_parser(
        "init-kafka", help="create the Kafka topics with their configs (idempotent)"
    )
    init_kafka.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )

    worker = commands.add_parser(
        "worker", help="run a Faust worker: Kafka input topics -> detectors -> outputs"
    )
    worker.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    _store_arguments(worker)

    tail = commands.add_parser(
        "tail",
        help="follow the incidents topic: one line per incident update, filtered, colourised",
        description="The SRE console: incidents as the workers publish them. Repeats of an update "
        "already shown (at-least-once delivery) are dropped.",
    )
    tail.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    tail.add_argument("--topic", help="incidents topic (default FAULTSTREAM_TOPIC_INCIDENTS)")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--since",
        default="1h",
        help="start with incidents published in the last 15m / 2h / 1d, or since an ISO time (default 1h)",
    )
    start.add_argument("--from-beginning", action="store_true", help="start at the oldest retained message")
    tail.add_argument(
        "--no-follow", action="store_true", help="stop at the end of the topic instead of waiting for more"
    )
    tail.add_argument("--severity", help="only these severities, comma-separated: critical,warn,info")
    tail.add_argument("--kind", help="only these kinds, comma-separated shell patterns (xid_*,lemon_node)")
    tail.add_argument("--node", help="only these nodes, comma-separated shell patterns (node01*)")
    tail.add_argument("--json", action="store_true", help="print each incident message as JSON, one per line")
    tail.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour by severity (default auto)",
    )

    init_db = commands.add_parser("init-db", help="create the database and tables (idempotent)")
    _store_arguments(init_db)

    simulate = commands.add_parser("simulate", help="write a synthetic cluster's logs and its ground truth")
    simulate.add_argument("--nodes", type=int, default=64)
    simulate.add_argument("--gpus-per-node", type=int, default=8)
    simulate.add_argument("--days", type=float, default=7.0)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--cluster", default="sim")
    simulate.add_argument("--start", type=_time, help="first instant (ISO, default 2024-01-01T00:00:00Z)")
    simulate.add_argument("--ecc-interval-minutes", type=int, help="DCGM scrape period (default 360)")
    simulate.add_argument(
        "--dcgm-changed-only",
        action="store_true",
        help="after the first scrape, write only the DCGM series that changed (files 50-100x smaller)",
    )
    simulate.add_argument("--out", type=Path, required=True, help="output folder")

    evaluate = commands.add_parser(
        "evaluate", help="score the store's incidents against a simulator's truth.json"
    )
    evaluate.add_argument(
        "--truth", type=Path, required=True, help="truth.json written by `faultstream simulate`"
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    _store_arguments(evaluate)

    query = commands.add_parser("query", help="run SQL on the store and print the rows as JSON Lines")
    query.add_argument("sql", help="a SELECT; tables live in database `faultstream` (FAULTSTREAM_DATABASE)")
    _store_arguments(query)

    commands.add_parser("config", help="list every setting, its environment variable and default")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        clickhouse_dsn=getattr(args, "clickhouse", None),
        data_dir=getattr(args, "data_dir", None),
        cluster=getattr(args, "cluster", None) if args.command == "replay" else None,
    )


def _print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def _progress_bar(enabled: bool | None) -> tuple[Any, Any]:
    from tqdm import tqdm

    bar = tqdm(
        total=0, unit="B", unit_scale=True, desc="replay", disable=None if enabled is None else not enabled
    )

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return bar, update


def _kafka_address(value: str) -> str:
    if not value.startswith("kafka://") or not value[len("kafka://") :]:
        raise ValueError(f"--to must look like kafka://HOST:PORT, got {value!r}")
    return value[len("kafka://") :]


def _cmd_replay(args: argparse.Namespace) -> int:
    from stream.replay import replay
    from stream.reports.text import build_report, render_text
    from stream.sinks.store import connect

    settings = _settings(args)
    options = ParseOptions(
        cluster=settings.cluster,
        node=args.node,
        year=args.year,
        boot_time_ms=args.boot_time,
        scrape_time_ms=args.scrape_time,
        gpus_per_node=settings.gpus_per_node,
        timezone=args.timezone,
    )
    if args.to:
        return _publish(args, settings.with_overrides(kafka_bootstrap=_kafka_address(args.to)), options)
    client = connect(settings)
    dead_letter_file = args.dead_letters
    if dead_letter_file is None and settings.is_embedded:
        dead_letter_file = Path(settings.data_dir) / "dead-letters.jsonl"
    bar, update = _progress_bar(args.progress)
    try:
        summary = replay(
            args.files,
            settings,
            client,
            options,
            fmt=Format(args.format) if args.format else None,
            progress=update,
            dead_letter_file=dead_letter_file,
        )
    finally:
        bar.close()
    report = build_report(client, settings)
    per_source = [
        {
            "file": s.path,
            "format": s.fmt,
            "records": dict(s.records),
            "dead_letters": s.dead_letters,
            "late": s.late,
        }
        for s in summary.sources
    ]
    by_kind = sorted(summary.incidents_by_kind().items())
    if args.json:
        _print_json(
            {
                "sources": per_source,
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
    out.write(f"Replayed {len(summary.sources)} files in {summary.seconds:.1f} s ")
    out.write(f"({summary.events:,} events, {summary.events / max(summary.seconds, 1e-9):,.0f} events/s)\n")
    for source in per_source:
        records = ", ".join(f"{n:,} {kind}" for kind, n in sorted(source["records"].items())) or "no records"
        out.write(
            f"  {source['file']} [{source['format']}]: {records}; {source['dead_letters']:,} dead letters, "
            f"{source['late']:,} late\n"
        )
    if summary.dead_letters and dead_letter_file is not None:
        out.write(f"Dead letters also written to {dead_letter_file}\n")
    out.write("Incidents from this replay: ")
    out.write(", ".join(f"{k}/{s} {n:,}" for (k, s), n in by_kind) or "none")
    out.write("\n\n")
    out.write(render_text(report) + "\n")
    return 0


def _publish(args: argparse.Namespace, settings: Settings, options: ParseOptions) -> int:
    import asyncio

    from stream.kafka.publish import publish

    bar, update = _progress_bar(args.progress)
    try:
        summary = asyncio.run(
            publish(
                args.files,
                settings,
                options,
                fmt=Format(args.format) if args.format else None,
                rate=args.rate,
                progress=update,
            )
        )
    finally:
        bar.close()
    total = sum(summary.sent.values())
    if args.json:
        _print_json(
            {
                "kafka": settings.kafka_bootstrap,
                "sent": summary.sent,
                "dead_letters": summary.dead_letters,
                "seconds": summary.seconds,
            }
        )
        return 0
    sys.stdout.write(
        f"Published {total:,} records to {settings.kafka_bootstrap} in {summary.seconds:.1f} s "
        f"({total / max(summary.seconds, 1e-9):,.0f}/s): "
        + ", ".join(f"{topic} {n:,}" for topic, n in sorted(summary.sent.items()))
        + f"; {summary.dead_letters:,} to {settings.topic_dead_letters}\n"
    )
    return 0


def _cmd_init_kafka(args: argparse.Namespace) -> int:
    import asyncio

    from stream.kafka.publish import create_topics

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    for topic, outcome in asyncio.run(create_topics(settings)):
        sys.stdout.write(f"{topic}: {outcome}\n")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from stream.worker.app import run_worker

    settings = _settings(args).with_overrides(kafka_bootstrap=args.kafka)
    run_worker(settings)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from stream.reports.text import REPORT_STEPS, build_report, render_text
    from stream.sinks.store import connect

    settings = _settings(args)
    if args.html is not None:
        from stream.reports.html import check_writable

        check_writable(args.html)  # before the queries, not after
    disable = None if args.progress is None else not args.progress
    with tqdm(total=len(REPORT_STEPS), desc="report", unit="step", disable=disable) as bar:

        def progress(step: str) -> None:  # called as each step starts: the ones before are done
            bar.update(REPORT_STEPS.index(step) - bar.n)
            bar.set_postfix_str(step)

        report = build_report(connect(settings), settings, top=args.top, progress=progress)
        bar.update(bar.total - bar.n)
    if args.html is not None:
        from stream.reports.html import write_html

        size = write_html(report, args.html)
        (sys.stderr if args.json else sys.stdout).write(
            f"Wrote {args.html} ({size / 1024:,.0f} KiB) from {report['store']}\n"
        )
    if args.json:
        _print_json(report)
    elif args.html is None:
        sys.stdout.write(render_text(report) + "\n")
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    from stream.kafka.tail import IncidentFilter, TailError, TailOptions, parse_since, run, want_colour

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    try:
        options = TailOptions(
            bootstrap=settings.kafka_bootstrap,
            topic=args.topic or settings.topic_incidents,
            since_ms=None if args.from_beginning else parse_since(args.since),
            follow=not args.no_follow,
            as_json=args.json,
            colour=not args.json and want_colour(args.color, sys.stdout),
            only=IncidentFilter.parse(args.severity, args.kind, args.node),
        )
        return run(options)
    except TailError as exc:
        sys.stderr.write(f"faultstream tail: error: {exc}\n")
        return EXIT_KAFKA


def _cmd_init_db(args: argparse.Namespace) -> int:
    from stream.sinks.store import connect, init_db

    settings = _settings(args)
    statements = init_db(connect(settings, apply_schema=False), settings)
    sys.stdout.write(f"{settings.dsn}: {len(statements)} DDL statements applied to {settings.database}\n")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
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


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from stream.reports.evaluation import evaluate_store, render_evaluation
    from stream.simulator.truth import Truth
    from stream.sinks.store import connect

    settings = _settings(args)
    result = evaluate_store(connect(settings), settings, Truth.load(args.truth))
    if args.json:
        _print_json(result)
    else:
        sys.stdout.write(render_evaluation(result) + "\n")
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    from stream.sinks.store import connect, query_rows

    settings = _settings(args)
    for row in query_rows(connect(settings), args.sql):
        sys.stdout.write(orjson.dumps(row, default=str).decode() + "\n")
    return 0


def _cmd_config(_args: argparse.Namespace) -> int:
    for name, default, doc in Settings.reference():
        sys.stdout.write(f"{name} (default {default})\n    {doc}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``faultstream`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="faultstream: %(message)s")
    handlers = {
        "replay": _cmd_replay,
        "report": _cmd_report,
        "init-db": _cmd_init_db,
        "init-kafka": _cmd_init_kafka,
        "worker": _cmd_worker,
        "simulate": _cmd_simulate,
        "query": _cmd_query,
        "evaluate": _cmd_evaluate,
        "config": _cmd_config,
        "tail": _cmd_tail,
    }
    try:
        return handlers[args.command](args)
    except (SettingsError, FileNotFoundError, ValueError) as exc:
        sys.stderr.write(f"faultstream: error: {exc}\n")
        return EXIT_USAGE
    except DeadLetterLimitExceeded as exc:
        sys.stderr.write(f"faultstream: stopped: {exc}\n")
        return EXIT_DEAD_LETTERS
    except StoreError as exc:
        sys.stderr.write(f"faultstream: ClickHouse: {exc}\n")
        return EXIT_STORE
    except BrokenPipeError:  # `faultstream report | head`: the reader left, nothing to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
