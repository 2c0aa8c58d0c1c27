"""The state of one input partition in a worker: detection core, event-time merge, uncommitted work.

Everything a worker holds for partition *p* of the (co-partitioned) input topics: the
:class:`~stream.pipeline.RecordPipeline` around the partition's detection core, the
:class:`~stream.worker.merge.EventTimeMerger` that orders the partition's XID, ECC and job
records by event time, the offsets applied so far, and what waits for the next commit point.
Its checkpoint (:class:`~stream.worker.checkpoints.PartitionCheckpoint`) is the core, the
records the merge holds and the offsets applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from detectors.core import CoreConfig, DetectionCore, FleetBaselineMissing
from detectors.fleet import FROM_THE_START, NO_ECC_REFERENCE, FleetCore, FleetFact, JobPart
from detectors.reconfiguring import ConfigurationRefused, reconfigure, reconfigure_fleet
from detectors.xid_catalog import XidOverride
from schemas.outputs import Incident
from schemas.records import RECORD_KIND, EccSample, Record
from schemas.timeutil import DAY_MS
from stream.kafka.codec import encode_record, redecode_record
from stream.kafka.fleet import NodeOwner
from stream.pipeline import RecordPipeline, RecordSink
from stream.settings import Settings
from stream.sinks.dead_letters import DeadLetterProducer
from stream.worker.checkpoints import CheckpointError, HeldLines, HeldRecord, PartitionCheckpoint
from stream.worker.merge import EventTimeMerger
from stream.worker.rekeying import CopiesApplied

__all__ = [
    "CHECKPOINT_COST_FACTOR",
    "CheckpointConfiguration",
    "HeldLine",
    "PartitionWorker",
    "adopt_configuration",
]

#: A commit point comes at least this many times its checkpoint's cost after the previous one.
CHECKPOINT_COST_FACTOR = 25.0

#: Event time after a partition's first hand-over in which it hands over at every ECC-reference
#: period: its GPUs' warm-up and reference lag (48 h), when their samples may wait for the fleet.
_YOUNG_HISTORY_MS = 2 * DAY_MS
#: How fast a topic's records-a-message estimate forgets a large message: a fiftieth a message.
_RECORDS_A_MESSAGE_DECAY = 0.98

#: What the event-time merge holds: a decoded record and the line it came from (for the checkpoint).
HeldLine = tuple[Record, bytes]


#: Sources whose records the merge releases without asking :meth:`PartitionWorker._ready`: ECC
#: samples, whose readiness their processing tells (a call a record saved, ~0.1 µs of ~3.5).
_GO_UNASKED: Final = frozenset({RECORD_KIND[EccSample]})
#: Merge sources a deployment may not use at all (the kernel log's re-keyed XIDs, for a site that
#: sends its XIDs as records, or none): idle from the start while nothing of them is to be read.
OPTIONAL_SOURCES: Final = frozenset({"kernel"})


class CheckpointConfiguration(Exception):
    """A checkpoint made under a configuration of settings that shape the detector state, which the
    worker's cannot continue: the worker stops with one line saying what to do."""


def adopt_configuration(
    partition: int, checkpoint: PartitionCheckpoint, config: CoreConfig, overrides: tuple[XidOverride, ...]
) -> list[str]:
    """Put a restored checkpoint's detectors (and fleet stage) under the worker's configuration
    (:mod:`detectors.reconfiguring`); return what changed, ``name: old -> new``.

    Raises
    ------
    CheckpointConfiguration
        When a setting that shapes the state changed.
    """
    core = checkpoint.core
    try:
        changes = reconfigure(core, config)
    except ConfigurationRefused as exc:
        raise CheckpointConfiguration(
            f"partition {partition}: its checkpoint was made under other values of settings that shape "
            f"the detector state ({exc}); run with those values again, or start the detectors afresh "
            "(delete the checkpoint topic: open incidents are then opened anew)"
        ) from None
    overrides = tuple(sorted(overrides, key=lambda override: override.code))  # as the core keeps them
    if core.xid_overrides != overrides:
        before = ", ".join(str(o.code) for o in core.xid_overrides) or "none"
        after = ", ".join(str(o.code) for o in overrides) or "none"
        changes.append(f"XID catalog overrides: codes {before} -> {after}")
        core.xid_overrides = overrides
    if checkpoint.fleet is not None:
        reconfigure_fleet(checkpoint.fleet, config.fleet_config())
    return changes


