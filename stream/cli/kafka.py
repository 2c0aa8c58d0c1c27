"""The Kafka commands: ``init-kafka`` (topics), ``worker`` (the stream processor), ``tail`` (SRE console)."""

from __future__ import annotations

import argparse
import sys

from stream.cli.common import EXIT_KAFKA, Commands, add_store_arguments, settings_from_args
from stream.settings import Settings

__all__ = [
    "add_init_kafka_parser",
    "add_tail_parser",
    "add_worker_parser",
    "run_init_kafka",
    "run_tail",
    "run_worker",
]


def add_init_kafka_parser(commands: Commands) -> None:
    """Add ``init-kafka`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    init_kafka = commands.add_parser(
        "init-kafka", help="create the Kafka topics with their configs (idempotent)"
    )
    init_kafka.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    init_kafka.set_defaults(handler=run_init_kafka)


def add_worker_parser(commands: Commands) -> None:
    """Add ``worker`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    worker = commands.add_parser(
        "worker", help="run a Faust worker: Kafka input topics -> detectors -> outputs"
    )
    worker.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    add_store_arguments(worker)
    worker.set_defaults(handler=run_worker)


def add_tail_parser(commands: Commands) -> None:
    """Add ``tail`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
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
    tail.set_defaults(handler=run_tail)


def run_init_kafka(args: argparse.Namespace) -> int:
    """Create the topics (those that exist are left as they are) and print each one's outcome.

    Parameters
    ----------
    args
        The parsed ``init-kafka`` command line.

    Returns
    -------
    int
        The exit code: 0.
    """
    import asyncio

    from stream.kafka.admin import create_topics
    from stream.kafka.security import check_kafka

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    asyncio.run(check_kafka(settings))  # a wrong password or certificate: one line, at once
    for topic, outcome in asyncio.run(create_topics(settings)):
        sys.stdout.write(f"{topic}: {outcome}\n")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    """Run a Faust worker until it is stopped.

    Parameters
    ----------
    args
        The parsed ``worker`` command line.

    Returns
    -------
    int
        The exit code: 0.
    """
    import asyncio

    from stream.kafka.admin import wait_for_group_coordinator
    from stream.kafka.security import check_kafka
    from stream.worker.app import run_worker as run_faust_worker

    settings = settings_from_args(args).with_overrides(kafka_bootstrap=args.kafka)
    # Faust retries a broker that refuses it for ever, logging tracebacks: check first, fail in one line.
    security = asyncio.run(check_kafka(settings))
    asyncio.run(wait_for_group_coordinator(settings, settings.worker_app_id))
    run_faust_worker(settings, security)
    return 0


def run_tail(args: argparse.Namespace) -> int:
    """Print the incidents topic's updates, filtered, until stopped (or its end with ``--no-follow``).

    Parameters
    ----------
    args
        The parsed ``tail`` command line.

    Returns
    -------
    int
        The exit code of the console, or ``EXIT_KAFKA`` if its options or Kafka fail.
    """
    import asyncio

    from stream.kafka.security import KafkaAccessError, check_kafka, client_options
    from stream.kafka.tail import IncidentFilter, TailError, TailOptions, parse_since, run, want_colour

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    try:
        security = asyncio.run(check_kafka(settings))
        kafka = client_options(settings, security)
        options = TailOptions(
            bootstrap=kafka.pop("bootstrap_servers"),
            security=kafka,
            topic=args.topic or settings.topic_incidents,
            since_ms=None if args.from_beginning else parse_since(args.since),
            follow=not args.no_follow,
            as_json=args.json,
            colour=not args.json and want_colour(args.color, sys.stdout),
            only=IncidentFilter.parse(args.severity, args.kind, args.node),
        )
        return run(options)
    except (TailError, KafkaAccessError) as exc:
        sys.stderr.write(f"faultstream tail: error: {exc}\n")
        return EXIT_KAFKA
