"""The Kafka commands: ``init-kafka`` (topics), ``worker`` (the stream processor), ``tail`` (SRE console)."""

from __future__ import annotations

import argparse
import sys

from stream.cli.common import (
    EXIT_KAFKA,
    EXIT_USAGE,
    Commands,
    add_command,
    add_store_arguments,
    settings_from_args,
)
from stream.settings import Settings

__all__ = [
    "add_init_kafka_parser",
    "add_notify_parser",
    "add_receive_parser",
    "add_tail_parser",
    "add_worker_parser",
    "run_init_kafka",
    "run_notify",
    "run_receive",
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
    init_kafka = add_command(
        commands,
        "init-kafka",
        help="create the Kafka topics with their configs (idempotent)",
        example="faultstream init-kafka --kafka 127.0.0.1:9092",
    )
    init_kafka.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    init_kafka.set_defaults(handler=run_init_kafka)


def add_receive_parser(commands: Commands) -> None:
    """Add ``receive`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    receive = add_command(
        commands,
        "receive",
        help="serve Prometheus remote_write: DCGM exporter counters -> the ecc and xid input topics",
        example="faultstream receive --listen 127.0.0.1:9201 --kafka 127.0.0.1:9092",
    )
    receive.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to serve on (default FAULTSTREAM_RECEIVE_LISTEN); beyond the loopback only with "
        "TLS and authentication (FAULTSTREAM_RECEIVE_TLS_*, _BASIC_AUTH_* or _BEARER_TOKEN_FILE)",
    )
    receive.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    receive.set_defaults(handler=run_receive)


def run_receive(args: argparse.Namespace) -> int:
    """Serve Prometheus remote_write until stopped.

    Parameters
    ----------
    args
        The parsed ``receive`` command line.

    Returns
    -------
    int
        The exit code: 0 (a refused address or security file raises ``SettingsError``: exit code 2).
    """
    import asyncio

    from stream.kafka.reachable import wait_for_kafka
    from stream.receive.security import ReceiveSecurity, listen_address
    from stream.receive.server import run_receiver

    settings = Settings.from_env(kafka_bootstrap=args.kafka, receive_listen=args.listen)
    # Refused before anything else: TLS and secret files that cannot be read, an address beyond
    # the loopback without both TLS and authentication.
    security = ReceiveSecurity.from_settings(settings)
    host, port = listen_address(settings.receive_listen, security)
    asyncio.run(wait_for_kafka(settings, "receive"))
    run_receiver(settings, host, port, security)
    return 0


def add_worker_parser(commands: Commands) -> None:
    """Add ``worker`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    worker = add_command(
        commands,
        "worker",
        help="run a Faust worker: Kafka input topics -> detectors -> outputs",
        example="faultstream worker --kafka 127.0.0.1:9092 --clickhouse http://clickhouse:8123",
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
    tail = add_command(
        commands,
        "tail",
        help="follow the incidents topic: one line per incident update, filtered, colourised",
        description="The SRE console: incidents as the workers publish them. Repeats of an update "
        "already shown (at-least-once delivery) are dropped.",
        example="faultstream tail --kafka 127.0.0.1:9092 --since 2h --severity critical,warn",
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
        "--no-follow",
        action="store_true",
        help="stop at the end of the topic instead of waiting for more, and print in time order",
    )
    tail.add_argument("--severity", help="only these severities, comma-separated: critical,warn,info")
    tail.add_argument("--kind", help="only these kinds, comma-separated shell patterns (xid_*,lemon_node)")
    tail.add_argument("--node", help="only these nodes, comma-separated shell patterns (node01*)")
    tail.add_argument("--json", action="store_true", help="print each incident message as JSON, one per line")
    tail.add_argument(
        "--wide", action="store_true", help="also the update count, the whole summary and the action"
    )
    tail.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour by severity (default auto)",
    )
    tail.set_defaults(handler=run_tail)


def add_notify_parser(commands: Commands) -> None:
    """Add ``notify`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    notify = add_command(
        commands,
        "notify",
        help="post the incidents topic to Alertmanager: one alert per incident, resolved with it",
        example="faultstream notify --alertmanager http://127.0.0.1:9093 --kafka 127.0.0.1:9092",
        description="Incidents as Alertmanager alerts (labels severity, kind, cluster, node, gpu). "
        "Reads the incidents topic with its own consumer group and commits after Alertmanager "
        "accepted, so nothing is missed while either is down.",
    )
    notify.add_argument(
        "--alertmanager", metavar="URL", help="Alertmanager base URL (default FAULTSTREAM_ALERTMANAGER_URL)"
    )
    notify.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    notify.add_argument("--topic", help="incidents topic (default FAULTSTREAM_TOPIC_INCIDENTS)")
    notify.add_argument("--group", help="consumer group (default FAULTSTREAM_NOTIFY_GROUP)")
    notify.set_defaults(handler=run_notify)


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
    from stream.kafka.reachable import wait_for_kafka

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    # A wrong password or certificate: one line, at once; a broker not up yet: waited for.
    asyncio.run(wait_for_kafka(settings, "init-kafka"))
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

    from stream.sinks.pending import PendingStore

    settings = settings_from_args(args).with_overrides(kafka_bootstrap=args.kafka)
    from stream.kafka.admin import wait_for_group_coordinator
    from stream.kafka.reachable import wait_for_kafka
    from stream.worker.app import run_worker as run_faust_worker
    from stream.worker.metrics import WorkerMetrics

    # Served from the start: a worker waiting for its broker says so on /metrics too.
    metrics = WorkerMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_host, settings.metrics_port)
    # Faust retries a broker that refuses it for ever, logging tracebacks: check first, fail in
    # one line; a broker that does not answer yet is waited for, with a line now and then.
    security = asyncio.run(wait_for_kafka(settings, "the worker", waiting=metrics.kafka_wait.set))
    asyncio.run(wait_for_group_coordinator(settings, settings.worker_app_id))
    # The store's engine starts on a thread while Faust starts and joins the group, mostly waiting
    # for the broker. Started before the imports above, it slowed them by what it took (~0.3 s:
    # the two held the interpreter's lock in turn) and the worker's first record came that later.
    run_faust_worker(settings, security, PendingStore(settings), metrics)
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

    from stream.kafka.reachable import wait_for_kafka
    from stream.kafka.security import KafkaAccessError, client_options
    from stream.kafka.tail import IncidentFilter, TailError, TailOptions, parse_since, run, want_colour

    settings = Settings.from_env(kafka_bootstrap=args.kafka)
    try:
        security = asyncio.run(wait_for_kafka(settings, "tail"))
        kafka = client_options(settings, security)
        options = TailOptions(
            bootstrap=kafka.pop("bootstrap_servers"),
            security=kafka,
            topic=args.topic or settings.topic_incidents,
            since_ms=None if args.from_beginning else parse_since(args.since),
            follow=not args.no_follow,
            as_json=args.json,
            colour=not args.json and want_colour(args.color, sys.stdout),
            wide=args.wide,
            only=IncidentFilter.parse(args.severity, args.kind, args.node),
        )
        return run(options)
    except (TailError, KafkaAccessError) as exc:
        sys.stderr.write(f"faultstream tail: error: {exc}\n")
        return EXIT_KAFKA


