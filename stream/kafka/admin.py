"""``faultstream init-kafka``: create the topics with their configs, or bring existing ones in line."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from stream.kafka.security import client_options
from stream.kafka.topics import topic_specs
from stream.settings import Settings

__all__ = ["create_topics"]


async def create_topics(settings: Settings) -> list[tuple[str, str]]:
    """Create the topics with their configs, or set the configs of those that exist; return
    ``(topic, "created" | "exists, config set")`` for each."""
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=30_000)
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
