"""Kafka administration: ``faultstream init-kafka`` creates the topics with their configs (or brings
existing ones in line); the worker waits for its group's coordinator before Faust starts."""

from __future__ import annotations

import asyncio
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from stream.kafka.security import KafkaAccessError, client_options
from stream.kafka.topics import topic_specs
from stream.settings import Settings

__all__ = ["create_topics", "wait_for_group_coordinator"]


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


async def wait_for_group_coordinator(settings: Settings, group: str, timeout_s: float = 30.0) -> float:
    """Wait until the broker names a coordinator for consumer group ``group``.

    On a cluster where no group ever committed, the first FindCoordinator request makes the broker
    create ``__consumer_offsets``, and it answers "not available" until that topic is loaded; a
    Faust worker starting then logs "[ERROR] Group Coordinator Request failed:
    GroupCoordinatorNotAvailableError" before it succeeds. Asked here first, a healthy start
    logs no error.

    Parameters
    ----------
    settings
        The settings (bootstrap servers and security).
    group
        The consumer group.
    timeout_s
        How long the coordinator may take.

    Returns
    -------
    float
        Seconds waited.

    Raises
    ------
    KafkaAccessError
        When no coordinator is named within ``timeout_s`` or the broker refuses the request.
    """
    started = time.monotonic()
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        while True:
            try:
                await admin.find_coordinator(group)
                return time.monotonic() - started
            except KafkaError as exc:
                if not exc.retriable:
                    raise KafkaAccessError(
                        f"the broker names no coordinator for consumer group {group!r} "
                        f"({type(exc).__name__}: {exc.args[0] if exc.args else exc})"
                    ) from None
                if time.monotonic() - started > timeout_s:
                    raise KafkaAccessError(
                        f"the broker named no coordinator for consumer group {group!r} within "
                        f"{timeout_s:.0f} s ({type(exc).__name__})"
                    ) from None
            await asyncio.sleep(0.25)
    except TimeoutError:
        raise KafkaAccessError(
            f"Kafka at {settings.kafka_bootstrap} did not answer within {timeout_s:.0f} s"
        ) from None
    finally:
        await admin.close()
