"""`faultstream worker` whose ClickHouse inserts fail while a file exists: the sink-outage test.

    FAULTSTREAM_TEST_OUTAGE_FILE=/tmp/outage python tests/services/flaky_sink_worker.py worker ...

Everything else is the real worker; only the client's ``insert`` is wrapped, so the sink's own
error handling, the retry with backoff and the commit logic are what the test exercises.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from stream import cli
from stream.sinks import store
from stream.sinks.store import connect


class _FlakyClient:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._outage = Path(os.environ["FAULTSTREAM_TEST_OUTAGE_FILE"])

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self._outage.exists():
            raise ConnectionError(f"injected ClickHouse outage ({self._outage} exists)")
        return self._client.insert(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _flaky_connect(*args: Any, **kwargs: Any) -> Any:
    return _FlakyClient(connect(*args, **kwargs))


if __name__ == "__main__":
    # The worker connects on a thread of its own (stream.sinks.pending), through this function.
    store.connect = _flaky_connect
    sys.exit(cli.main())
