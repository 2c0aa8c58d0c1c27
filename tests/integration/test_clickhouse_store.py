"""Connecting to ClickHouse: the schema step a least-privilege writer can pass, https with a CA file,
and DSN passwords kept out of messages.

The schema tests use the real engine (chdb). The https tests use a real TLS server on 127.0.0.1
with a certificate signed by a CA made here: it is not ClickHouse, so a connection through it
fails either way, but how it fails says whether the CA setting reached the TLS handshake.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from stream.settings import Settings
from stream.sinks.pending import PendingStore
from stream.sinks.store import StoreError, connect, ensure_schema, init_db

pytestmark = pytest.mark.integration


def tables(client: Client, database: str) -> set[str]:
    rows = client.query(
        "SELECT name FROM system.tables WHERE database = {d:String}", parameters={"d": database}
    ).result_rows
    return {name for (name,) in rows}


def test_ensure_schema_creates_only_what_is_missing(chdb_client: Client, chdb_path: Path) -> None:
    settings = Settings(clickhouse_dsn=f"chdb://{chdb_path}", database="fs_test_ensure_schema")
    chdb_client.command(f"DROP DATABASE IF EXISTS {settings.database}")
    try:
        created = ensure_schema(chdb_client, settings)
        assert created[0].startswith(f"CREATE DATABASE IF NOT EXISTS {settings.database}")
        # Everything was missing (a column added by a later version comes with the new table).
        assert len(created) == len([s for s in init_db(chdb_client, settings) if not s.startswith("ALTER")])
        assert ensure_schema(chdb_client, settings) == []  # nothing is now: no DDL for the writer
        chdb_client.command(f"DROP TABLE {settings.database}.dead_letters")
        [again] = ensure_schema(chdb_client, settings)
        assert again.startswith(f"CREATE TABLE IF NOT EXISTS {settings.database}.dead_letters")
        assert "dead_letters" in tables(chdb_client, settings.database)
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {settings.database}")


def test_ensure_schema_adds_the_partition_column_to_an_older_job_events_table(
    chdb_client: Client, chdb_path: Path
) -> None:
    """A store made before ``job_events.partition`` existed gets it by one ALTER; its rows read ''."""
    settings = Settings(clickhouse_dsn=f"chdb://{chdb_path}", database="fs_test_job_partition")
    db = settings.database
    chdb_client.command(f"DROP DATABASE IF EXISTS {db}")
    try:
        ensure_schema(chdb_client, settings)
        chdb_client.command(f"ALTER TABLE {db}.job_events DROP COLUMN partition")  # the old table
        chdb_client.command(
            f"INSERT INTO {db}.job_events (ts, cluster, job_id, state, user) "
            "VALUES ('2024-03-01 00:00:00', 'c', '7', 'FAILED', 'ann')"
        )
        [alter] = ensure_schema(chdb_client, settings)
        assert (
            alter
            == f"ALTER TABLE {db}.job_events ADD COLUMN IF NOT EXISTS partition String DEFAULT '' AFTER source"
        )
        assert ensure_schema(chdb_client, settings) == []
        rows = chdb_client.query(f"SELECT job_id, user, partition FROM {db}.job_events").result_rows
        assert [tuple(row) for row in rows] == [("7", "ann", "")]
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {db}")


# -- https ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clickhouse-pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    for name in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.pem")  # fmt: skip
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")  # fmt: skip
    openssl("x509", "-req", "-days", "1", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip
    return folder


class NotClickHouse(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b"this is not ClickHouse"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def https_port(pki: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 whose certificate the CA in ``pki`` signed."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotClickHouse)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def failure(dsn: str, ca_file: str = "") -> str:
    with pytest.raises(StoreError) as caught:
        connect(Settings(clickhouse_dsn=dsn, clickhouse_ca_file=ca_file))
    return str(caught.value)


def test_https_trusts_the_configured_ca(pki: Path, https_port: int) -> None:
    dsn = f"https://writer:hunter2@127.0.0.1:{https_port}"
    trusted = failure(dsn, str(pki / "ca.pem"))
    # The handshake passed: what failed is the server not being ClickHouse.
    assert "CERTIFICATE_VERIFY_FAILED" not in trusted and "certificate verify failed" not in trusted
    assert "503" in trusted or "not ClickHouse" in trusted, trusted
    assert f"url https://127.0.0.1:{https_port}" in trusted, "an https DSN must speak https on any port"
    for untrusted in (failure(dsn, str(pki / "other-ca.pem")), failure(dsn)):
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted or "certificate verify failed" in untrusted, untrusted
    for message in (trusted, untrusted):
        assert "hunter2" not in message
        assert f"https://writer:***@127.0.0.1:{https_port}" in message


def test_a_missing_ca_file_is_named() -> None:
    with pytest.raises(
        StoreError, match=r"FAULTSTREAM_CLICKHOUSE_CA_FILE=/nonexistent/ca\.pem: no such file"
    ):
        connect(Settings(clickhouse_dsn="https://h:8443", clickhouse_ca_file="/nonexistent/ca.pem"))


def test_a_refused_connection_does_not_print_the_password() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    message = failure(f"http://writer:hunter2@127.0.0.1:{port}")
    assert "hunter2" not in message and f"writer:***@127.0.0.1:{port}" in message


def test_a_pending_store_connects_on_its_own_thread_and_applies_the_schema(
    chdb_client: Client, chdb_path: Path
) -> None:
    settings = Settings(clickhouse_dsn=f"chdb://{chdb_path}", database="fs_test_pending_store")
    chdb_client.command(f"DROP DATABASE IF EXISTS {settings.database}")
    try:
        pending = PendingStore(settings)
        assert pending._thread.name == "store-connect" and pending._thread is not threading.current_thread()
        client = pending.client()
        assert not pending._thread.is_alive()
        assert {"incidents", "dead_letters"} <= tables(client, settings.database)
        assert pending.client() is client  # asked again: the same client, no second connection
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {settings.database}")


def test_a_pending_store_raises_what_connecting_raised_in_the_callers_thread() -> None:
    pending = PendingStore(
        Settings(clickhouse_dsn="https://h:8443", clickhouse_ca_file="/nonexistent/ca.pem")
    )
    pending.wait()  # a caller giving up first only waits: nothing raised there
    with pytest.raises(
        StoreError, match=r"FAULTSTREAM_CLICKHOUSE_CA_FILE=/nonexistent/ca\.pem: no such file"
    ):
        pending.client()
