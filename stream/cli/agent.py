"""The node agent command: ``agent`` (a node's kernel log and GPU counters to the input topics)."""

from __future__ import annotations

import argparse
import logging

from stream.cli.common import Commands, add_command
from stream.settings import Settings

__all__ = ["add_agent_parser", "run_agent"]


def add_agent_parser(commands: Commands) -> None:
    """Add ``agent`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    agent = add_command(
        commands,
        "agent",
        help="on each GPU node: follow the kernel log (and optionally DCGM) and publish it to the topics",
        description="Follows the kernel log (the journal with `journalctl -k -f`, or a file such as "
        "/var/log/kern.log across rotations) from a persisted cursor, optionally scrapes the local "
        "dcgm-exporter or runs `nvidia-smi -q`, and publishes to the input topics through an on-disk spool "
        "of bounded size that holds the records while Kafka is away. Its own /metrics: docs/collecting.md.",
        example="faultstream agent --kafka kafka-1:9092 --kernel-log /var/log/kern.log "
        "--dcgm-url http://127.0.0.1:9400/metrics",
    )
    agent.add_argument(
        "--kafka", metavar="HOST:PORT", help="bootstrap servers (default FAULTSTREAM_KAFKA_BOOTSTRAP)"
    )
    agent.add_argument(
        "--kernel-log",
        metavar="SOURCE",
        help="`journal`, a file path, or `journal:PATH` for a .journal file or folder "
        "(default FAULTSTREAM_AGENT_KERNEL_LOG: journal)",
    )
    agent.add_argument("--node", help="the node name records are keyed by (default: this host's name)")
    agent.add_argument(
        "--state-dir",
        help="folder of the cursor and spool (default FAULTSTREAM_AGENT_STATE_DIR, else data_dir/agent)",
    )
    agent.add_argument("--data-dir", help="data_dir (default ./faultstream-data)")
    agent.add_argument("--dcgm-url", metavar="URL", help="scrape this dcgm-exporter for ECC samples")
    agent.add_argument(
        "--from-start",
        action="store_true",
        default=None,
        help="with no cursor yet, read an existing kernel-log file from its start (default: its end)",
    )
    agent.add_argument(
        "--once",
        action="store_true",
        help="read what is there now (no following), publish it all, then exit",
    )
    agent.set_defaults(handler=run_agent)


def run_agent(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM or Ctrl-C (or, with ``--once``, until all is published).

    Returns
    -------
    int
        0 (bad settings raise SettingsError or ValueError: the usage exit code).
    """
    import asyncio

    from stream.agent.service import plan_agent
    from stream.agent.service import run_agent as serve

    logging.getLogger("faultstream").setLevel(logging.INFO)
    # aiokafka logs each failed connection while a broker is away (several a second); the agent
    # says an outage once itself, and its end.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = Settings.from_env(
        kafka_bootstrap=args.kafka,
        data_dir=args.data_dir,
        agent_kernel_log=args.kernel_log,
        agent_node=args.node,
        agent_state_dir=args.state_dir,
        agent_dcgm_url=args.dcgm_url,
        agent_from_start=args.from_start,
    )
    return asyncio.run(serve(plan_agent(settings, once=args.once)))
