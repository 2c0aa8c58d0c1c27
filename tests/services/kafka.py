"""The real Kafka broker of the test suite, as tests see it.

tests/run starts a single-node KRaft broker with tests/services/kafka/start.sh, exports its address
as FAULTSTREAM_TEST_KAFKA and stops it by PID when the run ends. Tests that need it call
`bootstrap_servers()`, which raises (with how to fix it) when the broker is not there, so that
they fail rather than skip.

start.sh also runs this file, `python kafka.py wait HOST:PORT --pid PID`, to wait until the
broker it launched answers metadata requests.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

ENV = "FAULTSTREAM_TEST_KAFKA"
NOT_RUNNING = (
    "Kafka test broker is not running: run the tests through tests/run "
    "(it starts one with tests/services/kafka/start.sh)"
)


def _host_port(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(f"{NOT_RUNNING}; {ENV}={bootstrap!r} is not HOST:PORT")
    return host, int(port)


def bootstrap_servers() -> str:
    """The broker's HOST:PORT, checked to accept connections; RuntimeError(NOT_RUNNING...) if not."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        why = os.environ.get(f"{ENV}_ERROR") or f"{ENV} is not set"  # tests/run says why start.sh failed
        raise RuntimeError(f"{NOT_RUNNING}; {why}")
    try:
        socket.create_connection(_host_port(value), timeout=5).close()
    except OSError as exc:
        raise RuntimeError(f"{NOT_RUNNING}; {ENV}={value} is unreachable: {exc}") from exc
    return value


def _admin(bootstrap: str | None, timeout_ms: int = 15_000) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap or bootstrap_servers(), request_timeout_ms=timeout_ms
    )


def _raise_for(errors: list[tuple[Any, ...]], action: str, *, ignore: tuple[int, ...] = ()) -> None:
    from aiokafka.errors import for_code

    for topic, code, *rest in errors:
        if code and code not in ignore:
            raise for_code(code)(f"could not {action} topic {topic}: {rest[0] if rest else ''}")


async def create_topic_async(
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    bootstrap: str | None = None,
    timeout: float = 30,
) -> None:
    """Create a topic and wait until every partition has a leader (so producers can write at once)."""
    from aiokafka.admin import NewTopic

    admin = _admin(bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, replication_factor)])
        _raise_for(response.topic_errors, "create")
        deadline = time.monotonic() + timeout
        while True:
            [topic] = await admin.describe_topics([name])
            led = [p for p in topic["partitions"] if p["error_code"] == 0 and p["leader"] >= 0]
            if topic["error_code"] == 0 and len(led) == partitions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name}: {len(led)} of {partitions} partitions have a leader")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def delete_topic_async(name: str, *, bootstrap: str | None = None) -> None:
    """Delete a topic; one that does not exist is fine."""
    admin = _admin(bootstrap)
    await admin.start()
    try:
        response = await admin.delete_topics([name])
        _raise_for(response.topic_error_codes, "delete", ignore=(3,))  # 3: UNKNOWN_TOPIC_OR_PARTITION
    finally:
        await admin.close()


def create_topic(
    name: str, partitions: int, *, replication_factor: int = 1, bootstrap: str | None = None
) -> None:
    """Blocking `create_topic_async`, for fixtures and plain tests (not from inside an event loop)."""
    asyncio.run(
        create_topic_async(name, partitions, replication_factor=replication_factor, bootstrap=bootstrap)
    )


def delete_topic(name: str, *, bootstrap: str | None = None) -> None:
    """Blocking `delete_topic_async`."""
    asyncio.run(delete_topic_async(name, bootstrap=bootstrap))


async def _answers_metadata(bootstrap: str) -> bool:
    try:
        socket.create_connection(_host_port(bootstrap), timeout=2).close()
    except OSError:
        return False
    admin = _admin(bootstrap, timeout_ms=2_000)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return bool(cluster["brokers"]) and cluster["controller_id"] >= 0
    except Exception:
        return False
    finally:
        await admin.close()


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _gave_up(log: str | None) -> bool:
    """Whether the broker's log says it is exiting (its JVM may take many seconds more to end)."""
    if log is None:
        return False
    try:
        with open(log, errors="replace") as file:
            return any("Exiting Kafka" in line for line in file)
    except OSError:
        return False


