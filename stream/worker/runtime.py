"""The worker's state and logic, apart from Faust's wiring (:mod:`stream.worker.app`).

:class:`WorkerRuntime` holds one :class:`~stream.worker.partition.PartitionWorker` per assigned
input partition and does what the agents and the timer ask of it: apply a message
(:meth:`WorkerRuntime.apply`), re-key a job (:meth:`WorkerRuntime.rekey`), reach a commit point
(:mod:`stream.worker.commit`), release what the event-time merge holds once its sources are idle
(:meth:`WorkerRuntime.tick`), read a partition again after a gap or a stall, and forget revoked
partitions. Every call that touches partition state runs under :attr:`WorkerRuntime.lock`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError
from faust.types import TP

from detectors.core import Emitted
from detectors.fleet import FleetCore
from schemas.outputs import DeadLetter
from schemas.records import InvalidRecord
from stream.kafka.codec import decode_message_lines, message_lines, partition_for_key
from stream.kafka.fleet import (
    check_deployment,
    decode_fleet_message,
    decode_references,
    encode_baselines,
    encode_fleet_messages,
)
from stream.kafka.security import client_options
from stream.pipeline import store_dead_letter
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink
from stream.sinks.dead_letters import (
    DeadLetterLimitExceeded,
    DeadLetterPolicy,
    KafkaDeadLetters,
    reason_class,
    to_dead_letter,
)
from stream.sinks.inventory import read_inventory
from stream.worker.broker import BrokerQueries, PartitionReader
from stream.worker.checkpoints import CheckpointTopic, StaleCheckpoint
from stream.worker.commit import CommitPoint
from stream.worker.diagnostics import committed_offsets, fetch_state, refetch
from stream.worker.fetching import HeldBack
from stream.worker.fleet_wait import FleetWaitWatch
from stream.worker.joining import batched_parts, joined_from, skip_applied_lines, skip_applied_parts
from stream.worker.merge import PUBLISH_SKEW_SECONDS
from stream.worker.metrics import InputCounters, WorkerMetrics
from stream.worker.partition import HeldLine, PartitionWorker, adopt_configuration
from stream.worker.positions import Delivery, InputPositions
from stream.worker.rekeyed import RekeyedInput
from stream.worker.rekeying import copy_deployment, copy_headers

__all__ = ["WorkerRuntime", "WorkerStalled", "WorkerTopics"]

_log = logging.getLogger("faultstream.worker")

#: Sink and dead-letter batch of what is found while re-keying jobs (input partitions are >= 0).
_REKEY_BATCH = -1
#: Input progress (end offsets, the group's jobs progress: two requests) is asked at most this often:
#: a live record behind an idle source waits for the next answer (0.5 s made that a third of the
#: event-to-incident latency).
_REFRESH_SECONDS = 0.1
#: A partition this close to its end is live: incident updates go out without waiting for the
#: commit point (a third of a second of a producer at 5,000 records/s). Counted in records (the
#: messages behind times the records of the last one): 64 messages of 256 records each are over a
#: second of work, and publishing every 0.1 s through it cost a ClickHouse flush each time.
_LIVE_BACKLOG_RECORDS = 1600
#: A partition this far behind is catching up (a restart, a replay of history): the commit point
#: comes as soon as it reaches its end, not up to a flush interval later. Half a second of a
#: worker's work and more, where a live stream's passing lag is far less: at 20,000 records/s a
#: backlog of 1,600 records (80 ms of input) came and went several times a second, and each end of
#: one was a commit point (a checkpoint of the whole core): 1.8 a second instead of one every
#: flush interval, slowing the worker into the next backlog.
_CATCH_UP_RECORDS = 20_000
#: The least a partition's merge holds of an input partition before it is held back, however many
#: partitions share the worker's ``worker_merge_hold_records``: a few messages of 256 records.
_LEAST_HELD = 2_048
#: Incident updates go out early at most every this many times the last early flush took.
_PUBLISH_COST_FACTOR = 4.0
#: A partition's backlog may be judged from a highwater read this long ago: the commit point at
#: the end of a backlog comes at most this much later (the broker's highwater of a backlog being
#: replayed is its end, which does not move).
_HIGHWATER_SECONDS = 0.01
#: How long the fleet stage's round run from a commit point waits for the hand-over just sent to be
#: read back (acked already: a fetch's round trip, milliseconds).
_HAND_OVER_READ_SECONDS = 0.5
#: How long a stop waits for the checkpoint topic's connection still under way.
_STOP_CONNECT_SECONDS = 5.0
#: A partition with more to read that delivered nothing for this long is read again.
STALL_SECONDS = 15.0


class WorkerStalled(RuntimeError):
    """An input partition delivers nothing although it has messages to read, even after it was
    read again: the worker stops so that its supervisor restarts it (from the last commit point)."""


@dataclass(frozen=True)
class WorkerTopics:
    """The Faust topics the runtime sends to, and the kind of record each input topic carries."""

    #: input topic -> ``xid`` | ``ecc`` | ``job`` (jobs-by-node) | ``kernel`` (kernel-log-by-node)
    kinds: dict[str, str]
    #: The inputs re-keyed into a by-node topic (jobs, kernel log).
    rekeyed: tuple[RekeyedInput, ...]
    incidents: Any
    dead_letters: Any
    fleet: Any = None  #: the fleet stage's input (one partition)
    fleet_baselines: Any = None  #: its storm baselines, read by every worker


class WorkerRuntime:
    """Partition states, positions, sink, checkpoints and metrics of one worker."""

    def __init__(
        self,
        app: Any,
        settings: Settings,
        topics: WorkerTopics,
        sink: ClickHouseSink,
        metrics: WorkerMetrics,
        held_back: HeldBack | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        #: Input partitions not read for now: their partition's merge holds as many of their
        #: records as it may (``worker_merge_hold_records``); the consumer's polls leave them out.
        self.held_back = held_back if held_back is not None else HeldBack()
        #: The detector configuration every partition runs under (a restored checkpoint's is
        #: brought to it: :func:`stream.worker.partition.adopt_configuration`).
        self.core_config = settings.core_config()
        self.xid_overrides = settings.xid_overrides()
        #: The fleet's inventory (its nodes' names), for the fleet stage's lemon statistics.
        self.inventory = (
            tuple(node.node for node in read_inventory(Path(settings.inventory_file)))
            if settings.inventory_file
            else ()
        )
        self.topics = topics
        self.sink = sink
        self.metrics = metrics
        self.lock = asyncio.Lock()
        #: Set when a round of the timer is wanted before its interval is up (the fleet stage has
        #: facts a held record waits for).
        self.tick_wanted = asyncio.Event()
        self.checkpoints = CheckpointTopic(
            client_options(settings), settings.topic_checkpoints, settings.worker_app_id
        )
        #: Whether the checkpoint topic's clients are connected (:meth:`connect_checkpoints`).
        self.checkpoints_started = False
        self._checkpoints_connecting: asyncio.Future[None] | None = None
        self.policy = DeadLetterPolicy.from_settings(
            settings, hint="Is the producer writing the JSON Schemas of schemas/jsonschema/?"
        )

        async def send_dead_letter(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
            return await topics.dead_letters.send(key=key, value=value, headers=headers)

        self.dead_letters = KafkaDeadLetters(send_dead_letter)
        self.commit_point = CommitPoint(
            app, sink, self.dead_letters, topics.incidents, self.checkpoints, metrics, topics.fleet
        )
        self.partitions: dict[int, PartitionWorker] = {}
        self.positions: InputPositions[Any] = InputPositions(time.monotonic)
        self._sources = sorted(topics.kinds.values())
        self._topic_of = {kind: topic for topic, kind in topics.kinds.items()}
        #: The inputs copied to a by-node topic (jobs, the kernel log), by source topic and by kind.
        self.rekeyed = {rekeyed.topic: rekeyed for rekeyed in topics.rekeyed}
        self._rekeyed_by_kind = {rekeyed.kind: rekeyed for rekeyed in topics.rekeyed}
        #: End offsets of the input partitions, refreshed by the timer (Faust's highwater is only
        #: known once a fetch returned).
        self._ends: dict[Any, int] = {}
        #: Whether the inputs' progress has not been asked since the last assignment.
        self.progress_unknown = True
        #: Revocations so far: a checkpoint read that spans one is checked again.
        self._revocations = 0
        #: Monotonic time of the progress answer ``_ends`` and ``all_rekeyed`` come from (when the
        #: broker was asked): a source found drained was drained as of then, not as of now.
        self._progress_at = 0.0
        self.broker = BrokerQueries(client_options(settings))
        #: The fleet stage's storm baselines (period start -> usual burst), as read so far.
        self.baselines: dict[int, float] = {}
        self._baseline_reader = PartitionReader(client_options(settings), settings.topic_fleet_baselines)
        self._baselines_read = 0
        self._new_baselines: dict[int, float] = {}
        #: Its ECC references (period start -> usual correctable errors per GPU-day), all of them: a
        #: partition taken over may resume far behind the newest (24 floats a day of event time).
        self.ecc_references: dict[int, float] = {}
        self._new_ecc_references: dict[int, float] = {}
        self._fleet_reader = PartitionReader(client_options(settings), settings.topic_fleet)
        #: Records waiting for the stage: reported, and let go if the wait cannot end.
        self.fleet_waits = FleetWaitWatch(settings.worker_fleet_wait_seconds)
        self._idle_announced: set[int] = set()  # assigned partitions without state, said idle
        #: Whether the group has assigned this worker its partitions since its last revocation.
        self.assigned = False
        self._assigned_at = time.monotonic()  # when the group last assigned partitions here
        self._probed: set[int] = set()  # assigned partitions without state whose checkpoint was read
        self._empty_since: dict[int, float] = {}  # those, since when they have had nothing to read
        self._last_refresh = 0.0
        self._last_stall_check = time.monotonic()
        self._stalls: dict[Any, int] = {}  # partition -> stall checks in a row without a delivery
        self._stall_ends: dict[Any, int] = {}  # end offsets fetched for the next stall check
        #: Messages fetched for the detect agent and not yet delivered to it (set by the agent).
        self.input_backlog: Callable[[], int] = lambda: 0
        #: The consumer's assignment as of the generation it was read in (None: read it again).
        #: Asked of the consumer thread for every message it took ~2 % of the main thread's busy
        #: samples (py-spy, one record a message); it changes only in a rebalance.
        self._assignment: tuple[int, frozenset[Any]] | None = None
        #: Faust's highwater of each input partition, and when it was read: asked once per
        #: message per topic it took ~3 % (see :meth:`_highwater`).
        self._highwaters: dict[Any, tuple[int | None, float]] = {}

    # -- input ------------------------------------------------------------------------------

    async def apply(self, event: Any) -> None:
        """Apply one input message (one or more records; joined or batched: several of the
        broker's, :mod:`stream.worker.joining`) to its partition's state; commit the partition if
        it is due. Per-message work is done once; per record, only decoding and the merge; a
        batch's messages are each decoded, merged and released in turn (their records stay in
        the caches from decoding to the core)."""
        message = event.message
        if self._stale(message):
            return
        topic = message.topic
        counted = self.metrics.input(topic)
        parts = batched_parts(message)
        if parts is None:
            value, first, messages = self._unapplied(message, event.value)
            first_offset = first
        else:
            parts = self._unapplied_parts(message, parts)
            value, first, messages = None, None, len(parts)
            first_offset = parts[0][0]
        counted.messages.inc(messages)
        state = await self._partition_state(message.partition)
        if not self._current(state) or self._stale(message):
            # Revoked while its checkpoint was read (not taken up, or the message is of the old
            # generation): positioning its topic now would outlive the revocation that forgot the
            # positions, and skip what the next generation reads again before the message.
            return
        if not await self._next_in_line(message, first_offset):
            return
        state.applied[topic] = message.offset
        state.uncommitted += 1
        kind = self.topics.kinds[topic]
        if kind in self._rekeyed_by_kind:
            check_deployment(
                copy_deployment(message.headers),
                self.settings.worker_app_id,
                lambda: f"{topic}/{message.partition} offset {message.offset}",
            )
            fresh = state.copies.fresh_from(message.headers)
            if fresh is None:
                # A re-keyer's successor sent this copy again: applied already, not a late event.
                self.metrics.rekey_repeats.inc(value.count(b"\n") + 1)
                await self._release(state)
                return
            if fresh:
                # Its first lines only (a successor joined the messages otherwise): blanked, so
                # that the others keep their line numbers.
                self.metrics.rekey_repeats.inc(fresh)
                value = b"\n" * fresh + value.split(b"\n", fresh)[fresh]
        source = f"{topic}/{message.partition}"
        if parts is None:
            good = await self._add_lines(state, kind, topic, source, value, message.offset, first, counted)
        else:
            good = 0
            for offset, part in parts:
                good += await self._add_lines(state, kind, topic, source, part, offset, None, counted)
                self.metrics.late_events.inc(state.process_released())
        if good:
            state.note_message_size(topic, good / messages)
        await self._release(state)

    async def _add_lines(
        self,
        state: PartitionWorker,
        kind: str,
        topic: str,
        source: str,
        value: bytes | None,
        offset: int,
        first: int | None,
        counted: InputCounters,
    ) -> int:
        """Decode one message's lines into the partition's merge (bad lines: dead letters, good
        ones counted, for the dead-letter ratio too, before the next message's); return how many
        records it held."""
        items = decode_message_lines(kind, value, source, offset, first)
        decoded: list[tuple[int, HeldLine]] = [
            (item.ts_ms, (item, line)) for item, line in items if not isinstance(item, InvalidRecord)
        ]
        if len(decoded) < len(items):
            for item, _line in items:
                if isinstance(item, InvalidRecord):
                    await self._dead_letter(item, kind, topic, state.pipeline.reject)
        state.merger.add_many(kind, decoded)
        good = len(decoded)
        if good:
            self.policy.good(source, good)
            counted.records.inc(good)
        return good

    async def rekey(self, event: Any, rekeyed: RekeyedInput) -> None:
        """Copy the records of a message of a re-keyed input (:mod:`stream.worker.rekeyed`) to its
        by-node topic: once to each partition that holds one of a record's nodes (one message per
        partition, the copies in order), so every node's detection core sees them in the input's
        order."""
        message = event.message
        if self._stale(message):
            return
        revocations = self._revocations
        source = f"{message.topic}/{message.partition}"
        counted = self.metrics.input(message.topic)
        parts = batched_parts(message)
        records: list[tuple[int, str, bytes]]  # (offset, location, value) of each source record
        if parts is not None:
            parts = self._unapplied_parts(message, parts)
            first: int | None = parts[0][0]
            messages = len(parts)
            records = [(offset, f"offset {offset}", part) for offset, part in parts]
        else:
            value, first, messages = self._unapplied(message, event.value)
            if rekeyed.whole_values and first is None:
                records = [(message.offset, f"offset {message.offset}", value or b"")]
            else:
                records = [  # a joined line at its own offset
                    (message.offset if first is None else first + number, location, line)
                    for number, (location, line) in enumerate(message_lines(value, message.offset, first))
                ]
        counted.messages.inc(messages)
        if not await self._next_in_line(message, first):
            return
        partitions = self.app.consumer.topic_partitions(rekeyed.target_name) or self.settings.topic_partitions
        copies: dict[int, list[tuple[bytes, int, bytes, int]]] = {}  # partition -> (key, ts, line, offset)
        record_ms = None if message.timestamp is None else round(message.timestamp * 1000)
        bad = False
        good = skipped = 0
        for offset, location, line in records:
            made, errors = rekeyed.make_copies(line, record_ms, source, location)
            for error in errors:
                await self._dead_letter(error, rekeyed.kind, message.topic, self._reject_rekeyed)
                bad = True
            if not made:
                skipped += not errors
                continue
            good += 1
            for node, ts_ms, copy in made:
                key = node.encode()
                lines = copies.setdefault(partition_for_key(key, partitions), [])
                if not lines or lines[-1][2] is not copy:  # a job line once a partition
                    lines.append((key, ts_ms, copy, offset))
        if good:
            self.policy.good(source, good)
            counted.records.inc(good)
        if skipped:
            self.metrics.records_not_ours.labels(message.topic).inc(skipped)
        sends = [
            await rekeyed.target.send(
                key=lines[0][0],
                value=b"\n".join(line for _, _, line, _ in lines),
                partition=partition,
                timestamp=lines[0][1] / 1000,
                headers=copy_headers(
                    message.partition,
                    [offset for _, _, _, offset in lines],
                    self.settings.worker_app_id,
                    rekeyed.kind,
                ),
            )
            for partition, lines in sorted(copies.items())
        ]
        delivered = asyncio.gather(*sends)
        if bad:
            await delivered
            await self.dead_letters.deliver(_REKEY_BATCH)
            async with self.lock:
                if not await self.commit_point.flush_sink(_REKEY_BATCH, lambda: True):
                    return
        if self._revocations != revocations:
            # Revoked while the copies were sent: the revocation forgot the source partition's
            # progress, which is its next owner's (it re-keys from the committed offset; these
            # copies are repeats to it). Recorded now, the message would count as re-keyed here
            # in the next generation (the partition's first message taken for done, its offset
            # committed, by whichever worker owns it then) as if nothing had happened in between.
            return
        # The copies are delivered before the source message may be committed, but the next
        # message is re-keyed meanwhile: waiting for each message's acks in turn re-keyed ~30
        # messages a second, and every partition's merge waited for the jobs (the producer keeps
        # each partition's copies in order, so the offsets settle in order too).
        rekeyed.pending.append((message.partition, message.offset, delivered))
        if message.partition not in rekeyed.started:
            rekeyed.started.add(message.partition)
            arrived_at = time.monotonic()
            # The first message since the partition was assigned here: committed as soon as its
            # copies are delivered, as a taken-over input partition commits with its first
            # message. Left to the timer, the commit waited for a round of broker requests (the
            # fleet baselines read from the start, under load): a failover test saw the jobs
            # partition commit again 3-4 s after its inputs did, 10.5 s after the restart.
            await delivered
            rekeyed.settle()
            await self.commit_point.commit_rekeyed(rekeyed.topic, rekeyed.delivered, rekeyed.committed)
            if message.partition in rekeyed.committed:
                _log.info(
                    "%s: re-keying from offset %d (delivered %.1f s after the assignment), "
                    "committed %.1f s later",
                    source, message.offset, arrived_at - self._assigned_at, time.monotonic() - arrived_at,
                )  # fmt: skip
            return
        rekeyed.settle()

    def _stale(self, message: Any) -> bool:
        """Fetched before a rebalance: whoever owns the partition now reads it again from the
        committed offset. So is every message handed on between a revocation and the group's next
        assignment, although the consumer still reports the old assignment then: the revocation
        dropped the partition's state, and applying the message would make the state again from
        its checkpoint with the message for its topic's first one (a topic the checkpoint has no
        offset of is not positioned), so that in the next generation everything between the
        checkpoint and the message, read again from the committed offset, would be skipped as
        repeats."""
        if not self.assigned:
            return True
        generation = self.app.consumer_generation_id
        if message.generation_id != generation:
            return True
        known = self._assignment
        if known is None or known[0] != generation:
            assigned = frozenset(self.app.consumer.assignment())
            if self.app.rebalancing:
                return message.tp not in assigned  # changing: not worth remembering
            known = self._assignment = (generation, assigned)
        return message.tp not in known[1]

    def _unapplied(self, message: Any, value: bytes | None) -> tuple[bytes | None, int | None, int]:
        """A message's value, its first line's offset when joined (:mod:`stream.worker.joining`;
        else None) and how many of the broker's messages that is; without the lines applied
        already when a joined run begins before the partition's position and ends past it (read
        again from a commit older than the checkpoint)."""
        first = joined_from(message)
        if first is None or value is None:
            return value, first, 1
        position = self.positions.next_offset(message.tp)
        if position is not None and first < position <= message.offset:
            value, first = skip_applied_lines(value, first, position)
        return value, first, message.offset - first + 1

    def _unapplied_parts(
        self, message: Any, parts: tuple[tuple[int, bytes], ...]
    ) -> tuple[tuple[int, bytes], ...]:
        """A batched message's parts without those applied already (as :meth:`_unapplied`)."""
        position = self.positions.next_offset(message.tp)
        if position is not None and parts[0][0] < position <= message.offset:
            return skip_applied_parts(parts, position)
        return parts

    async def _next_in_line(self, message: Any, first: int | None = None) -> bool:
        """Whether a delivered message (joined: its offsets from ``first`` on) is its partition's
        next one (apply it). A repeat is skipped; after a gap the partition is read again from its
        first unapplied offset."""
        last = message.offset
        delivery = self.positions.check(message.tp, last if first is None else first, last)
        if delivery is Delivery.NEXT:
            if self._stalls:
                self._stalls.pop(message.tp, None)
            return True
        if delivery is Delivery.REPEAT:
            self.metrics.events_skipped.labels(message.topic).inc()
        else:
            where = self.positions.seek_to(message.tp)
            came = f"offset {message.offset}" if first is None else f"offsets {first}-{message.offset}"
            await self._read_again(message.tp, where, f"{came} came")
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

    async def connect_checkpoints(self) -> None:
        """Connect the checkpoint topic's clients, once, whoever asks first; a failure is raised
        to each caller. The app asks as it starts (:func:`stream.worker.app.build_app`): the
        connection is then made while the group forms, not once the first message has come
        (~0.1 s of every start and failover, docs/kafka.md#failover)."""
        if self.checkpoints_started:
            return
        if self._checkpoints_connecting is None:
            self._checkpoints_connecting = asyncio.ensure_future(
                self.checkpoints.start(self.settings.topic_partitions)
            )
        # Shielded: a caller cancelled (a stop) leaves the connection to finish for the others.
        await asyncio.shield(self._checkpoints_connecting)
        self.checkpoints_started = True

    async def _partition_state(self, number: int) -> PartitionWorker:
        state = self.partitions.get(number)
        if state is not None:
            return state
        revocations = self._revocations
        await self.connect_checkpoints()
        loaded = await self.checkpoints.load(number)
        # Revoked while its checkpoint was read (the group rebalanced meanwhile): a state taken up
        # now would outlive the revocation that already ran, and hold its partition for good.
        lost = self._revocations != revocations and not self._assigned_now(number)

        def drained(source: str) -> float | None:
            return self._source_drained(number, source)

        if loaded is None:
            state = PartitionWorker.start(
                number, self.settings, self._sources, None, drained, self.sink, self.dead_letters,
                self.xid_overrides, self.inventory,
            )  # fmt: skip
            _log.info("partition %d: no checkpoint, the detectors start afresh", number)
        else:
            checkpoint, size = loaded
            changes = adopt_configuration(number, checkpoint, self.core_config, self.xid_overrides)
            if changes:
                _log.warning(
                    "partition %d: its checkpoint was made under another detector configuration; the "
                    "detectors go on from it under this worker's (%s): what comes next is judged by the new "
                    "values, open incidents stay open and resolve by them, nothing decided is decided again. "
                    "Changed: %s",
                    number, self.sink.config, "; ".join(changes),
                )  # fmt: skip
            state = PartitionWorker.start(
                number, self.settings, self._sources, checkpoint, drained, self.sink, self.dead_letters,
                inventory=self.inventory,
            )  # fmt: skip
            for topic, offset in checkpoint.offsets.items():
                self.positions.expect(TP(topic, number), offset + 1)
            self.metrics.checkpoints_restored.inc()
            _log.info(
                "partition %d: detector state restored from its checkpoint (%d bytes, offsets %s, "
                "written in generation %d)",
                number, size, checkpoint.offsets, getattr(checkpoint, "generation", -1),
            )  # fmt: skip
            self._warn_takeover_gap(number, checkpoint.offsets)
        state.generation = self.app.consumer_generation_id
        # The first commit point of a partition taken over comes with its first message, not a
        # flush interval later: the group sees at once that the partition moves again.
        state.last_commit = 0.0
        state.learn_baselines(self.baselines, self.ecc_references)
        if lost:
            # Not this worker's: returned unregistered, so nothing of it is released or committed
            # (``_current``); whoever owns the partition now takes it up from the checkpoint.
            _log.info("partition %d: revoked while its checkpoint was read; not taken up here", number)
            return state
        self._idle_announced.discard(number)
        self.partitions[number] = state
        return state

    def _assigned_now(self, number: int) -> bool:
        """Whether input partition ``number`` is this worker's in the group's current assignment."""
        if self.app.rebalancing:
            return False
        return any(
            tp.partition == number and tp.topic in self.topics.kinds for tp in self.app.consumer.assignment()
        )

    def _warn_takeover_gap(self, number: int, offsets: dict[str, int]) -> None:
        """A restored checkpoint older than the group's committed offset: what lies between is read
        again (the gap re-read), but it means a checkpoint went missing, so say so."""
        committed = committed_offsets(self.app.consumer)
        behind = {
            topic: done - offsets.get(topic, -1) - 1
            for topic in self.topics.kinds
            if (done := committed.get(TP(topic, number))) is not None and done > offsets.get(topic, -1) + 1
        }
        if behind:
            _log.warning(
                "partition %d: the restored checkpoint is older than the group's committed offsets by "
                "%s messages; they are read again (a checkpoint was written by a stale owner, or taken "
                "over between its fencing check and its write)",
                number, behind,
            )  # fmt: skip

    def _caught_up(self, topic: str, partition: int, last_offset: int) -> bool:
        """Whether ``last_offset`` is the partition's last: an end offset not known yet is not
        reached (a partition not fetched yet is not idle, it is behind)."""
        tp = TP(topic, partition)
        ends = [end for end in (self._ends.get(tp), self._highwater(tp)) if end is not None]
        return bool(ends) and last_offset + 1 >= max(ends)

    def _source_drained(self, partition: int, source: str) -> float | None:
        """Whether the merge may treat a silent source as idle: the monotonic time as of which
        nothing of it was left to read (when the broker was last asked, less the publish skew),
        None if something is."""
        state = self.partitions.get(partition)
        if state is None:
            return math.inf
        topic = self._topic_of[source]
        if not self._caught_up(topic, partition, state.applied.get(topic, -1)):
            return None
        rekeyed = self._rekeyed_by_kind.get(source)
        if rekeyed is not None and not rekeyed.all_rekeyed:
            # Its input is the re-keying of another topic, by whichever worker owns that: only
            # once every message there was re-keyed can nothing more be on its way here.
            return None
        # What was published within the skew before the broker was asked may not have been readable.
        return self._progress_at - PUBLISH_SKEW_SECONDS

    async def _refresh_progress(self) -> None:
        """Learn how far the inputs go, for the merge's idle test: whether the group has committed
        every message of the jobs topic (each is committed once its copies were delivered), then
        — after that, so that those copies are counted — the end offsets of this worker's input
        partitions."""
        consumer = self.app.consumer
        now = time.monotonic()
        if self.app.rebalancing or now - self._last_refresh < _REFRESH_SECONDS:
            return
        self._last_refresh = now
        asked_at = now
        rekeyed_partitions = [
            TP(topic, p) for topic in self.rekeyed for p in range(consumer.topic_partitions(topic) or 1)
        ]
        inputs = [tp for tp in consumer.assignment() if tp.topic in self.topics.kinds]
        if 0 in self.partitions and self.topics.fleet is not None:
            inputs.append(TP(self.settings.topic_fleet, 0))  # how far the fleet stage has to go
        try:
            committed = await self.broker.committed(self.settings.worker_app_id, rekeyed_partitions)
            # One request for both, after the committed offsets (a jobs message arriving between
            # the two only makes the answer "not yet").
            ends = await self.broker.end_offsets([*rekeyed_partitions, *inputs])
        except (AssertionError, KafkaError) as exc:  # the assignment changed under the request
            _log.info("input progress not refreshed: %r", exc)
            return
        # A partition without a committed offset says -1: nothing re-keyed, done if it is empty.
        done = {(tp.topic, tp.partition): max(offset, 0) for tp, offset in committed.items()}
        for topic, rekeyed in self.rekeyed.items():
            rekeyed.all_rekeyed = all(
                done.get((tp.topic, tp.partition), 0) >= ends.get(tp, 0)
                for tp in rekeyed_partitions
                if tp.topic == topic
            )
        self._ends.update(ends)
        self._progress_at = asked_at
        self.progress_unknown = False

    # -- the fleet stage ---------------------------------------------------------------------

    async def _read_baselines(self) -> None:
        """New storm baselines and ECC references of the fleet stage (every worker reads the whole
        topic)."""
        if self.topics.fleet_baselines is None:
            return
        try:
            found = await self._baseline_reader.read(self._baselines_read)
        except (AssertionError, KafkaError) as exc:
            _log.info("fleet baselines not read: %r", exc)
            return
        if found:
            self._baselines_read = found[-1][0] + 1
            storms, ecc = decode_references(
                (value for _, value in found),
                self.settings.worker_app_id,
                self.settings.topic_fleet_baselines,
            )
            self._new_baselines.update(storms)
            self._new_ecc_references.update(ecc)

    async def _fleet_round(self, until: int = 0) -> None:
        """The fleet stage's round, if this worker runs it, and what it decided learnt by every
        partition here; ``until``: read the fleet topic at least that far (waiting up to
        ``_HAND_OVER_READ_SECONDS``)."""
        await self._run_fleet_stage(until)
        # After the stage: the baselines it just decided (the owner's) are learnt in this round,
        # not the next one (a backlog's XIDs that could storm wait for them at each day).
        if self._new_baselines or self._new_ecc_references:
            new, self._new_baselines = self._new_baselines, {}
            ecc, self._new_ecc_references = self._new_ecc_references, {}
            self.baselines.update(new)
            self.ecc_references.update(ecc)
            self.fleet_waits.decided()
            for state in self.partitions.values():
                state.learn_baselines(new, ecc)

    async def _run_fleet_stage(self, until: int = 0) -> None:
        """The owner of input partition 0 runs the fleet stage: apply what the partitions handed
        over, into partition 0's batch; publish new storm baselines. ``until``: as for
        :meth:`_fleet_round`."""
        if self.topics.fleet is None or self.app.rebalancing:
            return
        state = self.partitions.get(0)
        if state is None:
            if not self._assigned_now(0):
                return
            state = await self._partition_state(0)  # ours, if it has no records yet: the stage still runs
        if state.fleet is None or not self._current(state):
            return
        try:
            found = await self._fleet_reader.read(state.fleet_offset)
            deadline = time.monotonic() + _HAND_OVER_READ_SECONDS
            after = found[-1][0] + 1 if found else state.fleet_offset
            while after < until and (left := deadline - time.monotonic()) > 0:
                found.extend(await self._fleet_reader.read(after, timeout_ms=max(int(left * 1000), 1)))
                after = found[-1][0] + 1 if found else state.fleet_offset
        except (AssertionError, KafkaError) as exc:
            _log.info("fleet topic not read: %r", exc)
            return
        if not found:
            return
        fleet = state.fleet
        for offset, value in found:
            try:
                message = decode_fleet_message(value)
            except (ValueError, KeyError, TypeError) as exc:  # only workers write it: a bug
                _log.error("%s/0 offset %d: unreadable, skipped: %r", self.settings.topic_fleet, offset, exc)
                continue
            check_deployment(
                message.app,
                self.settings.worker_app_id,
                lambda offset=offset: f"{self.settings.topic_fleet}/0 offset {offset}",
            )
            fleet.add(message.partition, message.facts)
            for part in message.jobs:
                fleet.add_job(part)
            if message.horizon_ms is not None:
                fleet.advance(message.partition, message.horizon_ms, message.checkpointed_ms)
            if message.idle:
                fleet.idle(message.partition, message.pending)
        state.fleet_offset = found[-1][0] + 1
        state.changed = True
        decided = fleet.drain()
        state.pipeline.sink.add_emitted(
            Emitted(incidents=decided.incidents, attributions=decided.attributions, mttf=decided.mttf),
            state.partition,
        )
        for incident in decided.incidents:
            state.incidents[incident.incident_id] = incident
        if decided.baselines or decided.ecc_references:
            delivery = await self.topics.fleet_baselines.send(
                value=encode_baselines(decided.baselines, decided.ecc_references, self.settings.worker_app_id)
            )
            await delivery
            self._new_baselines.update(decided.baselines)
            self._new_ecc_references.update(decided.ecc_references)

    async def _restore_held(self) -> None:
        """Restore at once the assigned partitions whose checkpoint holds records the merge held
        back. A partition's state is otherwise made when its first message arrives; one whose
        offsets are all committed delivers none, and its held records (waiting for a storm
        baseline, say, when a rebalance took it away) were never applied: the chaos soak lost two
        weeks of a partition that way. The checkpoint of each is read once per assignment."""
        if self.app.rebalancing:
            return
        assigned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic in self.topics.kinds}
        for number in sorted(assigned - set(self.partitions) - self._probed):
            self._probed.add(number)
            await self.connect_checkpoints()
            try:
                loaded = await self.checkpoints.load(number)
            except KafkaError as exc:
                self._probed.discard(number)  # the next tick asks again
                _log.info("partition %d: checkpoint not read: %r", number, exc)
                continue
            if loaded is not None and (loaded[0].held or loaded[0].core.has_pending_decisions):
                # Also a core with decisions pending: its idle announcement must say so.
                await self._partition_state(number)

    async def _announce_idle(self) -> None:
        """Tell the fleet stage about partitions with nothing to read, so it does not wait for
        them: ours with nothing pending, and assigned ones that never delivered anything."""
        if self.topics.fleet is None or self.app.rebalancing:
            return
        pending = 0
        for state in list(self.partitions.values()):
            if not self._current(state):
                continue  # dropped by a revocation during a hand-over of this loop (see _current)
            idle = self._fleet_idle(state)
            pending += int(state.drained_since is not None and not idle and not state.announced_idle)
            if (
                idle
                and not state.announced_idle
                and not state.fleet_facts
                and not state.fleet_jobs
                and state.fleet_horizon_ms == state.handed_horizon_ms
            ):
                await self.commit_point.hand_over(state, idle=True)
        committed = committed_offsets(self.app.consumer)
        numbers = {tp.partition for tp in self.app.consumer.assignment() if tp.topic in self.topics.kinds}
        now = time.monotonic()
        for number in sorted(numbers - set(self.partitions) - self._idle_announced):
            if not (
                all(rekeyed.all_rekeyed for rekeyed in self.rekeyed.values())
                and all(
                    self._caught_up(topic, number, (committed.get(TP(topic, number)) or 0) - 1)
                    for topic in self.topics.kinds
                )
            ):
                self._empty_since.pop(number, None)
                continue
            since = self._empty_since.setdefault(number, now)
            if now - since < self.settings.worker_fleet_idle_seconds:
                pending += 1
                continue
            await self.commit_point.send_fleet(
                encode_fleet_messages(number, None, [], [], idle=True, app=self.settings.worker_app_id)
            )
            self._idle_announced.add(number)
        self.metrics.fleet_idle_pending.set(pending)

    # -- dead letters -----------------------------------------------------------------------

    async def _dead_letter(
        self, error: InvalidRecord, kind: str, topic: str, reject: Callable[[DeadLetter], None]
    ) -> None:
        reject(to_dead_letter(error, kind))
        self.policy.bad(error.source, error.reason)
        self.metrics.dead_letters.labels(topic, reason_class(error.reason)).inc()
        try:
            self.policy.check(error.source)
        except DeadLetterLimitExceeded as exc:
            # A bad deploy must not drain the stream into the dead letters: stop, loudly.
            _log.error("stopping the worker: %s", exc)
            await self.app.crash(exc)
            raise

    def _reject_rekeyed(self, letter: DeadLetter) -> None:
        """A jobs message that could not be read: its own batch, written before it is committed."""
        store_dead_letter(self.sink, self.dead_letters, letter, _REKEY_BATCH)

    # -- commit points ----------------------------------------------------------------------

    def _hold_back(self, state: PartitionWorker) -> None:
        """Stop reading an input partition whose records the partition's merge holds as many of as
        it may (its share of ``worker_merge_hold_records``), and read it again once half of them are
        released. Its records wait in Kafka, not in
        memory: on a backlog the ECC scrapes run far ahead of the XIDs and jobs they are merged with.
        A partition held back holds records, so it is never the one the merge waits for."""
        budget = self.settings.worker_merge_hold_records
        if budget <= 0:
            return
        limit = max(budget // max(len(self.partitions), 1), _LEAST_HELD)
        before = self.held_back.partitions
        after = set(before)
        for topic, kind in self.topics.kinds.items():
            tp = TP(topic, state.partition)
            held = state.merger.held_count(kind)
            if tp in before and held <= limit // 2:
                after.discard(tp)
                self.positions.waited(tp)  # its silence while held back was no stall
            elif tp not in before and held >= limit:
                after.add(tp)
        if after != before:
            self.held_back.partitions = frozenset(after)
            self.metrics.held_back_partitions.set(len(after))

    async def _release(self, state: PartitionWorker) -> None:
        if not self._current(state):
            return  # dropped by a revocation since the caller took it (see _current)
        self.metrics.late_events.inc(state.process_released())
        self._hold_back(state)
        if state.hand_over_due():
            # The fleet stage decides a period's storm baseline once every partition's horizon
            # has passed the period before it; XIDs that could storm wait for it. Handed over only
            # at commit points, a backlog waited for one at each day boundary (the worker ran at
            # a third of the embedded replay's speed). Early facts are safe: a partition restarted
            # from its checkpoint hands the same facts over again and the stage drops repeats.
            await self.commit_point.hand_over(state, state.announced_idle)
            if state.waiting_for_fleet and 0 in self.partitions:
                # This worker runs the fleet stage: its round runs now, reading the hand-over just
                # sent. At the timer's pace (0.1 s) a one-partition backlog of 30 days waited for
                # ~80 decisions (each day's storm baseline, the first two days' hourly ECC
                # references): 6-7 s of a replay that takes 3 s without them; woken at once, the
                # timer's round waited for the agent's lock and for the fleet topic's read, while
                # the agent read on: the merge held ~50,000 records at the median in batches of
                # 32 messages. The timer still follows (releases elsewhere, idle partitions).
                await self._fleet_round(self.commit_point.fleet_sent_end)
                self.tick_wanted.set()
        backlog, backlog_records = self._backlog(state)
        # The end of a backlog (a restart, a replay of history): commit at once rather than up to
        # a flush interval later, so the group's lag reads 0 as soon as it is true.
        if backlog_records > _CATCH_UP_RECORDS:
            state.behind = True  # until it reaches the end, through the commit points on the way
        caught_up = state.behind and backlog == 0
        if self._commit_due(state, caught_up):
            await self.commit(state)
        elif self._publish_due(state, backlog_records):
            await self.commit_point.publish(state, self._still_ours(state))
        if caught_up:
            state.behind = False

    def _commit_due(self, state: PartitionWorker, caught_up: bool) -> bool:
        return (state.uncommitted > 0 or state.changed) and (
            caught_up
            or self.sink.should_flush(state.partition)
            or time.monotonic() - state.last_commit
            >= state.commit_interval(self.settings.worker_flush_seconds)
        )

    def _publish_due(self, state: PartitionWorker, backlog_records: float) -> bool:
        """Incident updates wait at most ``worker_publish_seconds`` for the commit point — once
        the partition is live. Behind a backlog the evidence is older than the commit interval
        anyway, and each early publication costs a ClickHouse flush (one every quarter second
        took a fifth of a worker's time on replayed history): they are spaced by a few times what
        the last one took."""
        every = self.settings.worker_publish_seconds
        return (
            bool(state.incidents)
            and every > 0
            and time.monotonic() - state.last_publish
            >= max(every, _PUBLISH_COST_FACTOR * state.publish_seconds)
            and backlog_records <= _LIVE_BACKLOG_RECORDS
        )

    def _backlog(self, state: PartitionWorker) -> tuple[int, float]:
        """Messages waiting on the partition's input topics, and about how many records they hold."""
        messages, records = 0, 0.0
        sizes = state.records_a_message
        for topic in self.topics.kinds:
            lag = self._lag(state, topic) or 0
            messages += lag
            records += lag * sizes.get(topic, 1.0)
        return messages, records

    def _lag(self, state: PartitionWorker, topic: str) -> int | None:
        """Messages of ``topic`` in the partition not applied yet, by Faust's highwater (learnt
        from fetch responses: no request); None before the first fetch."""
        highwater = self._highwater(TP(topic, state.partition), _HIGHWATER_SECONDS)
        return None if highwater is None else max(highwater - state.applied.get(topic, -1) - 1, 0)

    def _highwater(self, tp: Any, max_age: float = 0.0) -> int | None:
        """Faust's highwater of a partition; None if unknown, or if a rebalance has taken the
        partition away and its revocation has not reached :meth:`forget` yet (aiokafka asserts
        then: a worker crashed on it, between two rebalances of a kill test). With ``max_age``,
        an answer read at most that many seconds ago will do."""
        now = time.monotonic()
        if max_age > 0:
            cached = self._highwaters.get(tp)
            if cached is not None and now - cached[1] < max_age:
                return cached[0]
        try:
            highwater: int | None = self.app.consumer.highwater(tp)
        except AssertionError:
            highwater = None
        self._highwaters[tp] = (highwater, now)
        return highwater

    def _still_ours(self, state: PartitionWorker) -> Callable[[], bool]:
        """Whether ``state`` is still this worker's partition (a rebalance may revoke it while a
        flush is retried or a send awaited)."""
        return lambda: self._current(state)

    def _current(self, state: PartitionWorker) -> bool:
        """Whether ``state`` is still its partition's state here. A round that goes through the
        states it took at its start (the timer's releases, idle announcements and fleet waits)
        awaits the broker on the way, and a revocation meanwhile drops the states it has still to
        visit: those are left alone. A dropped state's partition is no longer this worker's, so its
        merge takes every source for drained (:meth:`_source_drained`) and would release into its
        core what it holds back for sources with more to read. The rows that makes (a job
        `running` past an end not read yet, at versions above its `ended` rows) would go to the
        sink batch the drop discarded, which the partition's next state on this worker writes,
        and its facts and idleness to the fleet stage."""
        return self.partitions.get(state.partition) is state

    async def commit(self, state: PartitionWorker) -> None:
        """Reach the partition's commit point (:mod:`stream.worker.commit`)."""
        try:
            await self.commit_point.commit(state, self._still_ours(state), self._fleet_idle(state))
        except StaleCheckpoint as exc:
            # Another worker owns the partition now: its checkpoint stands, ours is dropped, and if
            # the partition is still assigned here its next message reloads the newer checkpoint.
            _log.warning("partition %d: %s; this worker's state of it is dropped", state.partition, exc)
            self.metrics.stale_checkpoints.inc()
            if self.partitions.get(state.partition) is state:
                self._drop(state.partition)

    def _partition_idle(self, state: PartitionWorker) -> bool:
        """Nothing held and nothing left to read."""
        return len(state.merger) == 0 and all(
            self._source_drained(state.partition, source) is not None for source in self._sources
        )

    def _fleet_idle(self, state: PartitionWorker) -> bool:
        """Whether the fleet stage need not wait for the partition: it has had nothing to read for
        ``worker_fleet_idle_seconds`` (a replay's publisher reaches every partition well within it)."""
        if not self._partition_idle(state):
            state.drained_since = None
            return False
        now = time.monotonic()
        if state.drained_since is None:
            state.drained_since = now
        return now - state.drained_since >= self.settings.worker_fleet_idle_seconds

    # -- the timer --------------------------------------------------------------------------

    async def refresh(self) -> None:
        """The timer's requests to the broker, made without the lock so the agent keeps applying
        meanwhile (each answer can take a second under load): commit the re-keyed jobs, learn
        how far the inputs go, and the end offsets the stall watch compares with."""
        for rekeyed in self.rekeyed.values():
            rekeyed.settle()
            await self.commit_point.commit_rekeyed(rekeyed.topic, rekeyed.delivered, rekeyed.committed)
        await self._refresh_progress()
        await self._fetch_stall_ends()
        await self._read_baselines()

    async def tick(self) -> None:
        """Under the lock, after :meth:`refresh`: read stalled partitions again, release what idle
        sources hold back, reach due commit points and refresh the gauges."""
        await self._restore_held()
        await self._fleet_round()
        await self._announce_idle()
        await self._watch_for_stalls()
        for state in list(self.partitions.values()):
            await self._release(state)
        fleet_state = self.partitions.get(0)
        await self._end_endless_waits(None if fleet_state is None else fleet_state.fleet)
        fleet_end = self._ends.get(TP(self.settings.topic_fleet, 0))
        behind = 0 if fleet_state is None or fleet_end is None else fleet_end - fleet_state.fleet_offset
        self.metrics.fleet_behind.set(max(behind, 0))
        self.metrics.fleet_read_offset.set(-1 if fleet_state is None else fleet_state.fleet_offset)
        self.metrics.assignment_settled.set(int(self._assignment_settled()))
        now = time.monotonic()
        caught_up = self._assignment_settled() and behind <= 0
        for number, state in self.partitions.items():
            label = str(number)
            uncommitted, held = state.uncommitted + int(state.changed), len(state.merger)
            self.metrics.uncommitted.labels(label).set(uncommitted)
            self.metrics.held_back.labels(label).set(held)
            arrived = state.merger.oldest_arrival()
            self.metrics.held_age.labels(label).set(0.0 if arrived is None else max(now - arrived, 0.0))
            self.metrics.fleet_wait.labels(label).set(self.fleet_waits.waited(state, now))
            caught_up = caught_up and not uncommitted and not held
            for topic in self.topics.kinds:
                lag = self._lag(state, topic)
                if lag is not None:
                    self.metrics.consumer_lag.labels(topic, label).set(lag)
                caught_up = caught_up and lag == 0
        self.metrics.caught_up.set(int(caught_up))

    async def _end_endless_waits(self, stage: FleetCore | None) -> None:
        """Report records that wait long for the fleet stage; let go those whose wait cannot end
        (:mod:`stream.worker.fleet_wait`)."""
        now = time.monotonic()
        for state in list(self.partitions.values()):
            if self._current(state) and self.fleet_waits.check(state, stage, now):
                awaited = state.decide_without_fleet()
                if awaited is not None:
                    self.metrics.fleet_decided_without.labels(awaited[0]).inc()
                    await self._release(state)

    def _assignment_settled(self) -> bool:
        """Whether the worker holds the group's assignment and this round went through all of it:
        each assigned partition has its state, or its checkpoint was read and holds nothing.
        Before that the gauges miss partitions (a member restarted with its static id reads zero
        everywhere until its first round restores the checkpoints it took back)."""
        if not self.assigned or self.app.rebalancing:
            return False
        numbers = {tp.partition for tp in self.app.consumer.assignment() if tp.topic in self.topics.kinds}
        return numbers <= set(self.partitions) | self._probed

    async def _fetch_stall_ends(self) -> None:
        """Every ``STALL_SECONDS``, the end offsets of the input partitions for
        :meth:`_watch_for_stalls` (not while ClickHouse flushes fail: the agent is held then)."""
        now = time.monotonic()
        if (
            now - self._last_stall_check < STALL_SECONDS
            or now - self.commit_point.last_flush_failure < STALL_SECONDS
        ):
            return
        self._last_stall_check = now
        watched = [
            tp
            for tp in self.app.consumer.assignment()
            if tp.topic in self.topics.kinds or tp.topic in self.rekeyed
        ]
        if not watched or self.app.rebalancing:
            return
        try:
            self._stall_ends = await self.broker.end_offsets(watched)
        except (AssertionError, KafkaError) as exc:  # the assignment changed under the request
            _log.info("stall check skipped: %r", exc)

    async def _watch_for_stalls(self) -> None:
        """Read again any input partition that has more to read (by the ends
        :meth:`_fetch_stall_ends` learnt) but has delivered nothing for ``STALL_SECONDS``."""
        ends, self._stall_ends = self._stall_ends, {}
        if self.input_backlog():
            # Messages wait in the agent's queue (a backlog, a slow commit point): a partition's
            # next message may be among them. Found live at 20,000 records/s on a loaded machine:
            # a jobs-by-node message queued behind ~4,000 others for over 30 s stopped the worker.
            self.positions.busy()
            self._stalls.clear()
            return
        if not ends or self.app.rebalancing:
            return
        assigned = self.app.consumer.assignment()
        committed = committed_offsets(self.app.consumer)
        for tp in ends:
            if tp not in assigned:
                continue  # revoked since the ends were asked for
            if tp in self.held_back.partitions:
                self.positions.waited(tp)  # not read on purpose: its merge holds enough of it
                continue
            # Nothing applied yet: reading starts at the committed offset, else at the beginning
            # (auto_offset_reset=earliest; an offset before the log start resets to it).
            start = committed.get(tp) or 0
            offset = self.positions.stalled(tp, ends.get(tp), STALL_SECONDS, start=start)
            if offset is not None:
                state = fetch_state(self.app, tp)
                self._stalls[tp] = self._stalls.get(tp, 0) + 1
                if self._stalls[tp] > 1:
                    raise WorkerStalled(
                        f"input partition {tp.topic}/{tp.partition} stalled: nothing delivered from offset "
                        f"{offset} (end {ends[tp]}) for {STALL_SECONDS * self._stalls[tp]:.0f} s, even after "
                        f"reading it again ({state})"
                    )
                refetch(self.app, tp)
                why = f"nothing delivered for {STALL_SECONDS:.0f} s, {ends[tp]} is the end ({state}),"
                await self._read_again(tp, offset, why)

    # -- rebalances and shutdown ------------------------------------------------------------

    def forget(self, revoked: set[Any]) -> None:
        """Drop the state of revoked partitions: Faust seeks every partition it is (re)assigned to
        its committed offset, so progress past the checkpoint is redone by whoever gets it."""
        self.positions.forget(revoked)
        if self.held_back.partitions & revoked:
            self.held_back.partitions = self.held_back.partitions - revoked
        self._revocations += 1
        self.assigned = False  # until the group's next assignment (a revocation starts a rebalance)
        self._assignment = None
        self._highwaters.clear()
        for tp in revoked:
            self._probed.discard(tp.partition)
            rekeyed = self.rekeyed.get(tp.topic)
            if rekeyed is not None:
                rekeyed.forget(tp.partition)
            if tp.topic in self.topics.kinds and tp.partition in self.partitions:
                self._drop(tp.partition)

    def note_assigned(self) -> None:
        """The group assigned this worker its partitions (after a revocation, or at start)."""
        self.progress_unknown = True
        self.assigned = True
        self._assigned_at = time.monotonic()
        self._assignment = None

    def _drop(self, number: int) -> None:
        """Forget a partition's state and what its batches hold."""
        self.partitions.pop(number, None)
        self.positions.forget(TP(topic, number) for topic in self.topics.kinds)
        self.checkpoints.forget(number)
        self.sink.discard(number)
        self.dead_letters.discard(number)
        self.metrics.forget_partition(number, self.topics.kinds)

    async def stop(self) -> None:
        connecting = self._checkpoints_connecting
        if connecting is not None and not connecting.done():
            # A stop in the first moments: the connection under way ends before its clients close
            # (or, stuck on an unreachable broker, is given up).
            await asyncio.wait([connecting], timeout=_STOP_CONNECT_SECONDS)
            connecting.cancel()
        if connecting is not None and connecting.done() and not connecting.cancelled():
            self.checkpoints_started = connecting.exception() is None
        if self.checkpoints_started:
            await self.checkpoints.stop()
        await self.broker.close()
        await self._baseline_reader.close()
        await self._fleet_reader.close()
