"""Every Kafka client of faultstream against a real broker's secured listeners.

The broker (fixture ``secure_kafka``) has a SASL_SSL listener (SCRAM-SHA-512) and an SSL listener
that requires a client certificate, with a CA and certificates made for the run. The commands
run as an operator runs them (``python -m stream.cli``, settings from FAULTSTREAM_* variables);
what they wrote is checked through the broker's PLAINTEXT listener with plain test clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from stream.kafka.topics import topic_specs
from stream.settings import Settings
from tests.services import kafka
from tests.services.secure_kafka import SecureBroker
from tests.services.worker import Worker, incident_messages, query, wait_until_caught_up

#: Topics init-kafka creates (every one of topic_specs).
TOPICS = len(topic_specs(Settings.from_env()))

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "examples" / "sim-48x14" / "logs"
#: Records the example logs hold (xid + ecc + jobs), as `replay --to` reports them.
EXAMPLE_RECORDS = 25_882
#: A failing command must say so well within this (the brief's bound; measured ~2 s).
ERROR_WITHIN_S = 30


def faultstream(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command line with ``env`` over this process's environment; its result, whatever the exit."""
    return subprocess.run(
        [sys.executable, "-m", "stream.cli", *args],
        capture_output=True, text=True, timeout=timeout, check=False, env={**os.environ, **env}, cwd=ROOT,
    )  # fmt: skip


def ok(env: dict[str, str], *args: str) -> str:
    result = faultstream(env, *args)
    assert result.returncode == 0, f"faultstream {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result.stdout


def deployment(broker: SecureBroker, secured: dict[str, str], partitions: int = 1) -> dict[str, str]:
    """A deployment of its own (topics and group named by a fresh prefix) reached through ``secured``."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    return {**kafka.deployment_env(broker.plaintext, prefix, partitions), **secured}


def plain(env: dict[str, str], broker: SecureBroker) -> dict[str, str]:
    """The same deployment seen through the PLAINTEXT listener, for the test's own checks."""
    unsecured = {key: value for key, value in env.items() if not key.startswith("FAULTSTREAM_KAFKA_S")}
    return {**unsecured, "FAULTSTREAM_KAFKA_BOOTSTRAP": broker.plaintext}