def run_notify(args: argparse.Namespace) -> int:
    """Forward incidents to Alertmanager until SIGTERM or Ctrl-C.

    Parameters
    ----------
    args
        The parsed ``notify`` command line.

    Returns
    -------
    int
        0, or ``EXIT_USAGE`` without an Alertmanager URL, or ``EXIT_KAFKA`` if Kafka fails.
    """
    from stream.notify.alertmanager import NotifyError, NotifyOptions, run

    settings = Settings.from_env(
        kafka_bootstrap=args.kafka, alertmanager_url=args.alertmanager, notify_group=args.group
    )
    if not settings.alertmanager_url.startswith(("http://", "https://")):
        sys.stderr.write(
            "faultstream notify: error: give the Alertmanager URL (--alertmanager http://host:9093 "
            "or FAULTSTREAM_ALERTMANAGER_URL)\n"
        )
        return EXIT_USAGE
    import asyncio

    from stream.kafka.reachable import wait_for_kafka
    from stream.kafka.security import KafkaAccessError

    try:
        asyncio.run(wait_for_kafka(settings, "notify"))
    except KafkaAccessError as exc:
        sys.stderr.write(f"faultstream notify: error: {exc}\n")
        return EXIT_KAFKA
    options = NotifyOptions(
        bootstrap=settings.kafka_bootstrap,
        topic=args.topic or settings.topic_incidents,
        group=settings.notify_group,
        alertmanager=settings.alertmanager_url,
        resend_s=settings.notify_resend_seconds,
    )
    try:
        return run(options)
    except NotifyError as exc:
        sys.stderr.write(f"faultstream notify: error: {exc}\n")
        return EXIT_KAFKA
