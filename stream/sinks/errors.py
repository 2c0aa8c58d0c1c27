"""The store's error, apart from the client: the command line names it in its exit-code handler,
and importing :mod:`stream.sinks.store` imports clickhouse-connect (~0.1 s of every command's
start, the worker's included, which connects on a thread of its own: :mod:`stream.sinks.pending`).
"""

from __future__ import annotations

__all__ = ["StoreError"]


class StoreError(RuntimeError):
    """ClickHouse could not be reached or refused the schema; the message says what to check."""