@dataclass(slots=True)
class PartitionWorker:
    """The state of one input partition: what its checkpoint holds, plus the uncommitted batch."""

    partition: int
    pipeline: RecordPipeline
    merger: EventTimeMerger[HeldLine]
    #: Input topic -> offset of the last message applied (in the core, the merge or a dead letter).
    applied: dict[str, int] = field(default_factory=dict)
    #: Messages applied since the last commit point.
    uncommitted: int = 0
    incidents: dict[str, Incident] = field(default_factory=dict)
    #: Records went through the core since the last commit point (released from the merge at
    #: idle time, their messages may all be acked already: the checkpoint held them).
    changed: bool = False
    last_commit: float = field(default_factory=time.monotonic)
    #: Seconds the last checkpoint took to encode and write: the next commit point waits at least
    #: :data:`CHECKPOINT_COST_FACTOR` times that (see :meth:`commit_interval`).
    checkpoint_seconds: float = 0.0
    #: When the incident updates of the partition were last published (at a commit point or sooner),
    #: and how long that took (a ClickHouse flush, then the incidents' acks).
    last_publish: float = field(default_factory=time.monotonic)
    publish_seconds: float = 0.0
    #: Records a message of each input topic lately: the largest, shrinking by a fiftieth each
    #: message after it (turns a backlog of messages into one of records). The last message
    #: alone can be a batch's short tail, a few records where the others hold 256: a backlog then
    #: looked live, and early publications flushed ClickHouse through it.
    records_a_message: dict[str, float] = field(default_factory=dict)
    #: Whether the partition is catching up a backlog (a restart, history replayed): set when it
    #: is far behind, cleared when it reaches the end, where it commits at once.
    behind: bool = False
    #: What goes to the fleet stage at the next commit point (before the checkpoint).
    fleet_facts: list[FleetFact] = field(default_factory=list)
    fleet_jobs: list[JobPart] = field(default_factory=list)
    fleet_horizon_ms: int | None = None
    #: The horizon last handed over, and whether the stage was last told there is nothing to read.
    handed_horizon_ms: int | None = None
    announced_idle: bool = False
    #: Monotonic time since which the partition has had nothing to read (None: it has).
    drained_since: float | None = None
    #: Partition 0 only: the fleet stage it runs, and the next offset of the fleet topic to read.
    fleet: FleetCore | None = None
    fleet_offset: int = 0
    #: The re-keyed job copies applied, by source offset: a copy sent again is skipped.
    copies: CopiesApplied = field(default_factory=CopiesApplied)
    #: The consumer group generation in which this worker took the partition (its checkpoints
    #: carry it: a stale owner's cannot replace a newer owner's).
    generation: int = -1
    #: Whether the merge's next record waits for the fleet stage (a baseline or ECC reference).
    waiting_for_fleet: bool = False
    #: The first horizon it handed over (since it was started or restored).
    first_horizon_ms: int | None = None
    #: The horizon of its newest checkpoint (FROM_THE_START before the first): a worker that takes
    #: the partition over hands the stage again what followed it, which the stage must recognise.
    checkpointed_horizon_ms: int = FROM_THE_START
    #: Monotonic time since which the merge's next record has waited for the fleet stage (None:
    #: it does not wait), and whether the wait was reported in the log yet.
    waiting_since: float | None = None
    wait_reported: bool = False

    def hand_over_due(self) -> bool:
        """Whether the partition's horizon (and facts) should go to the fleet stage now rather
        than at the next commit point: the merge's next record waits for the stage and the horizon
        moved since the last hand-over, or the horizon entered a storm-baseline period after the
        one last handed over (a baseline the stage can decide now), or an ECC-reference period in
        the partition's first two days of event time (hourly: a backlog past them does not hand
        over each hour)."""
        horizon, handed = self.fleet_horizon_ms, self.handed_horizon_ms
        if horizon is None:
            return False
        if handed is None:
            return True  # nothing handed over yet (a new partition's first commit point is seconds away)
        if self.waiting_for_fleet and horizon != handed:
            # What the record waits for may be decidable at this very horizon, which the record
            # itself pins: an ECC sample at an hour's start holds the horizon the lateness and the
            # attribution window before it, exactly where the stage decides that hour's reference,
            # so no period is crossed. Handed over only at the next commit point, a backlog of
            # 1-minute scrapes stood still at such hours (0.5-5.4 s in a probe), its merge filling
            # with up to ~260,000 records that every checkpoint then pickled.
            return True
        period = self.core.config.storm_baseline_period_ms
        if horizon // period > handed // period:
            return True
        ecc_period = self.core.config.ecc_period_ms
        if horizon // ecc_period <= handed // ecc_period:
            return False
        if self.first_horizon_ms is None:
            self.first_horizon_ms = handed
        # The first two days after the partition's first records are when its GPUs are young and
        # their samples wait for the fleet's hourly ECC reference: every partition hands over at
        # each hour then, so that one waiting does not wait for the others' commit points.
        return horizon - self.first_horizon_ms < _YOUNG_HISTORY_MS

    def note_message_size(self, topic: str, records: float) -> None:
        """Count a message of ``topic`` holding ``records`` good records (a joined message: its
        records per offset) into :attr:`records_a_message`."""
        sizes = self.records_a_message
        sizes[topic] = max(records, sizes.get(topic, 1.0) * _RECORDS_A_MESSAGE_DECAY)

    def commit_interval(self, flush_seconds: float) -> float:
        """Seconds between two commit points: ``flush_seconds``, or longer when the checkpoint is
        costly. A checkpoint pickles the partition's whole detector state under the agent's lock
        (60 ms for 1,000 nodes here, growing with the fleet), so it is kept to about
        1/CHECKPOINT_COST_FACTOR of the worker's time; incident updates do not wait for it
        (they are published between commit points)."""
        return max(flush_seconds, CHECKPOINT_COST_FACTOR * self.checkpoint_seconds)

    @classmethod
    def start(
        cls,
        partition: int,
        settings: Settings,
        sources: list[str],
        checkpoint: PartitionCheckpoint | None,
        drained: Callable[[str], float | None],
        sink: RecordSink,
        dead_letters: DeadLetterProducer,
        xid_overrides: tuple[XidOverride, ...] = (),
        inventory: tuple[str, ...] = (),
    ) -> PartitionWorker:
        """A fresh partition, or one continuing from ``checkpoint``; ``drained(source)`` tells the
        merge whether anything of that source is still waiting to be read. The partition writes
        into its own batch of ``sink`` and of ``dead_letters``. Partition 0 runs the fleet stage,
        which knows the fleet's ``inventory`` (nodes a restored stage knew already stay as they were)."""
        merger: EventTimeMerger[HeldLine] = EventTimeMerger(
            sources,
            idle_after=settings.worker_idle_seconds,
            clock=time.monotonic,
            drained=drained,
            optional=OPTIONAL_SOURCES,
        )
        if checkpoint is None:
            # The partition's core judges the nodes keyed to it; what needs the whole fleet is
            # the fleet stage's, which the owner of partition 0 runs.
            owner = NodeOwner(partition, settings.topic_partitions)
            core = DetectionCore(
                settings.core_config(), owns=owner, local_fleet=False, xid_overrides=xid_overrides
            )
        else:
            core = checkpoint.core
        pipeline = RecordPipeline(core, sink, dead_letters, settings.allowed_lateness_seconds, partition)
        if checkpoint is None:
            state = cls(partition, pipeline, merger)
        else:
            held_records = checkpoint.held
            if isinstance(held_records, HeldLines):  # a checkpoint made here, not decoded
                held_records = held_records.records()
            for held in held_records:
                merger.add(held[0], held[1], _restore_held(held))
            state = cls(partition, pipeline, merger, dict(checkpoint.offsets))
            horizon = core.fleet_horizon_ms
            state.checkpointed_horizon_ms = FROM_THE_START if horizon is None else horizon
            state.fleet, state.fleet_offset = checkpoint.fleet, checkpoint.fleet_offset
            # A checkpoint of format 3 written before copies carried their source has no record.
            state.copies = CopiesApplied(
                dict(getattr(checkpoint, "copies", None) or {}), getattr(checkpoint, "repeats", 0)
            )
        if partition == 0 and state.fleet is None:
            state.fleet = FleetCore(settings.core_config().fleet_config(), settings.topic_partitions)
        if state.fleet is not None:
            state.fleet.know_nodes(inventory, settings.cluster)
        return state

    @property
    def core(self) -> DetectionCore:
        """The partition's detection core (what its checkpoint saves)."""
        return self.pipeline.core

    def checkpoint(self) -> PartitionCheckpoint:
        """What a worker taking over this partition needs (only valid at a commit point)."""
        return PartitionCheckpoint(
            self.partition,
            dict(self.applied),
            self.core,
            HeldLines.of_merge(self.merger.held()),
            self.fleet,
            self.fleet_offset,
            dict(self.copies.highest),
            self.generation,
            self.copies.repeats,
        )

    def process_released(self) -> int:
        """Run every record the merge releases through the pipeline; return how many were late."""
        late = 0
        where = f"partition {self.partition}"
        apply = self.pipeline.apply
        apply_samples = self.pipeline.apply_samples
        released_any = False
        # Set again by _ready or by a sample's missing reference, if the next record must wait.
        self.waiting_for_fleet = False
        released = self.merger.release_runs(self._ready, _GO_UNASKED)
        for run in released:
            released_any = True
            waiting: int | None = None  # the index of the run's first record that must wait
            if type(run[0][0]) is EccSample:  # a run of the ECC partition's: samples only
                late_in_run, waiting = apply_samples([held[0] for held in run], where)
                late += late_in_run
            else:
                for index, held in enumerate(run):  # an asked record: it comes alone
                    try:
                        if apply(held[0], where) is not None:
                            late += 1
                    except FleetBaselineMissing:
                        waiting = index
                        break
            if waiting is not None:
                # A sample that needs its period's fleet reference (not asked beforehand: see
                # _ready); the core changed nothing for it, so it and the rest of its run wait at
                # the head of the merge.
                released.close()
                self.merger.hold_back(len(run) - waiting)
                self.waiting_for_fleet = True
                break
        if released_any:
            self.changed = True
        if not self.waiting_for_fleet:
            self.waiting_since, self.wait_reported = None, False
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()
        emitted = self.pipeline.drain()
        for incident in emitted.incidents:
            self.incidents[incident.incident_id] = incident
        if emitted.facts or emitted.job_parts or emitted.fleet_horizon_ms != self.fleet_horizon_ms:
            self.fleet_facts.extend(emitted.facts)
            self.fleet_jobs.extend(emitted.job_parts)
            self.fleet_horizon_ms = emitted.fleet_horizon_ms
            self.changed = True
        return late

    def _ready(self, ts_ms: int, held: HeldLine) -> bool:
        """Whether the record the merge would release next can go to the core: the core's
        watermark moves to it first (so its horizon does, for the fleet stage), then it waits,
        if it must, for the storm baseline of its period. ECC samples (nine records in ten) are
        not asked about (:data:`_GO_UNASKED`): asking whether one needs the fleet's ECC reference
        repeats the lookups its processing does, which raises instead when it does
        (:meth:`process_released`); nor is the watermark moved for it here: processing moves it
        first, raise or not."""
        record = held[0]
        core = self.core
        core.advance(ts_ms)
        ready = core.ready_for(record)
        self.waiting_for_fleet = not ready
        return ready

    def awaited(self) -> tuple[str, int, int] | None:
        """What the merge's next record waits for, if it waits for the fleet stage: (``"ECC
        reference"`` or ``"storm baseline"``, the period's start, the record's event time)."""
        head = self.merger.peek() if self.waiting_for_fleet else None
        if head is None:
            return None
        record, ts_ms = head[2][0], head[1]
        if type(record) is EccSample:
            return "ECC reference", self.core.ecc_reference_needed_ms(ts_ms), ts_ms
        return "storm baseline", self.core.baseline_needed_ms(ts_ms), ts_ms

    def decide_without_fleet(self) -> tuple[str, int, int] | None:
        """Let the record the merge waits with go without the fleet stage's decision it waits for:
        the period is taken as having none (no ECC reference: a GPU is compared with its own past
        only; a storm baseline of 0: a storm is judged on the GPU's own counts). The last resort of
        a wait that does not end (:meth:`awaited` says which; the caller says so, loudly): results
        may then differ from a replay's. A decision that comes later still counts for the records
        after it."""
        awaited = self.awaited()
        if awaited is not None:
            what, period_ms, _ = awaited
            if what == "ECC reference":
                self.learn_baselines({}, {period_ms: NO_ECC_REFERENCE})
            else:
                self.learn_baselines({period_ms: 0.0})
            self.waiting_for_fleet = False
        return awaited

    def learn_baselines(
        self, baselines: dict[int, float], ecc_references: dict[int, float] | None = None
    ) -> None:
        """Storm baselines and ECC references from the fleet stage."""
        self.core.learn_baselines(baselines, ecc_references)


def _restore_held(held: HeldRecord) -> HeldLine:
    """A held record of a checkpoint, decoded again from its line (format 4) or, from a format 3
    checkpoint, the record itself with its line made again."""
    source, _, payload = held[0], held[1], held[2]
    if isinstance(payload, bytes):
        try:
            return redecode_record(source, payload, held[3]), payload
        except ValueError as exc:  # only workers wrote it: the checkpoint is damaged
            raise CheckpointError(f"unreadable held record in a checkpoint ({exc})") from exc
    return payload, encode_record(payload)
