"""The per-record step both runtimes share (pure logic: an in-memory sink and dead-letter producer)."""

from __future__ import annotations

from detectors.core import CoreConfig, DetectionCore, Emitted
from schemas.outputs import DeadLetter
from schemas.records import EccSample, JobEvent, JobState, XidEvent
from stream.pipeline import RecordPipeline

MINUTE = 60_000
T0 = 1_704_067_200_000


class MemorySink:
    def __init__(self) -> None:
        self.items: list[tuple[int, object]] = []

    def add(self, item: object, partition: int = 0) -> None:
        self.items.append((partition, item))

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None:
        for group in (emitted.incidents, emitted.attributions, emitted.mttf, emitted.ecc_rows):
            self.items.extend((partition, item) for item in group)


class MemoryLetters:
    def __init__(self) -> None:
        self.letters: list[tuple[int, DeadLetter]] = []

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        self.letters.append((batch, letter))


def pipeline(batch: int = 0) -> tuple[RecordPipeline, MemorySink, MemoryLetters]:
    sink, letters = MemorySink(), MemoryLetters()
    return RecordPipeline(DetectionCore(CoreConfig()), sink, letters, 300, batch), sink, letters


def test_raw_records_are_stored_except_ecc_samples_which_the_core_downsamples() -> None:
    step, sink, _ = pipeline()
    xid = XidEvent(ts_ms=0, cluster="c", node="n1", xid=13)
    job = JobEvent(ts_ms=MINUTE, cluster="c", job_id="7", state=JobState.RUNNING, nodes=("n1",))
    ecc = EccSample(ts_ms=2 * MINUTE, cluster="c", node="n1", gpu=0, counters={"sbe_volatile": 1})
    for record in (xid, job, ecc):
        assert step.apply(record, "f.log") is None
    assert [item for _, item in sink.items] == [xid, job]
    step.drain()
    assert any(type(item).__name__ == "EccRow" for _, item in sink.items)


def test_a_late_record_becomes_a_dead_letter_in_the_sink_and_the_producer_of_its_batch() -> None:
    step, sink, letters = pipeline(batch=3)
    step.apply(XidEvent(ts_ms=60 * MINUTE, cluster="c", node="n1", xid=13), "xid/3")
    late = XidEvent(ts_ms=0, cluster="c", node="n1", xid=79, source="xid/3:offset 9")
    letter = step.apply(late, "xid/3")
    assert letter is not None and letter.reason.startswith("late event (")
    assert letter.record_kind == "xid" and letter.event_ms == 0
    assert (3, letter) in sink.items and letters.letters == [(3, letter)]
    assert not step.drain().incidents  # the late XID 79 opened nothing


def test_drain_moves_the_decisions_into_the_batch() -> None:
    step, sink, _ = pipeline(batch=1)
    step.apply(XidEvent(ts_ms=0, cluster="c", node="n1", xid=79, pci_bus_id="0000:07:00"), "k.log")
    emitted = step.drain()
    assert [incident.kind for incident in emitted.incidents] == ["gpu_bus"]
    assert (1, emitted.incidents[0]) in sink.items


def test_the_second_report_of_an_xid_is_not_stored() -> None:
    step, sink, _ = pipeline()
    logged = XidEvent(ts_ms=T0, cluster="c", node="n1", xid=79, pci_bus_id="0000:3b:00", message="fallen off")
    gauged = XidEvent(
        ts_ms=T0 + MINUTE, cluster="c", node="n1", xid=79, pci_bus_id="0000:3b:00", gpu=0, since_ms=0
    )
    assert step.apply(logged, "kern.log") is None
    assert step.apply(gauged, "dcgm.prom") is None  # accepted: no dead letter
    assert [item for _, item in sink.items] == [logged]
    # A later change of the gauge with no kernel line in its interval is an XID of its own.
    again = XidEvent(
        ts_ms=T0 + 9 * MINUTE,
        cluster="c",
        node="n1",
        xid=79,
        pci_bus_id="0000:3b:00",
        gpu=0,
        since_ms=T0 + 8 * MINUTE,
    )
    assert step.apply(again, "dcgm.prom") is None
    assert [item for _, item in sink.items] == [logged, again]
