"""Sending the spool to Kafka: oldest records first, the spool moved past them once acknowledged.

One producer with the settings' security (:func:`stream.kafka.security.client_options`),
idempotent and ``acks=all``. While the broker is away (at start too) the records wait in the spool;
the sender tries again with a pause that doubles up to 30 s, says so once in the log when the
broker goes and once when it is back, and counts each failed send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from stream.agent.metrics import AgentMetrics
from stream.agent.spool import Spool
from stream.kafka.security import client_options
from stream.settings import Settings

__all__ = ["SpoolSender"]

_log = logging.getLogger("faultstream.agent")

_LONGEST_PAUSE_S = 30.0
#: Records sent per round (each round waits for all of its acknowledgements).
_BATCH_RECORDS = 2000
#: How long one batch's acknowledgements are waited for.
_BATCH_TIMEOUT_S = 20.0


class SpoolSender:
    """Moves records from the spool to Kafka until cancelled."""

    def __init__(self, settings: Settings, spool: Spool, metrics: AgentMetrics) -> None:
        self.settings = settings
        self.spool = spool
        self.metrics = metrics
        self.wake = asyncio.Event()
        self._producer: Any = None
        self._failing_since: float | None = None

    async def run(self) -> None:
        pause = 0.5
        try:
            while True:
                batch = self.spool.pending(_BATCH_RECORDS)
                if not batch:
                    self.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), 5.0)
                    continue
                if await self._send(batch):
                    pause = 0.5
                else:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _LONGEST_PAUSE_S)
        finally:
            await self._close_producer()

    async def _send(self, batch: list[Any]) -> bool:
        """Send one batch; True once Kafka acknowledged all of it."""
        try:
            producer = await self._started_producer()
            repeats = self.spool.take_in_doubt(batch)
            self.spool.sending(batch[-1].end)
            futures = [await producer.send(entry.topic, value=entry.value, key=entry.key) for entry in batch]
            # aiokafka may hold a batch for a broker that is gone well past its request timeout:
            # after this long the batch counts as failed and the next try uses a new producer.
            outcomes = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), _BATCH_TIMEOUT_S
            )
        except Exception as exc:  # the broker away: aiokafka raises its own errors and OSErrors
            await self._failed(exc)
            self.spool.doubt(batch[-1].end)
            return False
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            await self._failed(failures[0])
            self.spool.doubt(batch[-1].end)  # the acknowledged part is repeated by the next try
            return False
        if repeats:
            self.metrics.repeats.inc(repeats)
            _log.info("sent %d record(s) again that Kafka may already hold (after a crash or a failed send)",
                      repeats)  # fmt: skip
        self.spool.acknowledged(batch)
        topics: dict[str, int] = {}
        for entry in batch:
            topics[entry.topic] = topics.get(entry.topic, 0) + 1
        for topic, count in topics.items():
            self.metrics.published.labels(topic).inc(count)
        if self._failing_since is not None:
            away = time.monotonic() - self._failing_since
            _log.warning("Kafka is back after %.0f s: sending the spool", away)
            self._failing_since = None
        return True

    async def _started_producer(self) -> Any:
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(
                **client_options(self.settings),
                enable_idempotence=True,
                acks="all",
                linger_ms=5,
                request_timeout_ms=15_000,
                max_request_size=2 * 1024 * 1024,
            )
            try:
                await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _failed(self, exc: BaseException) -> None:
        """Count and (once per outage) say a failed send; start the next try with a new producer
        (an idempotent producer whose batches expired may be out of step with the broker)."""
        self.metrics.publish_failures.inc()
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            _log.warning(
                "cannot publish to Kafka (%s: %s): keeping the records in the spool and trying again",
                type(exc).__name__,
                exc,
            )
        await self._close_producer()

    async def _close_producer(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), 10)
            self._producer = None
