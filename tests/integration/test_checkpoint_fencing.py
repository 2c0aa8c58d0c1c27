"""Fenced checkpoints on the real broker (issue 12): a stale owner cannot replace a newer owner's
checkpoint, so the next owner never restores one older than what the group committed.

No broker fails these tests, never skips them: run them through tests/run.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from detectors.core import CoreConfig, DetectionCore
from stream.worker.checkpoints import CheckpointTopic, PartitionCheckpoint, StaleCheckpoint
from tests.services import kafka

pytestmark = pytest.mark.integration


def checkpoint(offset: int, generation: int) -> PartitionCheckpoint:
    return PartitionCheckpoint(1, {"xid": offset}, DetectionCore(CoreConfig()), generation=generation)


async def _takeover(bootstrap: str, topic: str) -> tuple[list[int], str, PartitionCheckpoint]:
    old, new, third = (CheckpointTopic({"bootstrap_servers": bootstrap}, topic, "app") for _ in range(3))
    for client in (old, new, third):
        await client.start(2)
    try:
        assert await old.load(1) is None
        await old.save(checkpoint(100, 1))
        await old.save(checkpoint(200, 1))
        # The group moves the partition on without the old owner (its session timed out while it
        # was busy): the new owner restores 200 and writes 300; the old one, unaware, tries 250.
        loaded = await new.load(1)
        assert loaded is not None and loaded[0].offsets == {"xid": 200}
        await new.save(checkpoint(300, 2))
        with pytest.raises(StaleCheckpoint, match="written by another worker") as refused:
            await old.save(checkpoint(250, 1))
        await new.save(checkpoint(400, 2))  # the owner goes on
        restored = await third.load(1)
        assert restored is not None
        return [c.offsets["xid"] for c in (restored[0],)], str(refused.value), restored[0]
    finally:
        for client in (old, new, third):
            await client.stop()


def test_a_stale_owner_cannot_replace_the_newer_owners_checkpoint(bootstrap: str) -> None:
    topic = f"checkpoints-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(topic, 2, bootstrap=bootstrap)
    try:
        offsets, refused, restored = asyncio.run(_takeover(bootstrap, topic))
    finally:
        kafka.delete_topic(topic, bootstrap=bootstrap)
    assert offsets == [400] and restored.generation == 2
    assert "generation 1" in refused
