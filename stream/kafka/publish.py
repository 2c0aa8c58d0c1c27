"""Kafka I/O outside the worker: creating the topics, and publishing history with ``replay --to``.

Published records are the JSON form of :mod:`schemas.records` (the same documents the JSON
Schemas describe), keyed by node (XID, ECC) or job id (jobs), with the record's event time as the
Kafka message timestamp. Records that fail parsing go to the dead-letter topic with the reason,
source and location in headers and the raw bytes as the value, so nothing is dropped on the way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.topics import topic_specs
from stream.replay import MergedInputs, SourceStats, _Late, late_dead_letter
from stream.settings import Settings

__all__ = ["PublishSummary", "create_topics", "publish", "record_key"]


def record_key(record: XidEvent | EccSample | JobEvent) -> bytes:
    """The Kafka key of a record: its node, or its job id for job state changes."""
    if isinstance(record, JobEvent):
        return f"{record.cluster}/{record.job_id}".encode()
    return record.node.encode()


async def create_topics(settings: Settings) -> list[tuple[str, str]]:
    """Create the topics with their configs, or set the configs of those that exist; return
    ``(topic, "created" | "exists, config set")`` for each."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=30_000)
    await admin.start()
    outcome = []
    try:
        for spec in topic_specs(settings):
            topic = NewTopic(spec.name, spec.partitions, spec.replication, topic_configs=spec.config)
            try:
                response = await admin.create_topics([topic])
            except TopicAlreadyExistsError:
                exists = True
            else:
                errors = [e for e in getattr(response, "topic_errors", []) if e[1] not in (0, 36)]
                if errors:
                    raise RuntimeError(f"Kafka refused to create {spec.name}: {errors}")
                exists = any(e[1] == 36 for e in getattr(response, "topic_errors", []))
            if exists:
                # An existing topic gets this version's config (an older one kept inputs 7 days
                # by age, which deletes replayed history); its partition count is left alone.
                await _set_config(admin, spec.name, spec.config)
            outcome.append((spec.name, "exists, config set" if exists else "created"))
    finally:
        await admin.close()
    return outcome


async def _set_config(admin: AIOKafkaAdminClient, topic: str, config: dict[str, str]) -> None:
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=config)
    for response in await admin.alter_configs([resource]):
        for code, message, *_ in getattr(response, "resources", []):
            if code:
                raise RuntimeError(f"Kafka refused the config of {topic}: error {code} {message or ''}")


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
        for item, stats in inputs:
            if isinstance(item, InvalidRecord | _Late):
                if isinstance(item, _Late):
                    stats.late += 1
                    letter = late_dead_letter(
                        item.record, item.watermark_ms, stats.path, settings.allowed_lateness_seconds
                    )
                    reason, location, raw = letter.reason, letter.location, letter.raw
                else:
                    stats.dead_letters += 1
                    reason, location, raw = item.reason, item.location, item.raw
                summary.dead_letters += 1
                pending.append(
                    await producer.send(
                        settings.topic_dead_letters,
                        value=raw,
                        key=stats.path.encode(),
                        headers=[
                            ("reason", reason.encode()),
                            ("source", stats.path.encode()),
                            ("location", location.encode()),
                        ],
                    )
                )
            else:
                topic = topics[type(item)]
                pending.append(
                    await producer.send(
                        topic,
                        value=orjson.dumps(item.to_dict()),
                        key=record_key(item),
                        timestamp_ms=item.ts_ms,
                    )
                )
                stats.records[topic] += 1
                summary.sent[topic] = summary.sent.get(topic, 0) + 1
            sent += 1
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
                if progress is not None:
                    progress(inputs.bytes_done(), inputs.total_bytes)
            if rate:
                ahead = sent / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    if progress is not None:
        progress(inputs.total_bytes, inputs.total_bytes)
    summary.seconds = time.perf_counter() - started
    return summary
