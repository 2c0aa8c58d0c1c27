"""The per-record step of the pipeline, the one both runtimes call.

The embedded replay (:mod:`stream.replay`) and the Kafka worker (:mod:`stream.worker`) differ in
where records come from and when work is committed; what happens to a record in between is the
same, and lives here:

1. the detection core processes it (:meth:`detectors.core.DetectionCore.process`);
2. the raw record is added to the sink's batch — except ECC samples, which are stored
   downsampled from the rows the core emits, and the second report of an XID already taken
   (:meth:`detectors.core.DetectionCore.repeats`);
3. a record the core refuses as late (older than its watermark) becomes a dead letter instead,
   in the sink's batch and in the runtime's :class:`~stream.sinks.dead_letters.DeadLetterProducer`;
4. :meth:`RecordPipeline.drain` moves what the core decided (incidents, attributions, MTTF
   partials, ECC rows) into the same batch.

Dead letters of records that could not be parsed are made before this step, by whoever parsed
them (:func:`stream.sinks.dead_letters.to_dead_letter`); late ones are made here, by
:func:`late_dead_letter`, so a late record reads the same in both runtimes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import orjson

from detectors.core import DetectionCore, Emitted
from schemas.outputs import DeadLetter
from schemas.records import RECORD_KIND, EccSample, Record
from schemas.timeutil import format_ts
from stream.sinks.dead_letters import DeadLetterProducer

__all__ = ["RecordPipeline", "RecordSink", "late_dead_letter", "store_dead_letter"]


class RecordSink(Protocol):
    """What the pipeline writes to: the ClickHouse sink's per-batch ``add`` (quix-streams' shape)."""

    def add(self, item: object, partition: int = 0) -> None: ...

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None: ...


def store_dead_letter(
    sink: RecordSink, dead_letters: DeadLetterProducer, letter: DeadLetter, batch: int
) -> None:
    """A dead letter goes to the sink's batch (the ``dead_letters`` table) and to the producer's."""
    sink.add(letter, batch)
    dead_letters.produce(letter, batch)


def late_dead_letter(record: Record, watermark_ms: int, source: str, lateness_s: int) -> DeadLetter:
    """The dead letter of a record that came later than the allowed lateness.

    Its raw form is the record's JSON line: fix the clock, then replay it as JSON Lines.

    Examples
    --------
    >>> from schemas.records import XidEvent
    >>> late = XidEvent(ts_ms=0, cluster="c", node="n1", xid=79, source="kern.log:12")
    >>> letter = late_dead_letter(late, 600_000, "kern.log", 300)
    >>> letter.location, letter.record_kind, letter.reason.split(" (")[0]
    ('line 12', 'xid', 'late event')
    """
    reason = (
        f"late event (event time {format_ts(record.ts_ms)} is older than the watermark "
        f"{format_ts(watermark_ms)}; allowed lateness {lateness_s}s)"
    )
    line = record.source.rpartition(":")[2]
    location = f"line {line}" if line.isdigit() else record.source
    return DeadLetter(
        source, location, reason, orjson.dumps(record.to_dict()), RECORD_KIND[type(record)], record.ts_ms
    )


class RecordPipeline:
    """One detection core writing into one batch of a sink.

    Parameters
    ----------
    core
        The detection core (its state is what a checkpoint saves).
    sink
        Where rows go; ``batch`` selects the batch (a worker's input partition; 0 in a replay).
    dead_letters
        Where late records' dead letters go besides the sink.
    lateness_s
        The allowed lateness, named in a late record's reason.
    batch
        The sink batch (and dead-letter batch) of this pipeline.
    """

    __slots__ = ("batch", "core", "dead_letters", "lateness_s", "sink")

    def __init__(
        self,
        core: DetectionCore,
        sink: RecordSink,
        dead_letters: DeadLetterProducer,
        lateness_s: int,
        batch: int = 0,
    ) -> None:
        self.core = core
        self.sink = sink
        self.dead_letters = dead_letters
        self.lateness_s = lateness_s
        self.batch = batch

    def apply(self, record: Record, source: str) -> DeadLetter | None:
        """Run one record through the core into the batch; return its dead letter if it was late.

        ``source`` names where the record came from (a file, a topic partition), for the letter.
        """
        if isinstance(record, EccSample):  # stored downsampled, from the rows the core emits
            if self.core.process_ecc(record):
                return None
        else:
            # The second report of one XID (kernel line, DCGM gauge) is not an event of its own.
            repeat = self.core.repeats(record)
            if self.core.process(record):
                if not repeat:
                    self.sink.add(record, self.batch)
                return None
        return self.reject_late(record, self.core.watermark_ms or 0, source)

    def apply_samples(self, samples: Sequence[EccSample], source: str) -> tuple[int, int | None]:
        """:meth:`apply` for each of ``samples`` in turn (the core's
        :meth:`~DetectionCore.process_ecc_run`): how many were late (dead-lettered), and the index
        of the first one that waits for a fleet reference, or None (it and the ones after it were
        not applied: the caller holds them)."""
        late, waiting = self.core.process_ecc_run(samples)
        for index in late:
            self.reject_late(samples[index], self.core.watermark_ms or 0, source)
        return len(late), waiting

    def reject_late(self, record: Record, watermark_ms: int, source: str) -> DeadLetter:
        """Dead-letter a record that came after ``watermark_ms`` had passed it."""
        letter = late_dead_letter(record, watermark_ms, source, self.lateness_s)
        self.reject(letter)
        return letter

    def reject(self, letter: DeadLetter) -> None:
        """Store the dead letter of a record that could not be read."""
        store_dead_letter(self.sink, self.dead_letters, letter, self.batch)

    def drain(self) -> Emitted:
        """Move what the core decided since the last call into the batch, and return it."""
        emitted = self.core.drain()
        self.sink.add_emitted(emitted, self.batch)
        return emitted

    def finish(self) -> Emitted:
        """End of input (a replay's last file): decide everything pending, into the batch."""
        emitted = self.core.finish()
        self.sink.add_emitted(emitted, self.batch)
        return emitted
