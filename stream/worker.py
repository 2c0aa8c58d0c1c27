"""``faultstream worker``: the Faust application that runs the detection core on Kafka.

Topology
--------
``jobs`` (key: job) --rekey_jobs--> ``jobs-by-node`` (key: node, one copy per node of the job)
``xid``, ``ecc``, ``jobs-by-node`` (co-partitioned by node) --detect--> ClickHouse, ``incidents``

Per assigned input partition the worker keeps one :class:`detectors.core.DetectionCore`, fed in
event-time order by an :class:`~stream.event_time_merge.EventTimeMerger` over the partition's
three topics, and one batch of the :class:`~stream.sinks.clickhouse.ClickHouseSink`.

Where offsets are committed: events are read with manual acks and acked only after the
ClickHouse batch holding their effects was flushed (:meth:`PartitionWorker.flush`); Faust
commits acked offsets. A failed flush keeps the batch, acks nothing, and is retried.

Known limits of this first version (issue 4 continues): detector state lives in memory, so a
restarted worker replays its partitions from the last commit and relearns; the storm detector's
fleet quantile and the lemon statistics see one partition's nodes, not the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import orjson

from detectors.core import DetectionCore
from schemas.outputs import Incident
from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.event_time_merge import EventTimeMerger
from stream.replay import late_dead_letter
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError
from stream.sinks.dead_letters import DeadLetterLimitExceeded, DeadLetterPolicy, to_dead_letter
from stream.store import connect

__all__ = ["PartitionWorker", "build_app", "decode"]

_log = logging.getLogger("faultstream.worker")

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def decode(topic_kind: str, value: bytes, source: str, location: str) -> XidEvent | EccSample | JobEvent:
    """Decode one message of an input topic; raise :class:`InvalidRecord` with the reason."""
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidRecord(f"not JSON ({exc})", value, source, location) from None
    parse = {"xid": XidEvent.from_dict, "ecc": EccSample.from_dict, "job": JobEvent.from_dict}[topic_kind]
    try:
        return parse(document, f"{source}:{location}")
    except InvalidRecord as exc:
        raise InvalidRecord(exc.reason, value, source, location) from None


@dataclass(slots=True)
class PartitionWorker:
    """The state of one input partition: its core, its merge buffer, its batch, its unacked events."""

    partition: int
    lateness_s: int
    core: DetectionCore
    merger: EventTimeMerger[tuple[XidEvent | EccSample | JobEvent, Any]]
    unacked: list[Any] = field(default_factory=list)
    incidents: dict[str, Incident] = field(default_factory=dict)
    last_flush: float = field(default_factory=time.monotonic)

    def process_released(self, sink: ClickHouseSink) -> None:
        """Run every record the merge releases through the core; collect outputs for the batch."""
        for record, event in self.merger.release():
            if self.core.process(record):
                if not isinstance(record, EccSample):
                    sink.add(record, self.partition)
            else:
                letter = late_dead_letter(
                    record, self.core.watermark_ms or 0, f"partition {self.partition}", self.lateness_s
                )
                sink.add(letter, self.partition)
            self.unacked.append(event)
        emitted = self.core.drain()
        for incident in emitted.incidents:
            self.incidents[incident.incident_id] = incident
        sink.add_emitted(emitted, self.partition)


def build_app(settings: Settings) -> faust.App:
    """The Faust app of a worker, configured from ``settings``."""
    datadir = Path(settings.data_dir) / "faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.worker_app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication,
        topic_allow_declare=False,
        broker_commit_every=1000,
        datadir=str(datadir),
    )
    kinds = {settings.topic_xid: "xid", settings.topic_ecc: "ecc", settings.topic_jobs_by_node: "job"}
    jobs = app.topic(settings.topic_jobs, **_RAW)
    jobs_by_node = app.topic(settings.topic_jobs_by_node, **_RAW)
    inputs = app.topic(settings.topic_xid, settings.topic_ecc, settings.topic_jobs_by_node, **_RAW)
    incidents_topic = app.topic(settings.topic_incidents, **_RAW)
    dead_letter_topic = app.topic(settings.topic_dead_letters, **_RAW)
    sink = ClickHouseSink(connect(settings), settings.database, settings.sink_batch_rows)
    policy = DeadLetterPolicy(
        settings.dead_letter_max_ratio,
        settings.dead_letter_min_records,
        hint="Is the producer writing the JSON Schemas of schemas/jsonschema/?",
    )
    partitions: dict[int, PartitionWorker] = {}
    lock = asyncio.Lock()

    def partition_worker(number: int) -> PartitionWorker:
        state = partitions.get(number)
        if state is None:
            state = partitions[number] = PartitionWorker(
                number,
                settings.allowed_lateness_seconds,
                DetectionCore(settings.core_config()),
                EventTimeMerger(
                    sorted(kinds.values()), idle_after=settings.worker_idle_seconds, clock=time.monotonic
                ),
            )
        return state

    async def dead_letter(error: InvalidRecord, kind: str, partition: int) -> None:
        sink.add(to_dead_letter(error, kind), partition)
        policy.bad(error.source, error.reason)
        await dead_letter_topic.send(
            key=error.source.encode(),
            value=error.raw,
            headers=[("reason", error.reason.encode()), ("source", error.source.encode()),
                     ("location", error.location.encode())],
        )  # fmt: skip
        try:
            policy.check(error.source)
        except DeadLetterLimitExceeded as exc:
            # A bad deploy must not drain the stream into the dead letters: stop, loudly.
            _log.error("stopping the worker: %s", exc)
            await app.crash(exc)
            raise

    async def flush(state: PartitionWorker) -> None:
        try:
            sink.flush(state.partition)
        except SinkFlushError as exc:
            _log.warning("partition %d: ClickHouse flush failed, will retry: %s", state.partition, exc)
            return  # nothing acked: the offsets stay where the data is
        for event in state.unacked:
            event.ack()  # marks the offset safe to commit; Faust commits in offset order
        state.unacked.clear()
        for incident in state.incidents.values():
            await incidents_topic.send(
                key=incident.incident_id.encode(), value=orjson.dumps(incident.to_dict()), timestamp=None
            )
        state.incidents.clear()
        state.last_flush = time.monotonic()

    @app.agent(jobs)
    async def rekey_jobs(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            message = event.message
            source = f"{message.topic}/{message.partition}"
            try:
                job = decode("job", event.value, source, f"offset {message.offset}")
            except InvalidRecord as error:
                await dead_letter(error, "job", message.partition)
                continue
            for node in sorted(set(job.nodes)):
                await jobs_by_node.send(key=node.encode(), value=event.value, timestamp=job.ts_ms / 1000)

    @app.agent(inputs)
    async def detect(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.noack().events():
            message = event.message
            kind = kinds[message.topic]
            source = f"{message.topic}/{message.partition}"
            async with lock:
                state = partition_worker(message.partition)
                try:
                    record = decode(kind, event.value, source, f"offset {message.offset}")
                except InvalidRecord as error:
                    await dead_letter(error, kind, message.partition)
                    event.ack()
                    continue
                policy.good(source)
                state.merger.add(kind, record.ts_ms, (record, event))
                state.process_released(sink)
                if (
                    sink.should_flush(state.partition)
                    or time.monotonic() - state.last_flush >= settings.worker_flush_seconds
                ):
                    await flush(state)
        # The stream ended (shutdown): unflushed work is not acked and is read again on restart.

    @app.timer(interval=max(settings.worker_flush_seconds / 2, 0.2))
    async def release_idle() -> None:
        async with lock:
            for state in partitions.values():
                state.process_released(sink)
                if state.unacked and time.monotonic() - state.last_flush >= settings.worker_flush_seconds:
                    await flush(state)

    return app


def run_worker(settings: Settings) -> None:
    """Run a worker until it is stopped (``faultstream worker``)."""
    app = build_app(settings)
    # Faust's command line reads sys.argv, and would otherwise start a web server on 0.0.0.0:6066,
    # which two workers on one host cannot share.
    sys.argv = ["faultstream-worker", "worker", "-l", "warn", "--without-web"]
    app.main()