async def topic_names(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


def incident(number: int) -> dict[str, object]:
    return {
        "incident_id": f"inc-{number}", "version": 2, "first_evidence": "2024-01-03T10:00:00Z",
        "severity": "critical", "kind": "gpu_bus", "node": f"node{number:04d}", "gpu": "0000:b7:00",
        "status": "open", "summary": "XID 79", "action": "drain",
    }  # fmt: skip


def published_records(env: dict[str, str]) -> int:
    """Records on the deployment's input topics (a message holds one or more, newline-separated)."""
    total = 0
    for name in ("XID", "ECC", "JOBS"):
        bootstrap, topic = env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env[f"FAULTSTREAM_TOPIC_{name}"]
        _, ends = asyncio.run(kafka.consume(bootstrap, topic, 1, 0, 15))  # count 0: the end offsets only
        messages, _ = asyncio.run(kafka.consume(bootstrap, topic, 1, sum(ends.values()), 30))
        assert len(messages) == sum(ends.values()), f"{topic}: not read to its end"
        total += sum(len([line for line in m.value.split(b"\n") if line]) for m in messages)
    return total


def tail_json(env: dict[str, str]) -> list[tuple[str, int]]:
    out = ok(env, "tail", "--json", "--no-follow", "--from-beginning")
    return [(m["incident_id"], m["version"]) for m in map(json.loads, out.splitlines())]


# -- SASL_SSL (SCRAM-SHA-512) ------------------------------------------------------------------


@pytest.fixture
def sasl_env(secure_kafka: SecureBroker) -> Iterator[dict[str, str]]:
    env = deployment(secure_kafka, secure_kafka.sasl_env())
    yield env
    kafka.delete_deployment_topics(plain(env, secure_kafka))


def test_init_kafka_over_sasl_ssl_creates_the_topics(secure_kafka: SecureBroker, sasl_env) -> None:
    out = ok(sasl_env, "init-kafka")
    names = {env for key, env in sasl_env.items() if key.startswith("FAULTSTREAM_TOPIC_") and "." in env}
    assert out.count(": created") == len(names) == TOPICS
    assert names <= asyncio.run(topic_names(secure_kafka.plaintext))


def test_replay_to_and_tail_over_sasl_ssl(secure_kafka: SecureBroker, sasl_env) -> None:
    ok(sasl_env, "init-kafka")
    out = ok(sasl_env, "replay", str(LOGS), "--to", f"kafka://{secure_kafka.sasl_ssl}", "--no-progress")
    assert f"Published {EXAMPLE_RECORDS:,} records to {secure_kafka.sasl_ssl}" in out
    assert published_records(plain(sasl_env, secure_kafka)) == EXAMPLE_RECORDS
    sent = [incident(n) for n in range(3)]
    topic = sasl_env["FAULTSTREAM_TOPIC_INCIDENTS"]
    asyncio.run(produce(secure_kafka.plaintext, topic, [(b"k", json.dumps(i).encode()) for i in sent]))
    assert tail_json(sasl_env) == [("inc-0", 2), ("inc-1", 2), ("inc-2", 2)]


def test_a_worker_runs_over_sasl_ssl_end_to_end_and_logs_no_error(
    secure_kafka: SecureBroker, sasl_env, tmp_path: Path
) -> None:
    """init-kafka, replay --to, worker (its Faust consumer and producer, its checkpoint and admin
    clients) and tail, all over SASL_SSL. The broker is this session's own: the worker is the first
    consumer group it sees (the case that logged "GroupCoordinatorNotAvailable"), and its start
    must log no ERROR line."""
    ok(sasl_env, "init-kafka")
    ok(sasl_env, "replay", str(LOGS), "--to", f"kafka://{secure_kafka.sasl_ssl}", "--no-progress")
    worker = Worker(sasl_env, tmp_path / "store", tmp_path / "worker.log")
    try:
        wait_until_caught_up(plain(sasl_env, secure_kafka), [worker], timeout=240)
        assert worker.metric("faultstream_commits_total") >= 1
    finally:
        worker.stop()
    log = worker.log()
    errors = [line for line in log.splitlines() if "[ERROR]" in line or "Traceback" in line]
    assert not errors, "a healthy worker start logged errors:\n" + "\n".join(errors)
    stored = query(worker.store, "SELECT count() AS n FROM faultstream.incidents FINAL")[0]["n"]
    on_topic = incident_messages(plain(sasl_env, secure_kafka))
    assert stored > 10 and len({i for i, _ in on_topic}) == stored
    # The SRE console reads them over SASL_SSL too: every update, once.
    assert sorted(tail_json(sasl_env)) == sorted(set(on_topic))


# -- SSL with a client certificate --------------------------------------------------------------


@pytest.fixture
def cert_env(secure_kafka: SecureBroker) -> Iterator[dict[str, str]]:
    env = deployment(secure_kafka, secure_kafka.cert_env())
    ok(plain(env, secure_kafka), "init-kafka")
    yield env
    kafka.delete_deployment_topics(plain(env, secure_kafka))


def test_replay_to_and_tail_with_a_client_certificate(secure_kafka: SecureBroker, cert_env) -> None:
    out = ok(cert_env, "replay", str(LOGS), "--to", f"kafka://{secure_kafka.ssl}", "--no-progress")
    assert f"Published {EXAMPLE_RECORDS:,} records to {secure_kafka.ssl}" in out
    assert published_records(plain(cert_env, secure_kafka)) == EXAMPLE_RECORDS
    topic = cert_env["FAULTSTREAM_TOPIC_INCIDENTS"]
    asyncio.run(produce(secure_kafka.plaintext, topic, [(b"k", json.dumps(incident(7)).encode())]))
    assert tail_json(cert_env) == [("inc-7", 2)]


def test_init_kafka_with_a_client_certificate(secure_kafka: SecureBroker) -> None:
    env = deployment(secure_kafka, secure_kafka.cert_env())
    try:
        assert ok(env, "init-kafka").count(": created") == TOPICS
    finally:
        kafka.delete_deployment_topics(plain(env, secure_kafka))


# -- SASL_PLAINTEXT ------------------------------------------------------------------------------


def test_init_kafka_replay_to_and_tail_over_sasl_plaintext(secure_kafka: SecureBroker) -> None:
    env = deployment(secure_kafka, secure_kafka.sasl_plaintext_env())
    try:
        assert ok(env, "init-kafka").count(": created") == TOPICS
        ok(env, "replay", str(LOGS), "--to", f"kafka://{secure_kafka.sasl_plaintext}", "--no-progress")
        assert published_records(plain(env, secure_kafka)) == EXAMPLE_RECORDS
        topic = env["FAULTSTREAM_TOPIC_INCIDENTS"]
        asyncio.run(produce(secure_kafka.plaintext, topic, [(b"k", json.dumps(incident(3)).encode())]))
        assert tail_json(env) == [("inc-3", 2)]
    finally:
        kafka.delete_deployment_topics(plain(env, secure_kafka))


# -- refused: one line, a non-zero exit, within seconds -----------------------------------------

COMMANDS = {
    "init-kafka": ("init-kafka",),
    "replay --to": ("replay", str(LOGS), "--to", "kafka://{bootstrap}", "--no-progress"),
    "tail": ("tail", "--no-follow"),
    "worker": ("worker", "--clickhouse", "chdb://{tmp}/store"),
}


def refused(env: dict[str, str], command: str, tmp_path: Path) -> tuple[str, float]:
    """Run ``command``; assert it failed with exit 5 and one line on stderr, in time; that line."""
    args = [a.format(bootstrap=env["FAULTSTREAM_KAFKA_BOOTSTRAP"], tmp=tmp_path) for a in COMMANDS[command]]
    started = time.monotonic()
    result = faultstream(env, *args, timeout=ERROR_WITHIN_S * 3)
    took = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 5, f"exit {result.returncode}:\n{result.stderr[-3000:]}"
    assert len(lines) == 1, f"not one line:\n{result.stderr[-3000:]}"
    assert took < ERROR_WITHIN_S, f"{command} took {took:.1f} s to fail"
    assert result.stdout == ""
    return lines[0], took


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_wrong_password_is_one_line_and_exit_5(secure_kafka: SecureBroker, command, tmp_path) -> None:
    password = f"not-the-password-{uuid.uuid4().hex[:6]}"
    env = deployment(
        secure_kafka, secure_kafka.sasl_env(FAULTSTREAM_KAFKA_SASL_PASSWORD=password)
    )  # the password setting wins over the file
    line, _ = refused(env, command, tmp_path)
    assert f"the broker refused the login of user '{secure_kafka.user}'" in line
    assert "invalid credentials" in line
    assert password not in line


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_untrusted_broker_certificate_is_one_line_and_exit_5(
    secure_kafka: SecureBroker, command, tmp_path
) -> None:
    env = deployment(
        secure_kafka, secure_kafka.sasl_env(FAULTSTREAM_KAFKA_SSL_CAFILE=str(secure_kafka.other_ca))
    )
    line, _ = refused(env, command, tmp_path)
    assert "the broker's certificate is not trusted" in line and "FAULTSTREAM_KAFKA_SSL_CAFILE" in line


@pytest.mark.parametrize("command", ["replay --to", "tail"])
def test_no_client_certificate_is_one_line_and_exit_5(secure_kafka: SecureBroker, command, tmp_path) -> None:
    env = deployment(
        secure_kafka,
        secure_kafka.cert_env(FAULTSTREAM_KAFKA_SSL_CERTFILE="", FAULTSTREAM_KAFKA_SSL_KEYFILE=""),
    )
    line, _ = refused(env, command, tmp_path)
    assert "the broker closed the connection" in line and "client certificate" in line


def test_a_plaintext_client_on_the_sasl_ssl_listener_is_one_line(
    secure_kafka: SecureBroker, tmp_path
) -> None:
    env = deployment(secure_kafka, {"FAULTSTREAM_KAFKA_BOOTSTRAP": secure_kafka.sasl_ssl})
    line, _ = refused(env, "init-kafka", tmp_path)
    assert "over PLAINTEXT" in line and "FAULTSTREAM_KAFKA_SECURITY_PROTOCOL" in line


def test_a_tls_client_on_the_plaintext_listener_is_one_line(secure_kafka: SecureBroker, tmp_path) -> None:
    env = deployment(secure_kafka, secure_kafka.cert_env(FAULTSTREAM_KAFKA_BOOTSTRAP=secure_kafka.plaintext))
    line, _ = refused(env, "tail", tmp_path)
    assert "over SSL" in line and "is it a TLS listener?" in line
