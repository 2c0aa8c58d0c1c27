"""``faultstream worker``: the Faust application that runs the detection core on Kafka.

Topology
--------
``jobs`` (key: job) --rekey_jobs--> ``jobs-by-node`` (key: node, one copy per node of the job)
``xid``, ``ecc``, ``jobs-by-node`` (co-partitioned by node) --detect--> ClickHouse, ``incidents``

Per assigned input partition the worker keeps one :class:`PartitionWorker`: a
:class:`detectors.core.DetectionCore`, fed in event-time order by an
:class:`~stream.event_time_merge.EventTimeMerger` over the partition's three topics, and one batch
of the :class:`~stream.sinks.clickhouse.ClickHouseSink`.

Commit point (:func:`commit`), every ``worker_flush_seconds`` or when a batch is full:

1. flush the partition's ClickHouse batch; on failure wait and retry with backoff, holding the
   agent (so Faust stops fetching: backpressure) and acking nothing;
2. send the incident updates and dead letters of the batch, and wait for the broker's acks;
3. write the partition's checkpoint (:mod:`stream.checkpoints`) and wait for it;
4. commit the partition's input offsets (past the last message applied).

The worker commits offsets itself (the input topics are declared without Faust acks): Faust's
offset tracking can commit past messages its agents never saw. :class:`stream.offsets.InputPositions`
checks that each input partition's messages arrive contiguously; a gap, or a partition with more
to read that has delivered nothing for ``_STALL_SECONDS``, is read again from its first offset not
applied (logged, and counted in ``faultstream_input_rereads_total``).

A crash anywhere before 4 redoes the work from the previous checkpoint: ClickHouse rows are
idempotent (ReplacingMergeTree on deterministic ids), and incident updates may reach the topic a
second time with the same id and version (at-least-once; consumers keep the highest version per
id). Because the checkpoint is written before the commit, a restarted
worker resumes the detectors exactly where the committed offsets are, skipping messages whose
effect the checkpoint already holds.

Known limit: the storm detector's fleet quantile and the lemon statistics see the nodes of one
partition, so with several partitions their thresholds can differ from a single-partition run's.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import orjson
from faust.types import TP

from detectors.core import DetectionCore
from schemas.outputs import Incident
from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.checkpoints import CheckpointTopic, PartitionCheckpoint
from stream.event_time_merge import EventTimeMerger
from stream.metrics import WorkerMetrics
from stream.offsets import Delivery, InputPositions
from stream.replay import late_dead_letter
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, FlushStats, SinkFlushError
from stream.sinks.dead_letters import DeadLetterLimitExceeded, DeadLetterPolicy, reason_class, to_dead_letter
from stream.store import connect

__all__ = ["PartitionWorker", "build_app", "decode"]

_log = logging.getLogger("faultstream.worker")

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}
#: Sink batch of the dead letters found while re-keying jobs (input partitions are >= 0).
_REKEY_BATCH = -1
_MAX_BACKOFF_S = 30.0
#: A partition with more to read that delivered nothing for this long is read again.
_STALL_SECONDS = 15.0

Record = XidEvent | EccSample | JobEvent


def decode(topic_kind: str, value: bytes, source: str, location: str) -> Record:
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
    """The state of one input partition: what its checkpoint holds, plus the uncommitted batch."""

    partition: int
    core: DetectionCore
    merger: EventTimeMerger[Record]
    #: Input topic -> offset of the last message applied (in the core, the merge or a dead letter).
    applied: dict[str, int] = field(default_factory=dict)
    #: Messages applied since the last commit point.
    uncommitted: int = 0
    incidents: dict[str, Incident] = field(default_factory=dict)
    letters: list[InvalidRecord] = field(default_factory=list)
    #: Records went through the core since the last commit point (released from the merge at
    #: idle time, their messages may all be acked already: the checkpoint held them).
    changed: bool = False
    last_commit: float = field(default_factory=time.monotonic)

    @classmethod
    def start(
        cls,
        partition: int,
        settings: Settings,
        sources: list[str],
        checkpoint: PartitionCheckpoint | None,
        drained: Callable[[str], bool],
    ) -> PartitionWorker:
        """A fresh partition, or one continuing from ``checkpoint``; ``drained(source)`` tells the
        merge whether anything of that source is still waiting to be read."""
        merger: EventTimeMerger[Record] = EventTimeMerger(
            sources, idle_after=settings.worker_idle_seconds, clock=time.monotonic, drained=drained
        )
        if checkpoint is None:
            return cls(partition, DetectionCore(settings.core_config()), merger)
        for source, ts_ms, record in checkpoint.held:
            merger.add(source, ts_ms, record)
        return cls(partition, checkpoint.core, merger, dict(checkpoint.offsets))

    def checkpoint(self) -> PartitionCheckpoint:
        """What a worker taking over this partition needs (only valid at a commit point)."""
        return PartitionCheckpoint(self.partition, dict(self.applied), self.core, self.merger.held())

    def process_released(self, sink: ClickHouseSink, lateness_s: int) -> int:
        """Run every record the merge releases through the core into the batch; return the late ones."""
        late = 0
        for record in self.merger.release():
            self.changed = True
            if self.core.process(record):
                if not isinstance(record, EccSample):
                    sink.add(record, self.partition)
            else:
                late += 1
                where = f"partition {self.partition}"
                letter = late_dead_letter(record, self.core.watermark_ms or 0, where, lateness_s)
                sink.add(letter, self.partition)
        emitted = self.core.drain()
        for incident in emitted.incidents:
            self.incidents[incident.incident_id] = incident
        sink.add_emitted(emitted, self.partition)
        return late


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
        # Nothing is acked to Faust (the worker commits its own offsets); a rebalance must not wait for
        # them (the partition's next owner redoes them from its checkpoint).
        stream_wait_empty=False,
        datadir=str(datadir),
    )
    kinds = {settings.topic_xid: "xid", settings.topic_ecc: "ecc", settings.topic_jobs_by_node: "job"}
    sources = sorted(kinds.values())
    # acks=False: Faust neither tracks nor commits these offsets; the commit points do.
    jobs = app.topic(settings.topic_jobs, acks=False, **_RAW)
    jobs_by_node = app.topic(settings.topic_jobs_by_node, **_RAW)
    inputs = app.topic(
        settings.topic_xid, settings.topic_ecc, settings.topic_jobs_by_node, acks=False, **_RAW
    )
    incidents_topic = app.topic(settings.topic_incidents, **_RAW)
    dead_letter_topic = app.topic(settings.topic_dead_letters, **_RAW)
    metrics = WorkerMetrics()

    def flushed(stats: FlushStats) -> None:
        metrics.sink_flush_seconds.observe(stats.seconds)
        metrics.sink_rows.inc(stats.rows)

    sink = ClickHouseSink(connect(settings), settings.database, settings.sink_batch_rows, on_flush=flushed)
    checkpoints = CheckpointTopic(
        settings.kafka_bootstrap, settings.topic_checkpoints, settings.worker_app_id
    )
    checkpoints_started = False
    policy = DeadLetterPolicy(
        settings.dead_letter_max_ratio,
        settings.dead_letter_min_records,
        hint="Is the producer writing the JSON Schemas of schemas/jsonschema/?",
    )
    partitions: dict[int, PartitionWorker] = {}
    positions: InputPositions[Any] = InputPositions(time.monotonic)
    last_flush_failure = 0.0  # the agent waits while a flush is retried: no deliveries then
    last_stall_check = time.monotonic()
    lock = asyncio.Lock()

    async def partition_state(number: int) -> PartitionWorker:
        nonlocal checkpoints_started
        state = partitions.get(number)
        if state is not None:
            return state
        if not checkpoints_started:
            await checkpoints.start(settings.topic_partitions)
            checkpoints_started = True
        loaded = await checkpoints.load(number)

        def drained(source: str) -> bool:
            return source_drained(number, source)

        if loaded is None:
            state = PartitionWorker.start(number, settings, sources, None, drained)
            _log.info("partition %d: no checkpoint, the detectors start afresh", number)
        else:
            checkpoint, size = loaded
            state = PartitionWorker.start(number, settings, sources, checkpoint, drained)
            for topic, offset in checkpoint.offsets.items():
                positions.expect(TP(topic, number), offset + 1)
            metrics.checkpoints_restored.inc()
            _log.info(
                "partition %d: detector state restored from its checkpoint (%d bytes, offsets %s)",
                number, size, checkpoint.offsets,
            )  # fmt: skip
        partitions[number] = state
        return state

    topic_of = {kind: topic for topic, kind in kinds.items()}
    rekeyed: dict[int, int] = {}  # jobs partition -> last offset whose re-keyed copies were delivered
    rekeyed_committed: dict[int, int] = {}

    def caught_up(topic: str, partition: int, last_offset: int) -> bool:
        highwater = app.consumer.highwater(TP(topic, partition))
        return highwater is None or last_offset + 1 >= highwater

    def source_drained(partition: int, source: str) -> bool:
        """Whether the merge may treat a silent source as idle: nothing of it is left to read."""
        state = partitions.get(partition)
        if state is None:
            return True
        topic = topic_of[source]
        if not caught_up(topic, partition, state.applied.get(topic, -1)):
            return False
        if source == "job":  # its input is the re-keying of the jobs topic, in this worker at least
            jobs = settings.topic_jobs
            # Faust keeps no public read position; its record of the committed offset covers a
            # restart whose jobs were all re-keyed before (nothing is read, nothing is re-keyed).
            committed = getattr(app.consumer, "_committed_offset", {})
            mine = [tp for tp in app.consumer.assignment() if tp.topic == jobs]
            return all(
                caught_up(
                    jobs, tp.partition, max(rekeyed.get(tp.partition, -1), (committed.get(tp) or 0) - 1)
                )
                for tp in mine
            )
        return True

    async def dead_letter(error: InvalidRecord, kind: str, topic: str, batch: int) -> None:
        sink.add(to_dead_letter(error, kind), batch)
        policy.bad(error.source, error.reason)
        metrics.dead_letters.labels(topic, reason_class(error.reason)).inc()
        try:
            policy.check(error.source)
        except DeadLetterLimitExceeded as exc:
            # A bad deploy must not drain the stream into the dead letters: stop, loudly.
            _log.error("stopping the worker: %s", exc)
            await app.crash(exc)
            raise

    async def send_dead_letter(error: InvalidRecord) -> Any:
        return await dead_letter_topic.send(
            key=error.source.encode(),
            value=error.raw,
            headers=[("reason", error.reason.encode()), ("source", error.source.encode()),
                     ("location", error.location.encode())],
        )  # fmt: skip

    async def flush_sink(batch: int, still_ours: Any) -> bool:
        """Flush one sink batch, retrying with backoff; False if the batch stopped being ours."""
        backoff = 0.5
        while True:
            if not still_ours():
                return False
            try:
                sink.flush(batch)
                return True
            except SinkFlushError as exc:
                nonlocal last_flush_failure
                last_flush_failure = time.monotonic()
                metrics.sink_flush_failures.inc()
                _log.warning(
                    "batch %d: ClickHouse flush failed, nothing is committed; retrying in %.1f s: %s",
                    batch, backoff, exc,
                )  # fmt: skip
            if app.should_stop:
                return False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def commit(state: PartitionWorker) -> None:
        def still_ours() -> bool:
            return partitions.get(state.partition) is state

        if not await flush_sink(state.partition, still_ours):
            return
        deliveries = [
            await incidents_topic.send(key=incident.node.encode(), value=orjson.dumps(incident.to_dict()))
            for incident in state.incidents.values()
        ]
        deliveries += [await send_dead_letter(error) for error in state.letters]
        await asyncio.gather(*deliveries)
        metrics.incidents_out.inc(len(state.incidents))
        state.incidents.clear()
        state.letters.clear()
        if not still_ours():
            return  # revoked while waiting: the new owner redoes this from the previous checkpoint
        size = await checkpoints.save(state.checkpoint())
        metrics.checkpoints_written.inc()
        metrics.checkpoint_bytes.labels(str(state.partition)).set(size)
        offsets = {TP(topic, state.partition): offset + 1 for topic, offset in state.applied.items()}
        await app.consumer._commit_offsets(offsets)  # only now: everything before is safe
        state.uncommitted = 0
        state.changed = False
        state.last_commit = time.monotonic()
        metrics.commits.inc()

    def commit_due(state: PartitionWorker) -> bool:
        return (state.uncommitted > 0 or state.changed) and (
            sink.should_flush(state.partition)
            or time.monotonic() - state.last_commit >= settings.worker_flush_seconds
        )

    @app.on_partitions_revoked.connect
    async def forget_revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        # Faust seeks every partition it is (re)assigned to its committed offset, so a partition's
        # in-memory progress past its checkpoint is redone, by whichever worker gets it.
        positions.forget(revoked)
        for tp in revoked:
            if tp.topic == settings.topic_jobs:
                rekeyed.pop(tp.partition, None)
                rekeyed_committed.pop(tp.partition, None)
            if tp.topic in kinds and partitions.pop(tp.partition, None) is not None:
                sink.discard(tp.partition)
                metrics.forget_partition(tp.partition, kinds)

    def crash_on_error(agent: Any) -> Any:
        """Faust logs an agent's exception and carries on without it; a worker must stop instead."""

        async def run(stream: faust.StreamT[bytes]) -> None:
            try:
                await agent(stream)
            except DeadLetterLimitExceeded:
                raise  # already crashed the app, with its own message
            except Exception as exc:
                _log.exception("stopping the worker: %s failed", agent.__name__)
                await app.crash(exc)
                raise

        run.__name__ = agent.__name__
        return run

    @app.agent(jobs)
    @crash_on_error
    async def rekey_jobs(stream: faust.StreamT[bytes]) -> None:
        # One message at a time: Faust's take()/take_events() buffers stalled a rebalance in tests.
        async for event in stream.noack().events():
            message = event.message
            source = f"{message.topic}/{message.partition}"
            metrics.events_in.labels(message.topic).inc()
            if not await next_in_line(message):
                continue
            try:
                job = decode("job", event.value, source, f"offset {message.offset}")
            except InvalidRecord as error:
                await dead_letter(error, "job", message.topic, _REKEY_BATCH)
                await (await send_dead_letter(error))
                async with lock:
                    if not await flush_sink(_REKEY_BATCH, lambda: True):
                        continue
            else:
                policy.good(source)
                at = job.ts_ms / 1000
                copies = [
                    await jobs_by_node.send(key=node.encode(), value=event.value, timestamp=at)
                    for node in sorted(set(job.nodes))
                ]
                await asyncio.gather(*copies)  # delivered before the job message may be committed
            rekeyed[message.partition] = message.offset  # committed by the timer

    async def next_in_line(message: Any) -> bool:
        """Whether a delivered message is its partition's next one (apply it). A repeat is
        skipped; after a gap the partition is read again from its first unapplied offset."""
        delivery = positions.check(message.tp, message.offset)
        if delivery is Delivery.NEXT:
            return True
        if delivery is Delivery.REPEAT:
            metrics.events_skipped.labels(message.topic).inc()
        else:
            await read_again(message.tp, positions.seek_to(message.tp), f"offset {message.offset} came")
        return False

    async def read_again(tp: Any, offset: int | None, why: str) -> None:
        if offset is None:
            return
        metrics.input_rereads.labels(tp.topic).inc()
        _log.warning(
            "%s/%d: %s before offset %d; reading from there again", tp.topic, tp.partition, why, offset
        )
        await app.consumer.seek(tp, offset)

    async def watch_for_stalls() -> None:
        """Read again any input partition that has more to read but has delivered nothing for
        ``_STALL_SECONDS`` (not while ClickHouse flushes fail: the agent is held then)."""
        nonlocal last_stall_check
        now = time.monotonic()
        if now - last_stall_check < _STALL_SECONDS or now - last_flush_failure < _STALL_SECONDS:
            return
        last_stall_check = now
        watched = [
            tp for tp in app.consumer.assignment() if tp.topic in kinds or tp.topic == settings.topic_jobs
        ]
        if not watched:
            return
        ends = await app.consumer.highwaters(*watched)
        committed = getattr(app.consumer, "_committed_offset", {})
        for tp in watched:
            offset = positions.stalled(tp, ends.get(tp), _STALL_SECONDS, start=committed.get(tp))
            if offset is not None:
                await read_again(
                    tp, offset, f"nothing delivered for {_STALL_SECONDS:.0f} s, {ends[tp]} is the end,"
                )

    async def commit_rekeyed() -> None:
        """Commit the jobs messages whose copies were all delivered."""
        offsets = {
            TP(settings.topic_jobs, partition): offset + 1
            for partition, offset in rekeyed.items()
            if rekeyed_committed.get(partition, -1) < offset
        }
        if offsets and await app.consumer._commit_offsets(offsets):
            rekeyed_committed.update({tp.partition: offset - 1 for tp, offset in offsets.items()})

    async def handle(events: list[Any]) -> None:
        """Apply input messages to their partitions' state; commit the partitions that are due."""
        assigned = app.consumer.assignment()
        touched: dict[int, PartitionWorker] = {}
        generation = app.consumer_generation_id
        for event in events:
            message = event.message
            if message.generation_id != generation or message.tp not in assigned:
                # Fetched before a rebalance: whoever owns the partition now reads it again
                # from the committed offset.
                continue
            topic = message.topic
            metrics.events_in.labels(topic).inc()
            state = await partition_state(message.partition)
            if not await next_in_line(message):
                continue
            state.applied[topic] = message.offset
            state.uncommitted += 1
            touched[state.partition] = state
            kind = kinds[topic]
            source = f"{topic}/{message.partition}"
            try:
                record = decode(kind, event.value, source, f"offset {message.offset}")
            except InvalidRecord as error:
                await dead_letter(error, kind, topic, state.partition)
                state.letters.append(error)
                continue
            policy.good(source)
            state.merger.add(kind, record.ts_ms, record)
        for state in touched.values():
            metrics.late_events.inc(state.process_released(sink, settings.allowed_lateness_seconds))
            if commit_due(state):
                await commit(state)

    @app.agent(inputs)
    @crash_on_error
    async def detect(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.noack().events():
            async with lock:
                await handle([event])
        # The stream ended (shutdown): uncommitted work is redone from the checkpoint on restart.

    @app.timer(interval=max(settings.worker_flush_seconds / 2, 0.2))
    async def release_idle() -> None:
        # Faust takes a partition off the fetcher while the agent's queue is under pressure and
        # should put it back once the queue drains; that callback is sometimes lost (a worker
        # stalled with its ECC partitions off the fetcher and an empty queue). Put them back:
        # if the queue is still full, Faust takes them off again at the next message.
        for tp in app.consumer.assignment():
            app.consumer.on_buffer_drop(tp)
        async with lock:
            await commit_rekeyed()
            await watch_for_stalls()
            for state in list(partitions.values()):
                metrics.late_events.inc(state.process_released(sink, settings.allowed_lateness_seconds))
                if commit_due(state):
                    await commit(state)
            for number, state in partitions.items():
                metrics.uncommitted.labels(str(number)).set(state.uncommitted + int(state.changed))
                metrics.held_back.labels(str(number)).set(len(state.merger))
                for topic in kinds:
                    highwater = app.consumer.highwater(TP(topic, number))
                    if highwater is not None:
                        lag = highwater - state.applied.get(topic, -1) - 1
                        metrics.consumer_lag.labels(topic, str(number)).set(max(lag, 0))

    @app.task
    async def serve_metrics() -> None:
        # Faust runs at -l warn (its INFO is chatty); the worker's own progress is worth INFO, on a
        # handler of its own, added once Faust has set up its logging.
        handler = logging.StreamHandler(sys.__stderr__)  # mode wraps sys.stderr into its own logger
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
        ours = logging.getLogger("faultstream")
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
        if settings.metrics_port:
            metrics.serve(settings.metrics_host, settings.metrics_port)
            _log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)

    @app.on_before_shutdown.connect
    async def stop_checkpoints(_app: Any, **_: Any) -> None:
        if checkpoints_started:
            await checkpoints.stop()

    return app


def run_worker(settings: Settings) -> None:
    """Run a worker until it is stopped (``faultstream worker``)."""
    app = build_app(settings)
    # Faust's command line reads sys.argv, and would otherwise start a web server on 0.0.0.0:6066,
    # which two workers on one host cannot share.
    sys.argv = ["faultstream-worker", "worker", "-l", "warn", "--without-web"]
    app.main()
