"""``replay --to``: publishing history to the input topics, in event-time order.

Records are encoded by :mod:`stream.kafka.codec` (keyed by node, or job id for jobs, with the
event time as the Kafka timestamp) and batched deterministically: consecutive records of one
partition, up to ``records_per_message`` records and ``MAX_MESSAGE_BYTES`` bytes a message, the
partition computed from the record's key as Kafka's default partitioner would, so each
partition's order is exactly the one-record-a-message order; when one message is full, every
partition's pending records go out with it (event-time order across topics, see
:class:`MessageBatcher`). Nothing waits on a timer; a paced
publish (``rate``) sends what it holds whenever it is ahead of its schedule.

Records that fail parsing, or come later than the allowed lateness within their file, go to the
dead-letter topic with the reason, source and location in headers and the raw bytes as the value
(:class:`stream.sinks.dead_letters.KafkaDeadLetters`), so nothing is dropped on the way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.inputs.files import LateRecord, MergedInputs, SourceStats
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.codec import (
    MAX_MESSAGE_BYTES,
    RECORDS_PER_MESSAGE,
    encode_record,
    partition_for_key,
    record_key,
)
from stream.kafka.security import client_options
from stream.pipeline import late_dead_letter
from stream.settings import Settings
from stream.sinks.dead_letters import KafkaDeadLetters, to_dead_letter

__all__ = ["MessageBatcher", "OutgoingMessage", "PublishSummary", "publish"]


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to send: consecutive records of one partition, newline-delimited."""

    topic: str
    partition: int
    key: bytes
    timestamp_ms: int
    value: bytes
    records: int


@dataclass(slots=True)
class _Pending:
    key: bytes
    timestamp_ms: int
    lines: list[bytes] = field(default_factory=list)
    size: int = 0


class MessageBatcher:
    """Cuts each partition's records into messages of at most ``records`` records and ``max_bytes``.

    When one partition's message is full, every partition's pending records go out with it,
    oldest first: records reach the broker in event-time order across topics and partitions, so a
    sparse topic's records (a few XIDs a day) never wait behind days of a dense one's (ECC) — a
    worker would otherwise see the dense topic far ahead and the sparse one silent, and take it
    for idle. The cut depends only on the records, never on a clock: the same input gives the
    same messages.

    Examples
    --------
    >>> batcher = MessageBatcher({"xid": 2}, records=2)
    >>> batcher.add("xid", b"node0001", 10, b"a")
    []
    >>> batcher.add("xid", b"node0004", 11, b"b")  # node0004 hashes to the other partition
    []
    >>> [(m.partition, m.value) for m in batcher.add("xid", b"node0001", 12, b"c")]
    [(0, b'a\\nc'), (1, b'b')]
    >>> batcher.drain()
    []
    """

    def __init__(self, partitions: dict[str, int], records: int = RECORDS_PER_MESSAGE,
                 max_bytes: int = MAX_MESSAGE_BYTES) -> None:  # fmt: skip
        if records < 1:
            raise ValueError(f"records per message must be at least 1, got {records}")
        self._partitions = partitions
        self._records = records
        self._max_bytes = max_bytes
        self._pending: dict[tuple[str, int], _Pending] = {}

    def add(self, topic: str, key: bytes, timestamp_ms: int, line: bytes) -> list[OutgoingMessage]:
        """Hold one encoded record; return the messages to send now (none, or every pending one
        when this record fills its partition's message)."""
        where = (topic, partition_for_key(key, self._partitions[topic]))
        pending = self._pending.get(where)
        if pending is not None and pending.size + len(line) + 1 > self._max_bytes:
            out = self.drain()  # this partition's message is full before this record
            pending = None
        else:
            out = []
        if pending is None:
            pending = self._pending[where] = _Pending(key, timestamp_ms)
        pending.lines.append(line)
        pending.size += len(line) + 1
        if len(pending.lines) >= self._records:
            out += self.drain()
        return out

    def drain(self) -> list[OutgoingMessage]:
        """Every pending message, oldest first record first (then by topic and partition)."""
        order = sorted(self._pending, key=lambda where: (self._pending[where].timestamp_ms, where))
        messages = [self._message(where, self._pending[where]) for where in order]
        self._pending.clear()
        return messages

    @staticmethod
    def _message(where: tuple[str, int], pending: _Pending) -> OutgoingMessage:
        topic, partition = where
        value = b"\n".join(pending.lines)
        return OutgoingMessage(topic, partition, pending.key, pending.timestamp_ms, value, len(pending.lines))


