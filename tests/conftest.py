"""Shared fixtures. Services used by integration and e2e tests are real and started once per session.

ClickHouse is chdb — the real ClickHouse engine, in process. chdb allows one store path per
process, so the whole session shares one path and every test gets a database of its own.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from clickhouse_connect.driver.client import Client

from stream.settings import Settings
from stream.sinks.store import connect

if TYPE_CHECKING:
    from tests.services.secure_kafka import SecureBroker

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


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A broker of its own with SASL_SSL and client-certificate SSL listeners (certificates made
    for the run), stopped by PID at the end of the session; the tests fail (never skip) when it
    cannot start."""
    from tests.services import secure_kafka

    try:
        broker = secure_kafka.start(tmp_path_factory.mktemp("secure-kafka"))
    except (RuntimeError, KeyError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"the secured Kafka test broker did not start: {exc}", pytrace=False)
    yield broker
    broker.stop()
