"""A partition's held records survive its checkpoint: as lines (format 4) and as records (format 3)."""

from __future__ import annotations

import logging

import pytest

from detectors.fleet import FleetCore
from schemas.outputs import DeadLetter
from schemas.records import EccSample, XidEvent
from stream.kafka.codec import decode_message_lines, encode_record
from stream.pipeline import Emitted
from stream.settings import Settings
from stream.worker.checkpoints import PartitionCheckpoint, decode, encode
from stream.worker.fleet_wait import FleetWaitWatch
from stream.worker.partition import PartitionWorker

MINUTE = 60_000
T0 = 1_704_067_200_000  # 2024-01-01: record times must lie in 2000-2100


class Rows:
    """A sink and dead-letter producer that only counts (the partition logic is under test)."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def add(self, item: object, partition: int = 0) -> None:
        self.items.append(item)

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None:
        self.items.append(emitted)

    def produce(self, letter: DeadLetter, batch: int = 0) -> None:
        self.items.append(letter)


def ecc(minute: int, sbe: int) -> tuple[int, tuple[EccSample, bytes]]:
    """A held ECC sample of GPU 0 of node n1, ``minute`` minutes past T0, as the merge holds it."""
    sample = EccSample(
        ts_ms=T0 + minute * MINUTE, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00",
        counters={"sbe_volatile": sbe},
    )  # fmt: skip
    return sample.ts_ms, (sample, encode_record(sample))


def partition_past_90_minutes() -> PartitionWorker:
    """Partition 0 of one, its fleet stage elsewhere, whose job and xid sources have moved to 90
    minutes past T0: the ECC samples a test adds before then are released in their order."""
    rows = Rows()
    state = PartitionWorker.start(
        0, Settings(topic_partitions=1), ["ecc", "job", "xid"], None, lambda _: False, rows, rows
    )
    for source in ("job", "xid"):
        later = XidEvent(ts_ms=T0 + 90 * MINUTE, cluster="c", node="n2", xid=13, pci_bus_id="0000:07:00")
        state.merger.add(source, later.ts_ms, (later, encode_record(later)))
    return state


def start(checkpoint: PartitionCheckpoint | None) -> PartitionWorker:
    rows = Rows()
    return PartitionWorker.start(
        1, Settings(topic_partitions=2), ["ecc", "job", "xid"], checkpoint, lambda _: False, rows, rows
    )


def held_records(state: PartitionWorker) -> list[tuple[str, int, object]]:
    return [(source, ts_ms, record) for source, ts_ms, (record, _) in state.merger.held()]


def test_held_records_come_back_from_the_checkpoint_in_their_order() -> None:
    state = start(None)
    xids = b"\n".join(
        encode_record(
            XidEvent(ts_ms=T0 + m * MINUTE, cluster="c", node="n1", xid=79, pci_bus_id="0000:07:00")
        )
        for m in (5, 3, 3)
    )
    ecc = encode_record(
        EccSample(ts_ms=T0 + 4 * MINUTE, cluster="c", node="n1", gpu=2, counters={"dbe_volatile": 1})
    )
    for kind, value, offset in (("xid", xids, 7), ("ecc", ecc, 9)):
        for record, line in decode_message_lines(kind, value, f"t.{kind}/1", offset):
            assert not isinstance(record, Exception)
            state.merger.add(kind, record.ts_ms, (record, line))
    before = held_records(state)
    checkpoint = decode(encode(state.checkpoint()))
    assert all(isinstance(held[2], bytes) for held in checkpoint.held)  # lines, not pickled records
    restored = start(checkpoint)
    assert held_records(restored) == before
    assert [r.source for _, _, r in before][:2] == ["t.xid/1:offset 7 line 2", "t.xid/1:offset 7 line 3"]


def test_a_format_3_checkpoint_holding_records_is_restored() -> None:
    record = XidEvent(
        ts_ms=T0, cluster="c", node="n1", xid=13, pci_bus_id="0000:07:00", source="t/1:offset 2"
    )
    old = PartitionCheckpoint(1, {"t.xid": 2}, start(None).core, [("xid", T0, record)])
    restored = start(old)
    [(source, ts_ms, (again, line))] = restored.merger.held()
    assert (source, ts_ms, again) == ("xid", T0, record)
    assert line == encode_record(record)


def test_an_ecc_sample_that_needs_the_fleets_reference_waits_at_the_head_of_the_merge() -> None:
    """The worker processes ECC samples without asking first whether they need the fleet's ECC
    reference; the core raises, having changed nothing, and the sample goes back to the merge's
    head until the fleet stage's reference comes. It is then applied once."""
    state = partition_past_90_minutes()
    # A young GPU: two quiet samples, then corrected errors with no past of its own to compare with.
    state.merger.add_many("ecc", [ecc(0, 5), ecc(15, 5), ecc(30, 9), ecc(45, 9)])
    state.process_released()
    assert state.waiting_for_fleet
    assert [ts for _, ts, _ in state.merger.held()][:2] == [T0 + 30 * MINUTE, T0 + 45 * MINUTE]
    assert not [f for f in state.fleet_facts if f.kind == "ecc_sbe"]

    state.learn_baselines({}, {state.core.ecc_reference_needed_ms(T0 + 30 * MINUTE): 4.0})
    state.process_released()
    assert [(f.ts_ms, f.value) for f in state.fleet_facts if f.kind == "ecc_sbe"] == [(T0 + 30 * MINUTE, 4)]
    assert T0 + 45 * MINUTE not in [ts for _, ts, _ in state.merger.held()]


