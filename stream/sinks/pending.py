"""A store connection made on a thread while the caller starts everything else.

The embedded engine's start (chdb: ~0.3 s) and the schema check then overlap the worker's other
start-up work instead of adding to it: every worker start and every failover is that much shorter
(docs/kafka.md#failover). Only work that waits overlaps it well: most of the engine's start holds
the interpreter's lock (its import, its library's loading, the schema's statements), so a worker
starts it once its own imports are done, while Faust starts and joins the group (broker round
trips); started beside the imports, it slowed them by about what it took. This module imports no
ClickHouse code itself: the thread does, so the caller's thread need not wait for it either.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from stream.settings import Settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["PendingStore"]


class PendingStore:
    """``connect(settings)`` (:func:`stream.sinks.store.connect`), started at once on a thread.

    :meth:`client` waits for it and returns the client, or raises what the connection raised (a
    :class:`~stream.sinks.errors.StoreError` with its message); :meth:`wait` only waits, for a
    caller that gives up before it needs the client (its process must not exit while the engine
    is half started).
    """

    def __init__(self, settings: Settings) -> None:
        self._client: Client | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._connect, args=(settings,), name="store-connect", daemon=True
        )
        self._thread.start()

    def _connect(self, settings: Settings) -> None:
        try:
            from stream.sinks.store import connect

            self._client = connect(settings)
        except BaseException as exc:  # handed to the caller's thread by client()
            self._error = exc

    def wait(self) -> None:
        """Wait until the connection is made or has failed."""
        self._thread.join()

    def failure(self) -> BaseException | None:
        """What the connection raised, once it has ended (None: connected, or still under way)."""
        return None if self._thread.is_alive() else self._error

    def client(self) -> Client:
        """The connected client (schema applied); raises what connecting raised."""
        self.wait()
        if self._error is not None:
            raise self._error
        assert self._client is not None
        return self._client