async def wait_ready(
    bootstrap: str, *, pid: int | None = None, log: str | None = None, timeout: float = 90
) -> float:
    """Wait until the broker answers a metadata request with a live broker and controller.

    Returns the seconds waited; raises RuntimeError when the process `pid` dies, its `log` says it
    is exiting, or time runs out.
    """
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused connections are expected here
    start = time.monotonic()
    while not await _answers_metadata(bootstrap):
        if not _alive(pid):
            raise RuntimeError(f"the broker process {pid} exited before it answered on {bootstrap}")
        if _gave_up(log):
            raise RuntimeError(f"the broker gave up starting (its log says 'Exiting Kafka'): see {log}")
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"the broker did not answer on {bootstrap} within {timeout:.0f} s")
        await asyncio.sleep(0.25)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait", help="wait until the broker at HOST:PORT answers metadata requests")
    wait.add_argument("bootstrap")
    wait.add_argument("--pid", type=int, help="fail at once if this process (the broker) exits")
    wait.add_argument("--log", help="fail at once when this broker log says 'Exiting Kafka'")
    wait.add_argument("--timeout", type=float, default=90)
    args = parser.parse_args(argv)
    try:
        import aiokafka  # noqa: F401  (every check below would fail on its absence, and look like a dead broker)
    except ImportError as exc:
        print(f"kafka: {sys.executable} cannot check the broker: {exc}", file=sys.stderr)
        return 2
    try:
        waited = asyncio.run(wait_ready(args.bootstrap, pid=args.pid, log=args.log, timeout=args.timeout))
    except RuntimeError as exc:
        print(f"kafka: {exc}", file=sys.stderr)
        return 1
    print(f"kafka: broker answered on {args.bootstrap} after {waited:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


async def consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    count: int,
    timeout: float,
    *,
    give_up: Callable[[], bool] = bool,
) -> tuple[list, dict]:
    """Read `count` records of `topic` from the start (no consumer group), unless time runs out or
    `give_up()`; also the topic's end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list = []
        deadline = time.monotonic() + timeout
        while len(records) < count and time.monotonic() < deadline and not give_up():
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        end = await consumer.end_offsets(tps)
        return records, {tp.partition: offset for tp, offset in end.items()}
    finally:
        await consumer.stop()


def topic_settings() -> tuple[str, ...]:
    """The topic settings, by name without the prefix (XID, ECC, ..., FLEET_BASELINES). Imported
    here, not at the top: the broker scripts run this module without the detectors' imports."""
    from stream.settings import Settings

    return tuple(name.removeprefix("FAULTSTREAM_TOPIC_") for name in Settings.topic_env_names())


def deployment_env(bootstrap: str, prefix: str, partitions: int, **extra: str) -> dict[str, str]:
    """FAULTSTREAM_* variables of a deployment whose topics and consumer group are all ``prefix``-named,
    so tests sharing one broker never see each other's records."""
    env = {
        "FAULTSTREAM_KAFKA_BOOTSTRAP": bootstrap,
        "FAULTSTREAM_TOPIC_PARTITIONS": str(partitions),
        # Long enough for the tests' publishers to reach every partition, short for their ends.
        "FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS": "15",
        "FAULTSTREAM_WORKER_APP_ID": prefix,
        "FAULTSTREAM_METRICS_PORT": "0",  # tests that read metrics pick a free port
        "FAULTSTREAM_RECEIVE_METRICS_PORT": "0",  # likewise for the receiver's
        **{f"FAULTSTREAM_TOPIC_{name}": f"{prefix}.{name.lower()}" for name in topic_settings()},
    }
    env.update(extra)
    return env


def delete_deployment_topics(env: dict[str, str]) -> None:
    """Delete the topics named in a :func:`deployment_env`."""
    for name in topic_settings():
        delete_topic(env[f"FAULTSTREAM_TOPIC_{name}"], bootstrap=env["FAULTSTREAM_KAFKA_BOOTSTRAP"])
