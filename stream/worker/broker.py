"""The worker's own questions to the broker: end offsets and the group's committed offsets.

Faust's consumer answers ``highwaters()`` from its consumer thread, which takes the call between
fetches: about a second a call under load. The timer asks every second, so the worker keeps a
client of its own for these two read-only requests, on its own event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

__all__ = ["BrokerQueries", "PartitionReader"]


class PartitionReader:
    """Reads one partition from a given offset, outside any consumer group (the fleet topics)."""

    def __init__(self, kafka: dict[str, Any], topic: str, partition: int = 0) -> None:
        #: aiokafka keyword arguments (:func:`stream.kafka.security.client_options`).
        self.kafka = kafka
        self.tp = TopicPartition(topic, partition)
        self._consumer: AIOKafkaConsumer | None = None
        self._next: int | None = None

    async def read(self, offset: int, timeout_ms: int = 0) -> list[tuple[int, bytes]]:
        """Messages from ``offset`` on that have been fetched (waiting up to ``timeout_ms``), as
        (offset, value); the next call continues from ``offset`` plus what this one returned."""
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
            await consumer.start()
            consumer.assign([self.tp])
            self._consumer = consumer
        if self._next != offset:
            self._consumer.seek(self.tp, offset)
        batch = (await self._consumer.getmany(self.tp, timeout_ms=timeout_ms)).get(self.tp, [])
        found = [(message.offset, message.value or b"") for message in batch]
        self._next = found[-1][0] + 1 if found else offset
        return found

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()


class BrokerQueries:
    """An admin client and a consumer outside any group, started on first use."""

    def __init__(self, kafka: dict[str, Any]) -> None:
        #: aiokafka keyword arguments: bootstrap servers and security
        #: (:func:`stream.kafka.security.client_options`).
        self.kafka = kafka
        self._admin: AIOKafkaAdminClient | None = None
        self._offsets: AIOKafkaConsumer | None = None

    async def end_offsets(self, partitions: Iterable[Any]) -> dict[Any, int]:
        """The end offset (next offset to be written) of each partition, keyed as given."""
        asked = list(partitions)
        if not asked:
            return {}
        if self._offsets is None:
            consumer = AIOKafkaConsumer(**self.kafka, enable_auto_commit=False)
            await consumer.start()
            self._offsets = consumer
        ends = await self._offsets.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in asked])
        return {tp: ends[TopicPartition(tp.topic, tp.partition)] for tp in asked}

    async def committed(self, group: str, partitions: Iterable[Any]) -> Mapping[Any, int]:
        """The group's committed offset of each partition (-1: none), keyed by topic partition."""
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.kafka)
            await admin.start()
            self._admin = admin
        answer = await self._admin.list_consumer_group_offsets(
            group, partitions=[TopicPartition(tp.topic, tp.partition) for tp in partitions]
        )
        return {tp: meta.offset for tp, meta in answer.items()}

    async def close(self) -> None:
        if self._offsets is not None:
            await self._offsets.stop()
        if self._admin is not None:
            await self._admin.close()
