"""Event-time helpers shared by every record: integer milliseconds since the epoch, UTC."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

__all__ = ["DAY_MS", "HOUR_MS", "MINUTE_MS", "format_ts", "parse_iso_ts", "parse_ts"]

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def parse_iso_ts(value: str) -> int:
    """Return epoch milliseconds from an ISO-8601 string; a string without an offset is UTC.

    :func:`parse_ts` for a value known to be a string: the records' decoders call it directly
    and skip the type dispatch.

    Raises
    ------
    ValueError
        ``not an ISO-8601 timestamp: ...`` when ``datetime.fromisoformat`` rejects the string.

    >>> parse_iso_ts("2024-01-15T11:23:45.5+01:00")
    1705314225500
    """
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"not an ISO-8601 timestamp: {value!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return round(parsed.timestamp() * 1000)


def parse_ts(value: object) -> int:
    """Return epoch milliseconds from an ISO-8601 string or an integer of milliseconds.

    A string without an offset is read as UTC, because every input of faultstream is UTC
    by contract.

    >>> parse_ts("2024-01-15T10:23:45.5Z")
    1705314225500
    >>> parse_ts(1705314225500)
    1705314225500
    """
    if isinstance(value, bool):
        raise ValueError(f"timestamp must be an ISO-8601 string or epoch milliseconds, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return parse_iso_ts(value)
    raise ValueError(f"timestamp must be an ISO-8601 string or epoch milliseconds, got {value!r}")


@functools.lru_cache(maxsize=4096)
def format_ts(ts_ms: int) -> str:
    """Return the ISO-8601 UTC form (millisecond precision, ``Z`` suffix) of epoch milliseconds
    (cached: an incident's summary names its first evidence at each of its updates).

    >>> format_ts(1705314225500)
    '2024-01-15T10:23:45.500Z'
    """
    moment = datetime.fromtimestamp(ts_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"
