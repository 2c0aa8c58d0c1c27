"""The worker's state and logic, apart from Faust's wiring (:mod:`stream.worker.app`).

:class:`WorkerRuntime` holds one :class:`PartitionWorker` per assigned input partition and does
what the agents and the timer ask of it: apply a message (:meth:`WorkerRuntime.apply`), re-key a
job (:meth:`WorkerRuntime.rekey`), reach a commit point (:meth:`WorkerRuntime.commit`), release
what the event-time merge holds once its sources are idle (:meth:`WorkerRuntime.tick`) and forget
revoked partitions. Every call that touches partition state runs under :attr:`WorkerRuntime.lock`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from faust.types import TP

from detectors.core import DetectionCore
from schemas.outputs import Incident
from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.replay import late_dead_letter
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError
from stream.sinks.dead_letters import DeadLetterLimitExceeded, DeadLetterPolicy, reason_class, to_dead_letter
from stream.worker.checkpoints import CheckpointTopic, PartitionCheckpoint
from stream.worker.merge import EventTimeMerger
from stream.worker.metrics import WorkerMetrics
from stream.worker.positions import Delivery, InputPositions

__all__ = ["PartitionWorker", "WorkerRuntime", "WorkerStalled", "WorkerTopics", "decode"]

_log = logging.getLogger("faultstream.worker")

#: Sink batch of the dead letters found while re-keying jobs (input partitions are >= 0).
_REKEY_BATCH = -1
_MAX_BACKOFF_S = 30.0
#: A partition with more to read that delivered nothing for this long is read again.
STALL_SECONDS = 15.0

Record = XidEvent | EccSample | JobEvent


class WorkerStalled(RuntimeError):
    """An input partition delivers nothing although it has messages to read, even after it was
    read again: the worker stops so that its supervisor restarts it (from the last commit point)."""


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


@dataclass(frozen=True)
class WorkerTopics:
    """The Faust topics the runtime sends to, and the kind of record each input topic carries."""

    kinds: dict[str, str]  #: input topic -> ``xid`` | ``ecc`` | ``job`` (jobs-by-node)
    jobs: str  #: the jobs topic, re-keyed into jobs-by-node
    jobs_by_node: Any
    incidents: Any
    dead_letters: Any


class WorkerRuntime:
    """Partition states, positions, sink, checkpoints and metrics of one worker."""

    def __init__(
        self,
        app: Any,
        settings: Settings,
        topics: WorkerTopics,
        sink: ClickHouseSink,
        metrics: WorkerMetrics,
    ) -> None:
        self.app = app
        self.settings = settings
        self.topics = topics
        self.sink = sink
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.checkpoints = CheckpointTopic(
            settings.kafka_bootstrap, settings.topic_checkpoints, settings.worker_app_id
        )
        self.checkpoints_started = False
        self.policy = DeadLetterPolicy(
            settings.dead_letter_max_ratio,
            settings.dead_letter_min_records,
            hint="Is the producer writing the JSON Schemas of schemas/jsonschema/?",
        )
        self.partitions: dict[int, PartitionWorker] = {}
        self.positions: InputPositions[Any] = InputPositions(time.monotonic)
        self._sources = sorted(topics.kinds.values())
        self._topic_of = {kind: topic for topic, kind in topics.kinds.items()}
        self._rekeyed: dict[int, int] = {}  # jobs partition -> last offset whose copies were delivered
        self._rekeyed_committed: dict[int, int] = {}
        self._last_flush_failure = 0.0  # the agent waits while a flush is retried: no deliveries then
        self._last_stall_check = time.monotonic()
        self._stalls: dict[Any, int] = {}  # partition -> stall checks in a row without a delivery

    # -- input ------------------------------------------------------------------------------

    async def apply(self, event: Any) -> None:
        """Apply one input message to its partition's state; commit the partition if it is due."""
        message = event.message
        if self._stale(message):
            return
        topic = message.topic
        self.metrics.events_in.labels(topic).inc()
        state = await self._partition_state(message.partition)
        if not await self._next_in_line(message):
            return
        state.applied[topic] = message.offset
        state.uncommitted += 1
        kind = self.topics.kinds[topic]
        source = f"{topic}/{message.partition}"
        try:
            record = decode(kind, event.value, source, f"offset {message.offset}")
        except InvalidRecord as error:
            await self._dead_letter(error, kind, topic, state.partition)
            state.letters.append(error)
        else:
            self.policy.good(source)
            state.merger.add(kind, record.ts_ms, record)
        await self._release(state)

    async def rekey(self, event: Any) -> None:
        """Send a job state change to the jobs-by-node topic once per node of the job."""
        message = event.message
        if self._stale(message):
            return
        source = f"{message.topic}/{message.partition}"
        self.metrics.events_in.labels(message.topic).inc()
        if not await self._next_in_line(message):
            return
        try:
            job = decode("job", event.value, source, f"offset {message.offset}")
        except InvalidRecord as error:
            await self._dead_letter(error, "job", message.topic, _REKEY_BATCH)
            await (await self._send_dead_letter(error))
            async with self.lock:
                if not await self._flush_sink(_REKEY_BATCH, lambda: True):
                    return
        else:
            self.policy.good(source)
            at = job.ts_ms / 1000
            copies = [
                await self.topics.jobs_by_node.send(key=node.encode(), value=event.value, timestamp=at)
                for node in sorted(set(job.nodes))
            ]
            await asyncio.gather(*copies)  # delivered before the job message may be committed
        self._rekeyed[message.partition] = message.offset  # committed by tick()

    def _stale(self, message: Any) -> bool:
        """Fetched before a rebalance: whoever owns the partition now reads it again from the
        committed offset."""
        return bool(
            message.generation_id != self.app.consumer_generation_id
            or message.tp not in self.app.consumer.assignment()
        )

    async def _next_in_line(self, message: Any) -> bool:
        """Whether a delivered message is its partition's next one (apply it). A repeat is
        skipped; after a gap the partition is read again from its first unapplied offset."""
        delivery = self.positions.check(message.tp, message.offset)
        if delivery is Delivery.NEXT:
            if self._stalls:
                self._stalls.pop(message.tp, None)
            return True
        if delivery is Delivery.REPEAT:
            self.metrics.events_skipped.labels(message.topic).inc()
        else:
            where = self.positions.seek_to(message.tp)
            await self._read_again(message.tp, where, f"offset {message.offset} came")
        return False

    async def _read_again(self, tp: Any, offset: int | None, why: str) -> None:
        if offset is None:
            return
        if self.app.rebalancing or tp not in self.app.consumer.assignment():
            return  # no longer ours, or about to change hands: the next owner reads it from the commit
        try:
            await self._seek_from(tp, offset, why)
        except (AssertionError, KafkaError) as exc:  # revoked in the meantime (aiokafka asserts it)
            _log.info("%s/%d: not read again, it changed hands: %r", tp.topic, tp.partition, exc)

    async def _seek_from(self, tp: Any, offset: int, why: str) -> None:
        beginning = (await self.app.consumer.earliest_offsets(tp)).get(tp)
        if beginning is not None and offset < beginning:
            # Gone for good: say so loudly, count it, and go on from what is left.
            self.metrics.input_lost.labels(tp.topic).inc(beginning - offset)
            _log.error(
                "%s/%d: offsets %d to %d were deleted by the broker before this worker read them "
                "(retention: FAULTSTREAM_TOPIC_RETENTION_BYTES); going on from offset %d",
                tp.topic, tp.partition, offset, beginning - 1, beginning,
            )  # fmt: skip
            self.positions.expect(tp, beginning)
            self._stalls.pop(tp, None)
            offset = beginning
        self.metrics.input_rereads.labels(tp.topic).inc()
        _log.warning(
            "%s/%d: %s before offset %d; reading from there again", tp.topic, tp.partition, why, offset
        )
        await self.app.consumer.seek(tp, offset)

    async def _partition_state(self, number: int) -> PartitionWorker:
        state = self.partitions.get(number)
        if state is not None:
            return state
        if not self.checkpoints_started:
            await self.checkpoints.start(self.settings.topic_partitions)
            self.checkpoints_started = True
        loaded = await self.checkpoints.load(number)

        def drained(source: str) -> bool:
            return self._source_drained(number, source)

        if loaded is None:
            state = PartitionWorker.start(number, self.settings, self._sources, None, drained)
            _log.info("partition %d: no checkpoint, the detectors start afresh", number)
        else:
            checkpoint, size = loaded
            state = PartitionWorker.start(number, self.settings, self._sources, checkpoint, drained)
            for topic, offset in checkpoint.offsets.items():
                self.positions.expect(TP(topic, number), offset + 1)
            self.metrics.checkpoints_restored.inc()
            _log.info(
                "partition %d: detector state restored from its checkpoint (%d bytes, offsets %s)",
                number, size, checkpoint.offsets,
            )  # fmt: skip
        self.partitions[number] = state
        return state

    def _caught_up(self, topic: str, partition: int, last_offset: int) -> bool:
        highwater = self.app.consumer.highwater(TP(topic, partition))
        return highwater is None or last_offset + 1 >= highwater

    def _source_drained(self, partition: int, source: str) -> bool:
        """Whether the merge may treat a silent source as idle: nothing of it is left to read."""
        state = self.partitions.get(partition)
        if state is None:
            return True
        topic = self._topic_of[source]
        if not self._caught_up(topic, partition, state.applied.get(topic, -1)):
            return False
        if source == "job":  # its input is the re-keying of the jobs topic, in this worker at least
            jobs = self.topics.jobs
            # Faust keeps no public read position; its record of the committed offset covers a
            # restart whose jobs were all re-keyed before (nothing is read, nothing is re-keyed).
            committed = getattr(self.app.consumer, "_committed_offset", {})
            mine = [tp for tp in self.app.consumer.assignment() if tp.topic == jobs]
            return all(
                self._caught_up(
                    jobs,
                    tp.partition,
                    max(self._rekeyed.get(tp.partition, -1), (committed.get(tp) or 0) - 1),
                )
                for tp in mine
            )
        return True

    # -- dead letters -----------------------------------------------------------------------

    async def _dead_letter(self, error: InvalidRecord, kind: str, topic: str, batch: int) -> None:
        self.sink.add(to_dead_letter(error, kind), batch)
        self.policy.bad(error.source, error.reason)
        self.metrics.dead_letters.labels(topic, reason_class(error.reason)).inc()
        try:
            self.policy.check(error.source)
        except DeadLetterLimitExceeded as exc:
            # A bad deploy must not drain the stream into the dead letters: stop, loudly.
            _log.error("stopping the worker: %s", exc)
            await self.app.crash(exc)
            raise

    async def _send_dead_letter(self, error: InvalidRecord) -> Any:
        return await self.topics.dead_letters.send(
            key=error.source.encode(),
            value=error.raw,
            headers=[("reason", error.reason.encode()), ("source", error.source.encode()),
                     ("location", error.location.encode())],
        )  # fmt: skip

    # -- commit points ----------------------------------------------------------------------

    async def _release(self, state: PartitionWorker) -> None:
        lateness = self.settings.allowed_lateness_seconds
        self.metrics.late_events.inc(state.process_released(self.sink, lateness))
        if self._commit_due(state):
            await self.commit(state)

    def _commit_due(self, state: PartitionWorker) -> bool:
        return (state.uncommitted > 0 or state.changed) and (
            self.sink.should_flush(state.partition)
            or time.monotonic() - state.last_commit >= self.settings.worker_flush_seconds
        )

    async def _flush_sink(self, batch: int, still_ours: Callable[[], bool]) -> bool:
        """Flush one sink batch, retrying with backoff; False if the batch stopped being ours."""
        backoff = 0.5
        while True:
            if not still_ours():
                return False
            try:
                self.sink.flush(batch)
                return True
            except SinkFlushError as exc:
                self._last_flush_failure = time.monotonic()
                self.metrics.sink_flush_failures.inc()
                _log.warning(
                    "batch %d: ClickHouse flush failed, nothing is committed; retrying in %.1f s: %s",
                    batch, backoff, exc,
                )  # fmt: skip
            if self.app.should_stop:
                return False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def commit(self, state: PartitionWorker) -> None:
        """The partition's commit point: flush, send, checkpoint, then commit its input offsets."""

        def still_ours() -> bool:
            return self.partitions.get(state.partition) is state

        if not await self._flush_sink(state.partition, still_ours):
            return
        deliveries = [
            await self.topics.incidents.send(
                key=incident.node.encode(), value=orjson.dumps(incident.to_dict())
            )
            for incident in state.incidents.values()
        ]
        deliveries += [await self._send_dead_letter(error) for error in state.letters]
        await asyncio.gather(*deliveries)
        self.metrics.incidents_out.inc(len(state.incidents))
        state.incidents.clear()
        state.letters.clear()
        if not still_ours():
            return  # revoked while waiting: the new owner redoes this from the previous checkpoint
        size = await self.checkpoints.save(state.checkpoint())
        self.metrics.checkpoints_written.inc()
        self.metrics.checkpoint_bytes.labels(str(state.partition)).set(size)
        offsets = {TP(topic, state.partition): offset + 1 for topic, offset in state.applied.items()}
        await self.app.consumer._commit_offsets(offsets)  # only now: everything before is safe
        state.uncommitted = 0
        state.changed = False
        state.last_commit = time.monotonic()
        self.metrics.commits.inc()

    async def _commit_rekeyed(self) -> None:
        """Commit the jobs messages whose copies were all delivered."""
        offsets = {
            TP(self.topics.jobs, partition): offset + 1
            for partition, offset in self._rekeyed.items()
            if self._rekeyed_committed.get(partition, -1) < offset
        }
        if offsets and await self.app.consumer._commit_offsets(offsets):
            self._rekeyed_committed.update({tp.partition: offset - 1 for tp, offset in offsets.items()})

    # -- the timer --------------------------------------------------------------------------

    async def tick(self) -> None:
        """Commit re-keyed jobs, read stalled partitions again, release what idle sources hold
        back, reach due commit points and refresh the gauges."""
        await self._commit_rekeyed()
        await self._watch_for_stalls()
        for state in list(self.partitions.values()):
            await self._release(state)
        consumer = self.app.consumer
        for number, state in self.partitions.items():
            self.metrics.uncommitted.labels(str(number)).set(state.uncommitted + int(state.changed))
            self.metrics.held_back.labels(str(number)).set(len(state.merger))
            for topic in self.topics.kinds:
                highwater = consumer.highwater(TP(topic, number))
                if highwater is not None:
                    lag = highwater - state.applied.get(topic, -1) - 1
                    self.metrics.consumer_lag.labels(topic, str(number)).set(max(lag, 0))

    async def _watch_for_stalls(self) -> None:
        """Read again any input partition that has more to read but has delivered nothing for
        ``STALL_SECONDS`` (not while ClickHouse flushes fail: the agent is held then)."""
        now = time.monotonic()
        if now - self._last_stall_check < STALL_SECONDS or now - self._last_flush_failure < STALL_SECONDS:
            return
        self._last_stall_check = now
        watched = [
            tp
            for tp in self.app.consumer.assignment()
            if tp.topic in self.topics.kinds or tp.topic == self.topics.jobs
        ]
        if not watched or self.app.rebalancing:
            return
        try:
            ends = await self.app.consumer.highwaters(*watched)
        except (AssertionError, KafkaError) as exc:  # the assignment changed under the request
            _log.info("stall check skipped: %r", exc)
            return
        committed = getattr(self.app.consumer, "_committed_offset", {})
        for tp in watched:
            # Nothing applied yet: reading starts at the committed offset, else at the beginning
            # (auto_offset_reset=earliest; an offset before the log start resets to it).
            start = committed.get(tp) or 0
            offset = self.positions.stalled(tp, ends.get(tp), STALL_SECONDS, start=start)
            if offset is not None:
                state = self._fetch_state(tp)
                self._stalls[tp] = self._stalls.get(tp, 0) + 1
                if self._stalls[tp] > 1:
                    raise WorkerStalled(
                        f"input partition {tp.topic}/{tp.partition} stalled: nothing delivered from offset "
                        f"{offset} (end {ends[tp]}) for {STALL_SECONDS * self._stalls[tp]:.0f} s, even after "
                        f"reading it again ({state})"
                    )
                self._refetch(tp)
                why = f"nothing delivered for {STALL_SECONDS:.0f} s, {ends[tp]} is the end ({state}),"
                await self._read_again(tp, offset, why)

    def _refetch(self, tp: Any) -> None:
        """Put a stalled partition back on Faust's fetch list. Faust drops it while the agent's
        queue is under pressure and relies on a callback to put it back when the queue drains;
        a lost callback was suspected before the stalls were traced to the broker's retention
        (every stall seen showed the partition active), so this is a cheap safety net only."""
        consumer = self.app.consumer
        if self.app.rebalancing or tp in consumer._paused_partitions:
            return  # paused on purpose (a rebalance or recovery): Faust resumes it
        consumer._buffered_partitions.discard(tp)
        active = consumer._active_partitions
        if active is not None:
            active.add(tp)

    def _fetch_state(self, tp: Any) -> str:
        """Where Faust's and aiokafka's fetchers stand on a partition, for the stall warning."""
        consumer = self.app.consumer
        try:
            faust_state = (
                f"faust: active={tp in (consumer._active_partitions or ())} "
                f"buffered={tp in consumer._buffered_partitions} paused={tp in consumer._paused_partitions} "
                f"flow={consumer.flow_active} read_offset={consumer._read_offset.get(tp)}"
            )
            kafka = consumer._thread._consumer
            assignment = kafka._subscription.subscription.assignment
            ktp = next(t for t in assignment.tps if t.topic == tp.topic and t.partition == tp.partition)
            state = assignment.state_value(ktp)
            cached = kafka._fetcher._records.get(ktp)
            return (
                f"{faust_state}; aiokafka: position={state._position} paused={state.paused} "
                f"cached={type(cached).__name__ if cached is not None else None}; "
                f"fetcher awaits: {_fetcher_awaits(getattr(consumer._thread, 'thread_loop', None))}"
            )
        except Exception as exc:  # private attributes of two libraries: best effort only
            return f"fetch state unavailable: {exc!r}"

    # -- rebalances and shutdown ------------------------------------------------------------

    def forget(self, revoked: set[Any]) -> None:
        """Drop the state of revoked partitions: Faust seeks every partition it is (re)assigned to
        its committed offset, so progress past the checkpoint is redone by whoever gets it."""
        self.positions.forget(revoked)
        for tp in revoked:
            if tp.topic == self.topics.jobs:
                self._rekeyed.pop(tp.partition, None)
                self._rekeyed_committed.pop(tp.partition, None)
            if tp.topic in self.topics.kinds and self.partitions.pop(tp.partition, None) is not None:
                self.sink.discard(tp.partition)
                self.metrics.forget_partition(tp.partition, self.topics.kinds)

    async def stop(self) -> None:
        if self.checkpoints_started:
            await self.checkpoints.stop()


def _await_chain(coro: Any) -> str:
    """A suspended coroutine's chain of awaits, innermost last."""
    chain: list[str] = []
    awaited: Any = coro
    frame: Any = None
    while awaited is not None and len(chain) < 25:
        if type(awaited).__name__ == "async_generator_asend" and frame is not None:
            # The awaited generator is only reachable from the awaiting frame's locals.
            awaited = next((v for v in frame.f_locals.values() if inspect.isasyncgen(v)), None)
            continue
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        else:
            chain.append(repr(awaited)[:160])
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return " > ".join(chain)


def _fetcher_awaits(thread_loop: Any = None) -> str:
    """Where Faust's fetcher task is suspended, and the consumer thread's fetch call."""
    found = [
        _await_chain(task.get_coro())
        for task in asyncio.all_tasks()
        if "Fetcher._fetcher" in task.get_name() + repr(task.get_coro())
    ]
    if thread_loop is not None:
        found += [
            "thread: " + chain
            for task in asyncio.all_tasks(thread_loop)
            if "fetch" in (chain := _await_chain(task.get_coro()))
        ]
    return " | ".join(found) or "no fetcher task"