def test_a_record_waiting_for_the_fleet_hands_its_horizon_over_at_once() -> None:
    """An ECC sample at an hour's start that needs that hour's fleet reference pins the partition's
    horizon the lateness and the attribution window before it: still the previous hour, so no
    period is crossed, yet it is the horizon the stage needs to decide the reference. The
    partition hands it over then (not at the next commit point), once."""
    state = partition_past_90_minutes()
    state.merger.add_many("ecc", [ecc(0, 5), ecc(15, 5), ecc(30, 5), ecc(45, 5)])
    state.process_released()
    assert not state.waiting_for_fleet
    state.handed_horizon_ms = state.fleet_horizon_ms  # a commit point handed it over
    assert not state.hand_over_due()

    state.merger.add_many("ecc", [ecc(60, 9)])  # corrected errors, no past of its own to judge by
    state.process_released()
    assert state.waiting_for_fleet
    hour = state.core.config.ecc_period_ms
    assert state.fleet_horizon_ms is not None and state.handed_horizon_ms is not None
    assert state.fleet_horizon_ms // hour == state.handed_horizon_ms // hour  # no period crossed
    assert state.fleet_horizon_ms > state.handed_horizon_ms
    assert state.hand_over_due()

    state.handed_horizon_ms = state.fleet_horizon_ms  # handed over; the sample still waits
    state.process_released()
    assert state.waiting_for_fleet and not state.hand_over_due()


def test_a_wait_for_the_fleet_is_reported_and_let_go_only_when_the_stage_decides_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Liveness: a record whose fleet decision does not come (the stage's worker gone, say) is
    reported after a quarter of the limit and let go at the limit, said loudly; but not while the
    stage keeps deciding (it is slow, not stuck)."""
    state = partition_past_90_minutes()
    state.merger.add_many("ecc", [ecc(0, 5), ecc(15, 5), ecc(30, 9), ecc(45, 9)])
    state.process_released()
    assert state.waiting_for_fleet and state.waiting_since is not None
    assert state.awaited() == ("ECC reference", T0, T0 + 30 * MINUTE)
    watch = FleetWaitWatch(limit_seconds=100.0)
    start = state.waiting_since
    watch.last_decision = start
    with caplog.at_level(logging.WARNING, "faultstream.worker"):
        assert not watch.check(state, None, start + 10)
        assert not caplog.records
        assert not watch.check(state, None, start + 30)  # a quarter: reported, once
        assert not watch.check(state, None, start + 40)
        [warning] = caplog.records
        assert "has waited 30 s for the fleet stage's ECC reference" in warning.getMessage()
        assert "owns input partition 0" in warning.getMessage()
        watch.last_decision = start + 50  # the stage decided something meanwhile: slow, not stuck
        assert not watch.check(state, None, start + 120)
        assert watch.check(state, None, start + 151)
        assert caplog.records[-1].levelname == "ERROR"
        assert "goes without it" in caplog.records[-1].getMessage()
    assert state.decide_without_fleet() == ("ECC reference", T0, T0 + 30 * MINUTE)
    state.process_released()
    assert not state.waiting_for_fleet and state.waiting_since is None
    assert T0 + 30 * MINUTE not in [ts for _, ts, _ in state.merger.held()]


def test_a_wait_is_never_let_go_with_no_limit() -> None:
    state = partition_past_90_minutes()
    state.merger.add_many("ecc", [ecc(0, 5), ecc(15, 5), ecc(30, 9)])
    state.process_released()
    assert state.waiting_since is not None
    assert not FleetWaitWatch(limit_seconds=0).check(state, None, state.waiting_since + 10**6)


def test_the_stage_names_the_partitions_it_waits_for() -> None:
    fleet = FleetCore(Settings(topic_partitions=3).core_config().fleet_config(), partitions=3)
    assert fleet.holding_back() == [0, 1, 2]
    fleet.advance(0, T0)
    fleet.advance(2, T0 + MINUTE)
    assert fleet.holding_back() == [1]  # not heard of
    fleet.advance(1, T0 - MINUTE)
    assert fleet.holding_back() == [1]  # the lowest horizon
    fleet.idle(1)
    assert fleet.holding_back() == [0]