@dataclass(slots=True)
class PublishSummary:
    """What a publish sent."""

    sources: list[SourceStats]
    #: Records sent, per topic.
    sent: dict[str, int] = field(default_factory=dict)
    #: Messages they went out in, per topic.
    messages: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    seconds: float = 0.0


async def publish(
    paths: Iterable[Path],
    settings: Settings,
    options: ParseOptions,
    fmt: Format | None = None,
    rate: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    records_per_message: int = RECORDS_PER_MESSAGE,
) -> PublishSummary:
    """Publish history to the input topics in event-time order; ``rate`` paces it (records/s);
    ``records_per_message`` 1 sends every record as a message of its own."""
    started = time.perf_counter()
    inputs = MergedInputs.for_settings(paths, options, fmt, settings)
    summary = PublishSummary(sources=inputs.sources)
    lateness_s = settings.allowed_lateness_seconds
    topics = {XidEvent: settings.topic_xid, EccSample: settings.topic_ecc, JobEvent: settings.topic_jobs}
    producer = AIOKafkaProducer(
        **client_options(settings),
        enable_idempotence=True,
        # No linger: each partition's batch lingers on its own, so a jobs record was readable up to
        # 31 ms after later ECC records (half an hour of a paced replay's event time), past the
        # skew a worker's idle rule allows for (PUBLISH_SKEW_SECONDS, docs/kafka.md). Messages
        # still queue into batches while a request is in flight.
        linger_ms=0,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    sent = 0
    try:
        partitions = {
            topic: len(await producer.partitions_for(topic)) for topic in sorted(set(topics.values()))
        }
        batcher = MessageBatcher(partitions, records_per_message)
        pending = []

        async def send(message: OutgoingMessage) -> None:
            pending.append(
                await producer.send(
                    message.topic,
                    value=message.value,
                    key=message.key,
                    partition=message.partition,
                    timestamp_ms=message.timestamp_ms,
                )
            )
            summary.messages[message.topic] = summary.messages.get(message.topic, 0) + 1

        async def send_dead_letter(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
            return await producer.send(settings.topic_dead_letters, value=value, key=key, headers=headers)

        letters = KafkaDeadLetters(send_dead_letter)
        for item, stats in inputs:
            if isinstance(item, InvalidRecord):
                stats.dead_letters += 1
                letters.produce(to_dead_letter(item))
            elif isinstance(item, LateRecord):
                stats.late += 1
                letters.produce(late_dead_letter(item.record, item.watermark_ms, stats.path, lateness_s))
            else:
                topic = topics[type(item)]
                for message in batcher.add(topic, record_key(item), item.ts_ms, encode_record(item)):
                    await send(message)
                stats.records[topic] += 1
                summary.sent[topic] = summary.sent.get(topic, 0) + 1
            sent += 1
            if len(pending) + letters.pending(0) >= 2_000:
                summary.dead_letters += await letters.deliver(0)
                await asyncio.gather(*pending)
                pending.clear()
                if progress is not None:
                    progress(inputs.bytes_done(), inputs.total_bytes)
            if rate:
                ahead = sent / rate - (time.perf_counter() - started)
                if ahead > 0:
                    for message in batcher.drain():  # paced: nothing waits longer than the pace
                        await send(message)
                    await asyncio.sleep(ahead)
        for message in batcher.drain():
            await send(message)
        summary.dead_letters += await letters.deliver(0)
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        inputs.close()
        await producer.stop()
    if progress is not None:
        progress(inputs.total_bytes, inputs.total_bytes)
    summary.seconds = time.perf_counter() - started
    return summary
