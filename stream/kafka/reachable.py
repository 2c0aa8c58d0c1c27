"""Waiting for a Kafka broker that does not answer yet, as long-running commands must.

A worker, ``tail``, ``notify`` or ``replay --to`` started while the broker is down (a host
rebooting, a stack whose Kafka starts last, a broker restart) waits for it: it tries again with
backoff (half a second, doubling, at most 30 s between tries), says so on its first failure and
then every half minute or so, and goes on once the broker answers. What waiting cannot mend stays
a quick, one-line error (:class:`~stream.kafka.security.KafkaAccessError`): a login or certificate
the broker refuses, a listener of another protocol, an address that cannot be right (not
HOST:PORT, an unknown host name). A port where nothing listens looks like a broker that is down:
the command waits and says what it tried, so a wrong port shows in its lines.

``FAULTSTREAM_KAFKA_WAIT_SECONDS`` bounds the wait (0, the default: as long as it takes, which is
what a supervised service wants).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from stream.kafka.security import KafkaAccessError, KafkaSecurity, check_kafka
from stream.settings import Settings

__all__ = ["wait_for_kafka"]

_log = logging.getLogger("faultstream.kafka")

#: The first pause between tries, and the longest one.
FIRST_PAUSE_SECONDS = 0.5
LONGEST_PAUSE_SECONDS = 30.0
#: A line at most this often while waiting (besides the first failure's).
SAY_EVERY_SECONDS = 30.0


async def wait_for_kafka(
    settings: Settings,
    command: str,
    *,
    waiting: Callable[[float], None] | None = None,
    check: Callable[[Settings], Awaitable[KafkaSecurity]] = check_kafka,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> KafkaSecurity:
    """:func:`~stream.kafka.security.check_kafka` until the broker answers, waiting between tries
    while nothing answers; ``command`` names the waiter in its lines (``"the worker"``).

    ``waiting(seconds)`` is told how long the command has waited after each try (0 once the broker
    answered): the worker shows it as ``faultstream_kafka_wait_seconds``.

    Raises
    ------
    KafkaAccessError
        At once when the broker refuses us or the address cannot be right; after
        ``settings.kafka_wait_seconds`` (when not 0) of waiting, with the last reason.
    """
    started = clock()
    pause = FIRST_PAUSE_SECONDS
    tries = 0
    said_at: float | None = None
    limit = settings.kafka_wait_seconds
    while True:
        tries += 1
        try:
            security = await check(settings)
        except KafkaAccessError as exc:
            now = clock()
            waited = now - started
            if not exc.transient:
                raise
            if limit and waited >= limit:
                raise KafkaAccessError(
                    f"{exc} (waited {waited:.0f} s, {tries} tries; FAULTSTREAM_KAFKA_WAIT_SECONDS={limit:g})",
                    transient=True,
                ) from None
            if waiting is not None:
                waiting(waited)
            if said_at is None:
                _log.warning(
                    "%s waits for Kafka at %s, which does not answer (%s); trying again with backoff "
                    "(up to %.0f s between tries%s)",
                    command, settings.kafka_bootstrap, exc, LONGEST_PAUSE_SECONDS,
                    f", for at most {limit:g} s" if limit else "; FAULTSTREAM_KAFKA_WAIT_SECONDS bounds it",
                )  # fmt: skip
                said_at = now
            elif now - said_at >= SAY_EVERY_SECONDS:
                _log.warning(
                    "%s still waits for Kafka at %s after %.0f s (%d tries; the last: %s)",
                    command, settings.kafka_bootstrap, waited, tries, exc,
                )  # fmt: skip
                said_at = now
            await sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_SECONDS)
            continue
        if said_at is not None:
            _log.warning(
                "Kafka at %s answered after %.0f s (%d tries); %s goes on",
                settings.kafka_bootstrap, clock() - started, tries, command,
            )  # fmt: skip
        if waiting is not None:
            waiting(0.0)
        return security
