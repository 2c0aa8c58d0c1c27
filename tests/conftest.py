"""Shared fixtures. Services used by integration and e2e tests are real and started once per session.

ClickHouse is chdb — the real ClickHouse engine, in process. chdb allows one store path per
process, so the whole session shares one path and every test gets a database of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from stream.settings import Settings
from stream.sinks.store import connect

_database_numbers = itertools.count()


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="session")
def chdb_client(chdb_path: Path) -> Client:
    try:
        return connect(Settings(clickhouse_dsn=f"chdb://{chdb_path}"), apply_schema=False)
    except Exception as exc:  # fail loudly: the engine is a hard requirement of these tests
        pytest.fail(
            f"embedded ClickHouse (chdb) did not start: {exc}. Install it with `pip install -e .[dev]`."
        )


@pytest.fixture
def store(chdb_client: Client, chdb_path: Path) -> Iterator[tuple[Client, Settings]]:
    """A fresh database (schema applied) in the session's embedded ClickHouse."""
    settings = Settings(clickhouse_dsn=f"chdb://{chdb_path}", database=f"fs_test_{next(_database_numbers)}")
    from stream.sinks.store import init_db

    init_db(chdb_client, settings)
    yield chdb_client, settings
    chdb_client.command(f"DROP DATABASE IF EXISTS {settings.database}")


@pytest.fixture(scope="session")
def bootstrap() -> str:
    """The real Kafka broker tests/run started; the test fails (never skips) without one."""
    from tests.services import kafka

    try:
        return kafka.bootstrap_servers()
    except RuntimeError as exc:
        reason = str(exc)
    pytest.fail(reason, pytrace=False)
