"""Connecting to ClickHouse — embedded chdb or a server — and applying the DDL.

Both go through clickhouse-connect with the same client API: ``chdb:///abs/path`` runs the real
ClickHouse engine in this process (one process per path), ``http(s)://`` talks to a server.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from schemas.ddl import ddl_statements
from stream.settings import Settings

__all__ = ["StoreError", "clickhouse_message", "connect", "init_db", "query_rows"]


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
