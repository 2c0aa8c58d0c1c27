"""``replay --to``: publishing history to the input topics, in event-time order.

Records are encoded by :mod:`stream.kafka.codec` (keyed by node, or job id for jobs, with the
event time as the Kafka timestamp). Records that fail parsing, or come later than the allowed
lateness within their file, go to the dead-letter topic with the reason, source and location in
headers and the raw bytes as the value (:class:`stream.sinks.dead_letters.KafkaDeadLetters`), so
nothing is dropped on the way.
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
from stream.kafka.codec import encode_record, record_key
from stream.pipeline import late_dead_letter
from stream.settings import Settings
from stream.sinks.dead_letters import KafkaDeadLetters, to_dead_letter

__all__ = ["PublishSummary", "publish"]


@dataclass(slots=True)
class PublishSummary:
    """What a publish sent."""

    sources: list[SourceStats]
    sent: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    seconds: float = 0.0


async def publish(
    paths: Iterable[Path],
    settings: Settings,
    options: ParseOptions,
    fmt: Format | None = None,
    rate: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PublishSummary:
    """Publish history to the input topics in event-time order; ``rate`` paces it (records/s)."""
    started = time.perf_counter()
    inputs = MergedInputs(paths, options, fmt, settings.allowed_lateness_seconds * 1000)
    summary = PublishSummary(sources=inputs.sources)
    lateness_s = settings.allowed_lateness_seconds
    topics = {XidEvent: settings.topic_xid, EccSample: settings.topic_ecc, JobEvent: settings.topic_jobs}
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    sent = 0
    try:
        pending = []

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
                pending.append(
                    await producer.send(
                        topic, value=encode_record(item), key=record_key(item), timestamp_ms=item.ts_ms
                    )
                )
                stats.records[topic] += 1
                summary.sent[topic] = summary.sent.get(topic, 0) + 1
            sent += 1
            if len(pending) + letters.pending(0) >= 10_000:
                summary.dead_letters += await letters.deliver(0)
                await asyncio.gather(*pending)
                pending.clear()
                if progress is not None:
                    progress(inputs.bytes_done(), inputs.total_bytes)
            if rate:
                ahead = sent / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        summary.dead_letters += await letters.deliver(0)
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    if progress is not None:
        progress(inputs.total_bytes, inputs.total_bytes)
    summary.seconds = time.perf_counter() - started
    return summary
