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

from detectors.core import DetectionCore
from schemas.outputs import Incident
from schemas.records import Record
from stream.pipeline import RecordPipeline, RecordSink
from stream.settings import Settings
from stream.sinks.dead_letters import DeadLetterProducer
from stream.worker.checkpoints import PartitionCheckpoint
from stream.worker.merge import EventTimeMerger

__all__ = ["PartitionWorker"]


@dataclass(slots=True)
class PartitionWorker:
    """The state of one input partition: what its checkpoint holds, plus the uncommitted batch."""

    partition: int
    pipeline: RecordPipeline
    merger: EventTimeMerger[Record]
    #: Input topic -> offset of the last message applied (in the core, the merge or a dead letter).
    applied: dict[str, int] = field(default_factory=dict)
    #: Messages applied since the last commit point.
    uncommitted: int = 0
    incidents: dict[str, Incident] = field(default_factory=dict)
    #: Records went through the core since the last commit point (released from the merge at
    #: idle time, their messages may all be acked already: the checkpoint held them).
    changed: bool = False
    last_commit: float = field(default_factory=time.monotonic)
    #: When the incident updates of the partition were last published (at a commit point or sooner).
    last_publish: float = field(default_factory=time.monotonic)
    #: Whether the partition was behind a backlog when last looked at (it commits on catching up).
    behind: bool = False

    @classmethod
    def start(
        cls,
        partition: int,
        settings: Settings,
        sources: list[str],
        checkpoint: PartitionCheckpoint | None,
        drained: Callable[[str], bool],
        sink: RecordSink,
        dead_letters: DeadLetterProducer,
    ) -> PartitionWorker:
        """A fresh partition, or one continuing from ``checkpoint``; ``drained(source)`` tells the
        merge whether anything of that source is still waiting to be read. The partition writes
        into its own batch of ``sink`` and of ``dead_letters``."""
        merger: EventTimeMerger[Record] = EventTimeMerger(
            sources, idle_after=settings.worker_idle_seconds, clock=time.monotonic, drained=drained
        )
        core = DetectionCore(settings.core_config()) if checkpoint is None else checkpoint.core
        pipeline = RecordPipeline(core, sink, dead_letters, settings.allowed_lateness_seconds, partition)
        if checkpoint is None:
            return cls(partition, pipeline, merger)
        for source, ts_ms, record in checkpoint.held:
            merger.add(source, ts_ms, record)
        return cls(partition, pipeline, merger, dict(checkpoint.offsets))

    @property
    def core(self) -> DetectionCore:
        """The partition's detection core (what its checkpoint saves)."""
        return self.pipeline.core

    def checkpoint(self) -> PartitionCheckpoint:
        """What a worker taking over this partition needs (only valid at a commit point)."""
        return PartitionCheckpoint(self.partition, dict(self.applied), self.core, self.merger.held())

    def process_released(self) -> int:
        """Run every record the merge releases through the pipeline; return how many were late."""
        late = 0
        where = f"partition {self.partition}"
        for record in self.merger.release():
            self.changed = True
            if self.pipeline.apply(record, where) is not None:
                late += 1
        for incident in self.pipeline.drain().incidents:
            self.incidents[incident.incident_id] = incident
        return late
