"""Connecting to ClickHouse — embedded chdb or a server — and applying the DDL.

Both go through clickhouse-connect with the same client API: ``chdb:///abs/path`` runs the real
ClickHouse engine in this process (one process per path), ``http(s)://`` talks to a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from schemas.ddl import ddl_statements
from stream.settings import Settings

__all__ = ["StoreError", "connect", "init_db"]


class StoreError(RuntimeError):
    """ClickHouse could not be reached or refused the schema; the message says what to check."""


def _normalise_dsn(dsn: str) -> str:
    parsed = urlparse(dsn)
    if parsed.scheme == "chdb":
        path = Path((parsed.netloc + parsed.path) or ".").expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return f"chdb://{path}"
    if parsed.scheme in ("http", "https", "clickhouse", "clickhouses"):
        return dsn
    raise StoreError(f"unsupported ClickHouse DSN {dsn!r}: use chdb:///abs/path or http(s)://host:8123")


def connect(settings: Settings, *, apply_schema: bool = True) -> Client:
    """Return a client for the configured store; create the database and tables on first use."""
    dsn = _normalise_dsn(settings.dsn)
    try:
        client: Client = clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:  # clickhouse-connect raises several unrelated types here
        raise StoreError(f"cannot connect to ClickHouse at {dsn}: {exc}") from exc
    if apply_schema:
        init_db(client, settings)
    return client


def init_db(client: Client, settings: Settings) -> list[str]:
    """Apply the idempotent DDL; return the statements run."""
    statements = ddl_statements(settings.database, settings.gpus_per_node, settings.reference_sizes)
    for statement in statements:
        try:
            client.command(statement)
        except Exception as exc:
            first_line = statement.splitlines()[0]
            raise StoreError(f"ClickHouse refused `{first_line}`: {exc}") from exc
    return statements


def query_rows(client: Client, sql: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a SELECT and return rows as dicts (column name to value)."""
    result = client.query(sql, parameters=parameters)
    names = result.column_names
    return [dict(zip(names, row, strict=True)) for row in result.result_rows]
