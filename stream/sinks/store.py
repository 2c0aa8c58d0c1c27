"""Connecting to ClickHouse — embedded chdb or a server — and applying the DDL.

Both go through clickhouse-connect with the same client API: ``chdb:///abs/path`` runs the real
ClickHouse engine in this process (one process per path), ``http(s)://`` talks to a server.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse, urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from schemas.ddl import ddl_statements
from stream.settings import Settings
from stream.sinks.errors import StoreError

__all__ = [
    "StoreError",
    "clickhouse_message",
    "connect",
    "ensure_schema",
    "init_db",
    "query_rows",
    "redact_dsn",
]


def _normalise_dsn(dsn: str) -> str:
    parsed = urlparse(dsn)
    if parsed.scheme == "chdb":
        path = Path((parsed.netloc + parsed.path) or ".").expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return f"chdb://{path}"
    if parsed.scheme in ("http", "https", "clickhouse", "clickhouses"):
        return dsn
    raise StoreError(f"unsupported ClickHouse DSN {dsn!r}: use chdb:///abs/path or http(s)://host:8123")


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and reports (which may be shared).

    >>> redact_dsn("https://writer:s3cret@clickhouse:8443/faultstream")
    'https://writer:***@clickhouse:8443/faultstream'
    >>> redact_dsn("chdb:///data/store")
    'chdb:///data/store'
    """
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def connect(settings: Settings, *, apply_schema: bool = True) -> Client:
    """Return a client for the configured store; create the database and tables on first use.

    An ``https://`` DSN verifies the server's certificate against ``clickhouse_ca_file`` (the
    system's CAs when empty). The schema step creates only what is missing
    (:func:`ensure_schema`), so a user allowed only to insert and select — the stack's writer —
    can connect once ``faultstream init-db`` has run.
    """
    dsn = _normalise_dsn(settings.dsn)
    tls: dict[str, Any] = {}
    if urlparse(dsn).scheme in ("https", "clickhouses"):
        # clickhouse-connect takes TLS from the port (443, 8443), not from the DSN's scheme: without
        # this, https://host:8123 went over plain HTTP, password included.
        tls = {"interface": "https", "secure": True}
    if settings.clickhouse_ca_file:
        if not Path(settings.clickhouse_ca_file).is_file():
            raise StoreError(f"FAULTSTREAM_CLICKHOUSE_CA_FILE={settings.clickhouse_ca_file}: no such file")
        tls |= {"verify": True, "ca_cert": settings.clickhouse_ca_file}
    try:
        client: Client = clickhouse_connect.get_client(dsn=dsn, **tls)
    except Exception as exc:  # clickhouse-connect raises several unrelated types here
        reason = " ".join(str(exc).replace(dsn, redact_dsn(dsn)).split())
        raise StoreError(f"cannot connect to ClickHouse at {redact_dsn(dsn)}: {reason}") from exc
    if apply_schema:
        ensure_schema(client, settings)
    return client


def ensure_schema(client: Client, settings: Settings) -> list[str]:
    """Create the database, tables and views that do not exist yet; return the statements run.

    Unlike :func:`init_db` it asks ``system.tables`` first and leaves existing objects alone:
    ClickHouse checks the CREATE privilege even for ``CREATE TABLE IF NOT EXISTS`` of a table that
    exists, which a least-privilege writer does not have.
    """
    database = {"database": settings.database}
    existing = {
        f"{settings.database}.{name}"
        for (name,) in client.query(
            "SELECT name FROM system.tables WHERE database = {database:String}", parameters=database
        ).result_rows
    }
    existing |= {
        name
        for (name,) in client.query(
            "SELECT name FROM system.databases WHERE name = {database:String}", parameters=database
        ).result_rows
    }
    columns = {
        f"{settings.database}.{table}.{name}"
        for table, name in client.query(
            "SELECT table, name FROM system.columns WHERE database = {database:String}", parameters=database
        ).result_rows
    }
    missing = []
    for statement in ddl_statements(settings.database, settings.gpus_per_node, settings.reference_sizes):
        words = statement.split(None, 9)
        if words[0] == "ALTER":
            # ALTER TABLE <table> ADD COLUMN IF NOT EXISTS <column> ...: a column added by a later
            # version; a table created now has it already, an older one gets it.
            if words[2] in existing and f"{words[2]}.{words[8]}" not in columns:
                missing.append(statement)
        elif words[5] not in existing:  # CREATE DATABASE|TABLE|VIEW IF NOT EXISTS <name> ...
            missing.append(statement)
    _run(client, missing)
    return missing


def init_db(client: Client, settings: Settings) -> list[str]:
    """Apply the idempotent DDL; return the statements run."""
    statements = ddl_statements(settings.database, settings.gpus_per_node, settings.reference_sizes)
    _run(client, statements)
    return statements


def _run(client: Client, statements: list[str]) -> None:
    for statement in statements:
        try:
            client.command(statement)
        except Exception as exc:
            first_line = statement.splitlines()[0]
            hint = ""
            if "ACCESS_DENIED" in str(exc) or "Not enough privileges" in str(exc):
                hint = " (run `faultstream init-db` as a user allowed to create tables)"
            raise StoreError(f"ClickHouse refused `{first_line}`{hint}: {exc}") from exc


# ClickHouse's own message inside what clickhouse-connect raises: from "Code: N." to the end.
_CLICKHOUSE_MESSAGE_RE: Final = re.compile(r"Code: \d+\..*", re.S)


def clickhouse_message(exc: BaseException) -> str:
    r"""ClickHouse's message of a failed statement, on one line, without the driver's wrapping.

    clickhouse-connect wraps it (``HTTPDriver for ... received ClickHouse error code 62``) and the
    statement it sent has ``FORMAT Native`` appended, which the user never wrote.

    >>> raised = "HTTPDriver for http://h:8123 received ClickHouse error code 47\n Code: 47. DB::Exception:"
    >>> clickhouse_message(RuntimeError(raised + " Unknown identifier `x`.\n (UNKNOWN_IDENTIFIER)"))
    'Code: 47. DB::Exception: Unknown identifier `x`. (UNKNOWN_IDENTIFIER)'
    """
    text = str(exc)
    match = _CLICKHOUSE_MESSAGE_RE.search(text)
    message = match.group(0) if match is not None else text
    message = message.replace(" FORMAT Native", "")
    return " ".join(message.split())


def query_rows(client: Client, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a SELECT and return rows as dicts (column name to value)."""
    result = client.query(sql, parameters=parameters)
    names = result.column_names
    return [dict(zip(names, row, strict=True)) for row in result.result_rows]
