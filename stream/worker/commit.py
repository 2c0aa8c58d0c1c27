"""The commit point: where a worker makes its work durable and commits input offsets.

Per input partition, every ``worker_flush_seconds`` or when its batch is full, in this order:

1. flush the partition's ClickHouse batch; on failure wait and retry with backoff, holding the
   agent (so Faust stops fetching: backpressure) and committing nothing;
2. send the incident updates and dead letters of the batch, and wait for the broker's acks;
3. hand the fleet stage what the partition found for it since the last commit point (facts,
   failed jobs, its horizon: :mod:`stream.kafka.fleet`), and wait for the acks;
4. write the partition's checkpoint (:mod:`stream.worker.checkpoints`) and wait for it;
5. commit the partition's input offsets (past the last message applied).

Incident updates need not wait for the commit point: :meth:`CommitPoint.publish` does steps 1
and 2 alone, at most ``worker_publish_seconds`` after an incident was decided (an SRE's pager is
that much closer to the evidence); the checkpoint and the offsets still move only at commit points.

A crash anywhere before 5 redoes the work from the previous checkpoint: ClickHouse rows are
idempotent (ReplacingMergeTree on deterministic ids), incident updates may reach the topic a
second time with the same id and version (consumers keep the highest version per id). The jobs
topic, whose messages are re-keyed rather than applied, is committed once every copy of a job
was delivered (:meth:`CommitPoint.commit_rekeyed`).

:func:`commit_offsets` is the only call that commits offsets to Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from faust.types import TP

from stream.kafka.fleet import encode_fleet_messages
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError, retry_delays
from stream.sinks.dead_letters import KafkaDeadLetters
from stream.worker.checkpoints import CheckpointTopic
from stream.worker.metrics import WorkerMetrics
from stream.worker.partition import PartitionWorker

__all__ = ["CommitPoint", "commit_offsets"]

_log = logging.getLogger("faultstream.worker")


async def commit_offsets(consumer: Any, offsets: dict[Any, int]) -> bool:
    """Commit ``offsets`` (topic partition -> next offset to read) for the worker's group.

    Faust offers no public call that commits given offsets without its own ack tracking, which
    the worker does not use (it can commit past messages its agents never saw): this is its
    private one, called from here only. Nothing is committed while the group rebalances: the
    commit would carry the old generation, which the broker refuses (aiokafka logs that as an
    ERROR), and whoever gets the partitions redoes the work from the checkpoint anyway.
    """
    if getattr(consumer.app, "rebalancing", False):
        return False
    return bool(await consumer._commit_offsets(offsets))


class CommitPoint:
    """Flush, send, checkpoint, commit — for one worker's partitions."""

    def __init__(
        self,
        app: Any,
        sink: ClickHouseSink,
        dead_letters: KafkaDeadLetters,
        incidents_topic: Any,
        checkpoints: CheckpointTopic,
        metrics: WorkerMetrics,
        fleet_topic: Any = None,
    ) -> None:
        self.app = app
        self.sink = sink
        self.dead_letters = dead_letters
        self.incidents_topic = incidents_topic
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.fleet_topic = fleet_topic
        #: Monotonic time of the last failed flush: the agent waits then, so nothing is delivered.
        self.last_flush_failure = 0.0
        #: The fleet topic's offset after the last message this worker sent to it.
        self.fleet_sent_end = 0
        #: Seconds the last successful flush took (its attempt alone, not the retries before it).
        self.last_flush_seconds = 0.0

    async def flush_sink(self, batch: int, still_ours: Callable[[], bool]) -> bool:
        """Flush one sink batch, retrying with backoff; False if the batch stopped being ours."""
        delays = retry_delays()
        while True:
            if not still_ours():
                return False
            try:
                started = time.perf_counter()
                self.sink.flush(batch)
                self.last_flush_seconds = time.perf_counter() - started
                return True
            except SinkFlushError as exc:
                delay = next(delays)
                self.last_flush_failure = time.monotonic()
                self.metrics.sink_flush_failures.inc()
                _log.warning(
                    "batch %d: ClickHouse flush failed, nothing is committed; retrying in %.1f s: %s",
                    batch, delay, exc,
                )  # fmt: skip
            if self.app.should_stop:
                return False
            await asyncio.sleep(delay)

    async def publish(self, state: PartitionWorker, still_ours: Callable[[], bool]) -> bool:
        """Steps 1 and 2: flush the partition's batch, then send its incident updates and dead
        letters and wait for the acks; False if the partition stopped being ours meanwhile."""
        if not await self.flush_sink(state.partition, still_ours):
            return False
        # What a publication costs, for its spacing: the successful flush and the sends, not the
        # waits between failed flushes (an outage would space the publications after it).
        started = time.perf_counter() - self.last_flush_seconds
        deliveries = [
            await self.incidents_topic.send(
                key=incident.node.encode(), value=orjson.dumps(incident.to_dict())
            )
            for incident in state.incidents.values()
        ]
        await asyncio.gather(*deliveries)
        await self.dead_letters.deliver(state.partition)
        self.metrics.incidents_out.inc(len(state.incidents))
        state.incidents.clear()
        state.last_publish = time.monotonic()
        state.publish_seconds = time.perf_counter() - started
        return True

    async def hand_over(self, state: PartitionWorker, idle: bool) -> None:
        """Step 3: send the partition's facts, failed jobs and horizon to the fleet topic (and
        whether it has nothing left to read), when any changed; wait for the acks."""
        if self.fleet_topic is None:
            return
        if not (
            state.fleet_facts
            or state.fleet_jobs
            or state.fleet_horizon_ms != state.handed_horizon_ms
            or idle != state.announced_idle
        ):
            return
        messages = encode_fleet_messages(
            state.partition,
            state.fleet_horizon_ms,
            state.fleet_facts,
            state.fleet_jobs,
            idle=idle,
            checkpointed_ms=state.checkpointed_horizon_ms,
            app=self.checkpoints.app_id,
            pending=idle and state.core.has_pending_decisions,
        )
        await self.send_fleet(messages)
        state.fleet_facts, state.fleet_jobs = [], []
        state.handed_horizon_ms = state.fleet_horizon_ms
        state.announced_idle = idle

    async def send_fleet(self, messages: Iterable[bytes]) -> None:
        """Send messages to the fleet topic's one partition and wait for the acks; the gauge
        ``faultstream_fleet_sent_offset`` then says how far the stage must read to have them."""
        deliveries = [await self.fleet_topic.send(value=value, partition=0) for value in messages]
        for metadata in await asyncio.gather(*deliveries):
            self.fleet_sent_end = max(self.fleet_sent_end, metadata.offset + 1)
        self.metrics.fleet_sent_offset.set(self.fleet_sent_end)

    async def commit(
        self, state: PartitionWorker, still_ours: Callable[[], bool], idle: bool = False
    ) -> None:
        """The partition's commit point: flush, send, hand over, checkpoint, then commit its input
        offsets."""
        if not await self.publish(state, still_ours):
            return
        if not still_ours():
            return  # revoked while waiting: the new owner redoes this from the previous checkpoint
        await self.hand_over(state, idle)
        if not still_ours():
            return
        started = time.perf_counter()
        horizon = state.core.fleet_horizon_ms
        size = await self.checkpoints.save(state.checkpoint())
        if horizon is not None:
            state.checkpointed_horizon_ms = horizon
        state.checkpoint_seconds = time.perf_counter() - started
        self.metrics.checkpoints_written.inc()
        self.metrics.checkpoint_bytes.labels(str(state.partition)).set(size)
        self.metrics.checkpoint_timestamp.labels(str(state.partition)).set_to_current_time()
        offsets = {TP(topic, state.partition): offset + 1 for topic, offset in state.applied.items()}
        await commit_offsets(self.app.consumer, offsets)  # only now: everything before is safe
        state.uncommitted = 0
        state.changed = False
        state.last_commit = time.monotonic()
        self.metrics.commits.inc()

    async def commit_rekeyed(
        self, jobs_topic: str, rekeyed: dict[int, int], committed: dict[int, int]
    ) -> None:
        """Commit the jobs messages whose copies were all delivered (``rekeyed``: partition -> last
        offset re-keyed); ``committed`` is updated with what was committed."""
        offsets = {
            TP(jobs_topic, partition): offset + 1
            for partition, offset in rekeyed.items()
            if committed.get(partition, -1) < offset
        }
        if offsets and await commit_offsets(self.app.consumer, offsets):
            committed.update({tp.partition: offset - 1 for tp, offset in offsets.items()})
