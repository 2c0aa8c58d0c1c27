"""stream/kafka/security.py: settings to client options, validation, secrecy, Faust's form of it.

The broker-facing behaviour (logins, certificates, refusals) is tested against a real secured
broker in tests/integration/test_kafka_security.py; here, what needs no broker.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import time
from pathlib import Path

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from stream.kafka.security import KafkaAccessError, KafkaSecurity, check_kafka, client_options
from stream.settings import Settings, SettingsError
from stream.worker.app import broker_credentials


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a client certificate and key it signed (openssl, as the secured test broker)."""
    folder = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=client", "-keyout", "client.key",
            "-out", "client.csr")  # fmt: skip
    openssl("x509", "-req", "-days", "1", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "client.pem")  # fmt: skip
    (folder / "password").write_text("s3cret-from-file\n")
    return folder


def sasl_ssl(pki: Path, **changes: str) -> Settings:
    values = {
        "kafka_bootstrap": "broker:9093",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_username": "faultstream",
        "kafka_sasl_password_file": str(pki / "password"),
        "kafka_ssl_cafile": str(pki / "ca.pem"),
        **changes,
    }
    return Settings(**values)


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    assert client_options(Settings()) == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert broker_credentials(KafkaSecurity.from_settings(Settings())) is None


def test_sasl_ssl_options_read_the_password_file_and_verify_the_broker(pki: Path) -> None:
    options = client_options(sasl_ssl(pki))
    context = options.pop("ssl_context")
    assert options == {
        "bootstrap_servers": "broker:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "faultstream",
        "sasl_plain_password": "s3cret-from-file",  # the file's trailing newline is not part of it
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [cert["subject"] for cert in context.get_ca_certs()] == [((("commonName", "test CA"),),)]


def test_the_password_setting_wins_over_the_file(pki: Path) -> None:
    options = client_options(sasl_ssl(pki, kafka_sasl_password="from-env"))
    assert options["sasl_plain_password"] == "from-env"


def test_protocol_and_mechanism_are_case_insensitive(pki: Path) -> None:
    security = KafkaSecurity.from_settings(
        sasl_ssl(pki, kafka_security_protocol="sasl_ssl", kafka_sasl_mechanism="scram-sha-256")
    )
    assert (security.protocol, security.mechanism) == ("SASL_SSL", "SCRAM-SHA-256")


def test_a_client_certificate_is_loaded_into_the_context(pki: Path) -> None:
    settings = Settings(
        kafka_security_protocol="SSL",
        kafka_ssl_cafile=str(pki / "ca.pem"),
        kafka_ssl_certfile=str(pki / "client.pem"),
        kafka_ssl_keyfile=str(pki / "client.key"),
    )
    options = client_options(settings)
    assert options["security_protocol"] == "SSL" and "sasl_mechanism" not in options
    assert KafkaSecurity.from_settings(settings).describe() == "SSL (client certificate client.pem)"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kafka_security_protocol": "TLS"}, "FAULTSTREAM_KAFKA_SECURITY_PROTOCOL='TLS': expected one of"),
        ({"kafka_sasl_mechanism": "GSSAPI"}, "FAULTSTREAM_KAFKA_SASL_MECHANISM='GSSAPI'"),
        ({"kafka_sasl_username": ""}, "needs FAULTSTREAM_KAFKA_SASL_USERNAME"),
        ({"kafka_sasl_password_file": ""}, "needs a password: FAULTSTREAM_KAFKA_SASL_PASSWORD or"),
        (
            {"kafka_sasl_password_file": "/nonexistent/pw"},
            "FAULTSTREAM_KAFKA_SASL_PASSWORD_FILE: cannot read",
        ),
        (
            {"kafka_ssl_cafile": "/nonexistent/ca.pem"},
            "FAULTSTREAM_KAFKA_SSL_CAFILE=/nonexistent/ca.pem: no such",
        ),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT"},
            "FAULTSTREAM_KAFKA_SSL_CAFILE is set but FAULTSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT",
        ),
        ({"kafka_ssl_keyfile": "KEY"}, "FAULTSTREAM_KAFKA_SSL_KEYFILE is set without"),
    ],
)
def test_bad_security_settings_name_the_variable(pki: Path, changes: dict[str, str], message: str) -> None:
    if changes.get("kafka_ssl_keyfile") == "KEY":
        changes = {"kafka_ssl_keyfile": str(pki / "client.key")}
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        KafkaSecurity.from_settings(sasl_ssl(pki, **changes))


def test_a_key_that_does_not_match_its_certificate_is_a_settings_error(pki: Path) -> None:
    settings = sasl_ssl(
        pki, kafka_ssl_certfile=str(pki / "ca.pem"), kafka_ssl_keyfile=str(pki / "client.key")
    )
    with pytest.raises(SettingsError, match="cannot load the client certificate and key"):
        client_options(settings)


def test_passwords_are_never_in_a_repr(pki: Path) -> None:
    settings = sasl_ssl(
        pki,
        kafka_sasl_password="hunter2-kafka",
        kafka_ssl_key_password="hunter2-key",
        clickhouse_dsn="http://writer:hunter2-ch@clickhouse:8123",
    )
    security = KafkaSecurity.from_settings(settings)
    for text in (repr(settings), str(settings), repr(security), repr(broker_credentials(security))):
        assert "hunter2" not in text, text
    assert "faultstream" in repr(security)  # the user is not a secret: it says who we are


def test_faust_gets_the_same_security_as_the_other_clients(pki: Path) -> None:
    """Faust turns broker_credentials into its aiokafka clients' arguments: they must equal ours."""
    for settings in (
        sasl_ssl(pki),
        sasl_ssl(pki, kafka_security_protocol="SASL_PLAINTEXT", kafka_ssl_cafile=""),
        Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=str(pki / "ca.pem")),
    ):
        security = KafkaSecurity.from_settings(settings)
        credentials = broker_credentials(security)
        assert isinstance(credentials, faust.SASLCredentials | faust.SSLCredentials)
        theirs = dict(credentials_to_aiokafka_auth(credentials))
        ours = client_options(settings, security)
        ours.pop("bootstrap_servers")
        assert theirs.keys() >= ours.keys()
        for key in ours.keys() - {"ssl_context"}:
            assert theirs[key] == ours[key], key
        assert (theirs.get("ssl_context") is None) == (ours.get("ssl_context") is None)


def test_check_kafka_fails_in_one_line_when_nothing_listens() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(KafkaAccessError) as caught:
        asyncio.run(check_kafka(Settings(kafka_bootstrap=f"127.0.0.1:{port}"), timeout_s=5))
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"cannot use Kafka over PLAINTEXT: 127.0.0.1:{port}: ")


def test_check_kafka_rejects_a_bootstrap_without_a_port() -> None:
    with pytest.raises(SettingsError, match="'broker' is not HOST:PORT"):
        asyncio.run(check_kafka(Settings(kafka_bootstrap="broker")))


def test_check_kafka_tries_every_bootstrap_server_and_names_each_failure() -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    servers = ",".join(f"127.0.0.1:{port}" for port in ports)
    with pytest.raises(KafkaAccessError) as caught:
        asyncio.run(check_kafka(Settings(kafka_bootstrap=servers), timeout_s=5))
    message = str(caught.value)
    assert [f"127.0.0.1:{port}: " in message for port in ports] == [True, True]
    assert message.count("; ") == 1 and "\n" not in message
