"""The worker's stall handling, on a fake Faust consumer (pure logic: no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.types import TP

import stream.worker.runtime as runtime_module
from stream.settings import Settings
from stream.worker.checkpoints import CheckpointError
from stream.worker.metrics import WorkerMetrics
from stream.worker.partition import PartitionWorker
from stream.worker.runtime import STALL_SECONDS, WorkerRuntime, WorkerStalled, WorkerTopics

ECC = TP("t.ecc", 0)


class FakeConsumer:
    def __init__(self) -> None:
        self._active_partitions = {ECC}
        self._buffered_partitions: set[Any] = set()
        self._paused_partitions: set[Any] = set()
        self._committed_offset = {ECC: 100}
        self._read_offset = {ECC: 99}
        self.flow_active = True
        self.log_start = 0
        self.seeks: list[tuple[Any, int]] = []

    def assignment(self) -> set[Any]:
        return {ECC}

    async def highwaters(self, *tps: Any) -> dict[Any, int]:
        return {tp: 500 for tp in tps}

    async def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def earliest_offsets(self, *tps: Any) -> dict[Any, int]:
        return {tp: self.log_start for tp in tps}


class FakeBroker:
    """The runtime's own broker queries, answered by the fake consumer's highwaters."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer

    async def end_offsets(self, partitions: Any) -> dict[Any, int]:
        return await self.consumer.highwaters(*partitions)


class FakeApp:
    rebalancing = False

    def __init__(self) -> None:
        self.consumer = FakeConsumer()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(runtime_module.time, "monotonic", lambda: now[0])
    return now


def make_runtime() -> tuple[WorkerRuntime, FakeApp]:
    app = FakeApp()
    topics = WorkerTopics(kinds={"t.ecc": "ecc"}, rekeyed=(), incidents=None, dead_letters=None)
    settings = Settings.from_env(kafka_bootstrap="127.0.0.1:1")
    runtime = WorkerRuntime(app, settings, topics, sink=None, metrics=WorkerMetrics())  # type: ignore[arg-type]
    runtime.broker = FakeBroker(app.consumer)  # type: ignore[assignment]
    return runtime, app


def look(runtime: WorkerRuntime, clock: list[float]) -> None:
    """One stall check, a stall period after the previous one: the end offsets are fetched
    (without the lock), then compared (under it)."""
    clock[0] += STALL_SECONDS

    async def check() -> None:
        await runtime._fetch_stall_ends()
        await runtime._watch_for_stalls()

    asyncio.run(check())


def test_a_silent_partition_is_put_back_and_read_again_then_the_worker_stops(clock: list[float]) -> None:
    runtime, app = make_runtime()
    app.consumer._active_partitions.discard(ECC)  # what Faust's lost pressure-drop callback leaves
    look(runtime, clock)  # the first look starts the partition's clock
    assert app.consumer.seeks == []
    look(runtime, clock)
    assert app.consumer.seeks == [(ECC, 100)]  # from the committed offset: nothing applied yet
    assert ECC in app.consumer._active_partitions
    with pytest.raises(
        WorkerStalled, match=r"t\.ecc/0 stalled: nothing delivered from offset 100 \(end 500\)"
    ):
        look(runtime, clock)


def test_a_delivery_in_between_clears_the_stall(clock: list[float]) -> None:
    runtime, app = make_runtime()

    class Message:
        tp, topic, offset = ECC, "t.ecc", 100

    look(runtime, clock)
    look(runtime, clock)
    assert asyncio.run(runtime._next_in_line(Message()))  # the re-read brought offset 100
    look(runtime, clock)  # silent again: read again, not stopped
    assert app.consumer.seeks == [(ECC, 100), (ECC, 101)]


def test_nothing_happens_while_clickhouse_flushes_fail(clock: list[float]) -> None:
    runtime, app = make_runtime()
    look(runtime, clock)
    runtime.commit_point.last_flush_failure = clock[0] + STALL_SECONDS - 1  # the agent is held by the retries
    look(runtime, clock)
    assert app.consumer.seeks == []


def test_a_partition_behind_a_queued_backlog_is_not_stalled(clock: list[float]) -> None:
    runtime, app = make_runtime()
    queued = [4000]  # the agent's queue: the partition's next message may wait behind these
    runtime.input_backlog = lambda: queued[0]
    for _ in range(4):  # far longer than a stall and its re-read
        look(runtime, clock)
    assert app.consumer.seeks == []
    queued[0] = 0  # caught up, and still nothing from the partition: now its silence counts
    look(runtime, clock)
    look(runtime, clock)
    assert app.consumer.seeks == [(ECC, 100)]


def test_offsets_the_broker_deleted_are_counted_as_lost_and_reading_goes_on(clock: list[float]) -> None:
    runtime, app = make_runtime()
    app.consumer.log_start = 300  # age or size retention deleted offsets 100..299
    look(runtime, clock)
    look(runtime, clock)
    assert app.consumer.seeks == [(ECC, 300)]
    assert runtime.metrics.input_lost.labels("t.ecc")._value.get() == 200
    assert runtime.positions.next_offset(ECC) == 300


class FakeCheckpoints:
    """Checkpoints by partition: held records or none, and whether its core has decisions pending;
    counts the reads."""

    def __init__(self, held: dict[int, list[Any]], pending: frozenset[int] = frozenset()) -> None:
        self.held = held
        self.pending = pending
        self.loads: list[int] = []

    async def load(self, partition: int) -> Any:
        self.loads.append(partition)
        if partition not in self.held:
            return None

        class Core:
            has_pending_decisions = partition in self.pending

        class Checkpoint:
            held = self.held[partition]
            core = Core()

        return Checkpoint(), 100


def test_an_assigned_partition_whose_checkpoint_holds_records_is_restored_without_a_message() -> None:
    runtime, app = make_runtime()
    held, empty, fresh, pending = TP("t.ecc", 1), TP("t.ecc", 2), TP("t.ecc", 3), TP("t.ecc", 4)
    app.consumer.assignment = lambda: {ECC, held, empty, fresh, pending}  # type: ignore[method-assign]
    checkpoints = FakeCheckpoints({1: [("ecc", 5, "record")], 2: [], 4: []}, pending=frozenset({4}))
    runtime.checkpoints = checkpoints  # type: ignore[assignment]
    runtime.checkpoints_started = True
    restored: list[int] = []

    async def partition_state(number: int) -> Any:
        restored.append(number)
        runtime.partitions[number] = object()  # type: ignore[assignment]
        return runtime.partitions[number]

    runtime._partition_state = partition_state  # type: ignore[method-assign]
    runtime.partitions[0] = object()  # type: ignore[assignment]  # ECC delivered: it has its state
    asyncio.run(runtime._restore_held())
    # The one holding records and the one with decisions pending (its idle message must say so):
    # the others are restored by their first message, as before.
    assert restored == [1, 4]
    assert checkpoints.loads == [1, 2, 3, 4]
    asyncio.run(runtime._restore_held())
    assert checkpoints.loads == [1, 2, 3, 4], "each checkpoint is read once per assignment"
    runtime.forget({empty})
    asyncio.run(runtime._restore_held())
    assert checkpoints.loads == [1, 2, 3, 4, 2]  # assigned again: read again


class Message:
    def __init__(self, tp: Any, generation: int) -> None:
        self.tp = tp
        self.topic = tp.topic
        self.partition = tp.partition
        self.generation_id = generation


class CountingConsumer(FakeConsumer):
    """A consumer whose assignment can change, counting how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: set[Any] = {ECC}
        self.asked = 0
        self.highwater_of: dict[Any, int] = {ECC: 500}
        self.highwater_asked = 0

    def assignment(self) -> set[Any]:
        self.asked += 1
        return set(self.assigned)

    def highwater(self, tp: Any) -> int:
        self.highwater_asked += 1
        return self.highwater_of[tp]


def counting_runtime() -> tuple[WorkerRuntime, FakeApp, CountingConsumer]:
    runtime, app = make_runtime()
    consumer = app.consumer = CountingConsumer()
    app.consumer_generation_id = 3  # type: ignore[attr-defined]
    runtime.note_assigned()  # a worker is handed messages once the group has assigned it partitions
    return runtime, app, consumer


def test_the_assignment_is_asked_once_a_generation_and_again_after_a_revocation() -> None:
    runtime, app, consumer = counting_runtime()
    other = TP("t.ecc", 1)
    assert [runtime._stale(Message(ECC, 3)) for _ in range(5)] == [False] * 5
    assert runtime._stale(Message(other, 3)) is True
    assert consumer.asked == 1
    assert runtime._stale(Message(ECC, 2)) is True  # fetched in an older generation
    # A rebalance takes partition 0 away and gives 1: the revocation forgets the assignment.
    runtime.forget({ECC})
    consumer.assigned = {other}
    app.consumer_generation_id = 4  # type: ignore[attr-defined]
    runtime.note_assigned()
    assert runtime._stale(Message(ECC, 4)) is True
    assert runtime._stale(Message(other, 4)) is False
    assert consumer.asked == 2


def test_while_rebalancing_the_assignment_is_asked_each_time_and_not_kept() -> None:
    runtime, app, consumer = counting_runtime()
    app.rebalancing = True
    assert runtime._stale(Message(ECC, 3)) is False
    consumer.assigned = set()
    assert runtime._stale(Message(ECC, 3)) is True
    app.rebalancing = False
    consumer.assigned = {ECC}
    assert runtime._stale(Message(ECC, 3)) is False
    assert consumer.asked == 3


def test_a_backlog_is_judged_from_a_highwater_at_most_ten_milliseconds_old(clock: list[float]) -> None:
    runtime, _app, consumer = counting_runtime()
    state = type("State", (), {"partition": 0, "applied": {"t.ecc": 99}, "records_a_message": {}})()
    assert runtime._backlog(state) == (400, 400)  # type: ignore[arg-type]
    consumer.highwater_of[ECC] = 600
    clock[0] += 0.005
    assert runtime._backlog(state) == (400, 400)  # type: ignore[arg-type]
    clock[0] += 0.01
    assert runtime._backlog(state) == (500, 500)  # type: ignore[arg-type]
    assert consumer.highwater_asked == 2
    # Anything asking for the highwater itself gets it fresh, and refreshes what the backlog uses.
    consumer.highwater_of[ECC] = 700
    assert runtime._highwater(ECC) == 700
    assert runtime._backlog(state) == (600, 600)  # type: ignore[arg-type]


def test_a_backlog_in_records_counts_a_topics_large_messages_not_its_last_short_one(
    clock: list[float],
) -> None:
    runtime, _app, _consumer = counting_runtime()
    state = type("State", (), {"partition": 0, "applied": {"t.ecc": 99}, "records_a_message": {}})()
    for records in (256, 256, 7):  # a batch's short tail last
        PartitionWorker.note_message_size(state, ECC.topic, records)  # type: ignore[arg-type]
    assert runtime._backlog(state) == (400, 400 * 256 * 0.98)  # type: ignore[arg-type]
    for _ in range(200):  # a producer sending small messages from now on is believed, gradually
        PartitionWorker.note_message_size(state, ECC.topic, 1)  # type: ignore[arg-type]
    messages, records = runtime._backlog(state)  # type: ignore[arg-type]
    assert messages == 400 and records == pytest.approx(400 * 256 * 0.98**201)  # ~4 a message


class NothingHeld:
    def held_count(self, source: str) -> int:
        return 0


class ReleasedPartition:
    """What ``WorkerRuntime._release`` reads of a partition, with nothing released."""

    partition = 0
    merger = NothingHeld()
    uncommitted = 10
    changed = False
    behind = False
    checkpoint_seconds = 0.0

    def __init__(self, last_commit: float) -> None:
        self.last_commit = last_commit
        self.incidents: list[Any] = []

    def process_released(self) -> int:
        return 0

    def hand_over_due(self) -> bool:
        return False

    def commit_interval(self, flush_seconds: float) -> float:
        return flush_seconds


def released_runtime(clock: list[float]) -> tuple[WorkerRuntime, list[float], list[tuple[int, float]]]:
    """A runtime whose commit points are recorded (times) and whose backlog is set by the test."""
    runtime, _ = make_runtime()
    runtime.sink = type("Sink", (), {"should_flush": lambda self, partition: False})()  # type: ignore[assignment]
    commits: list[float] = []

    async def commit(state: Any) -> None:
        commits.append(clock[0])
        state.last_commit = clock[0]

    runtime.commit = commit  # type: ignore[method-assign]
    lag = [(0, 0.0)]
    runtime._backlog = lambda _state: lag[0]  # type: ignore[method-assign]
    return runtime, commits, lag


@pytest.mark.parametrize(("backlog_records", "committed_at_its_end"), [(5_000, False), (60_000, True)])
def test_only_a_backlog_worth_catching_up_commits_as_soon_as_it_ends(
    clock: list[float], backlog_records: int, committed_at_its_end: bool
) -> None:
    """A live stream's passing lag (5,000 records: a quarter of a second at 20,000 records/s)
    waits for the flush interval; the end of a real backlog (a restart, history replayed) is a
    commit point at once. Each end of a passing lag was one before: 1.8 checkpoints a second."""
    runtime, commits, lag = released_runtime(clock)
    state = runtime.partitions[0] = ReleasedPartition(last_commit=clock[0])  # type: ignore[assignment]
    lag[0] = (backlog_records // 100, float(backlog_records))
    asyncio.run(runtime._release(state))  # type: ignore[arg-type]
    clock[0] += 0.3
    lag[0] = (0, 0.0)
    asyncio.run(runtime._release(state))  # type: ignore[arg-type]
    assert commits == ([clock[0]] if committed_at_its_end else [])
    clock[0] += 0.3
    asyncio.run(runtime._release(state))  # type: ignore[arg-type]
    assert len(commits) == int(committed_at_its_end)  # caught up once, not again
    clock[0] += runtime.settings.worker_flush_seconds
    asyncio.run(runtime._release(state))  # type: ignore[arg-type]
    assert len(commits) == 1 + int(committed_at_its_end)  # the flush interval's, either way


def test_a_backlog_commits_at_its_end_after_commit_points_on_the_way(clock: list[float]) -> None:
    """A backlog's commit points on the way (here the flush interval's, with 10,000 records still
    to go) do not make its end wait for the next interval: the mark stays until the end (a commit
    point cleared it once, and the last 20,000 records of every replay waited up to 2 s)."""
    runtime, commits, lag = released_runtime(clock)
    state = runtime.partitions[0] = ReleasedPartition(last_commit=clock[0])  # type: ignore[assignment]
    flush = runtime.settings.worker_flush_seconds
    start = clock[0]
    for after, records in (
        (0.7 * flush, 60_000),
        (1.4 * flush, 10_000),
        (1.5 * flush, 5_000),
        (1.6 * flush, 0),
    ):
        clock[0] = start + after
        lag[0] = (records // 100, float(records))
        asyncio.run(runtime._release(state))  # type: ignore[arg-type]
    # The flush interval's, 10,000 records before the end (under the catching-up mark: it stays);
    # then the end's at once, 0.2 intervals on.
    assert commits == [start + 1.4 * flush, start + 1.6 * flush]


def test_a_drained_answer_covers_what_was_published_a_skew_before_it_was_asked(clock: list[float]) -> None:
    """Records of different partitions become readable a few milliseconds out of the order they
    were sent in: a record that arrived just before the broker was asked may have overtaken a
    jobs record sent before it, so only records that arrived the skew before the answer pass."""
    from stream.worker.merge import PUBLISH_SKEW_SECONDS, EventTimeMerger

    runtime, app, consumer = counting_runtime()
    consumer.topic_partitions = lambda topic: 1  # type: ignore[attr-defined]
    consumer.highwater_of[ECC] = 100  # read to its end

    class Broker(FakeBroker):
        async def committed(self, group: str, partitions: Any) -> dict[Any, int]:
            return {tp: 7 for tp in partitions}  # every jobs message re-keyed

        async def end_offsets(self, partitions: Any) -> dict[Any, int]:
            return {tp: 7 if tp.topic == "t.jobs" else 100 for tp in partitions}

    runtime.broker = Broker(app.consumer)  # type: ignore[assignment]
    runtime.partitions[0] = type("State", (), {"applied": {"t.ecc": 99}})()  # type: ignore[assignment]
    merger = EventTimeMerger(["ecc", "xid"], idle_after=0.25, clock=lambda: clock[0],
                             drained=lambda source: runtime._source_drained(0, source))  # fmt: skip
    merger.add("xid", 10, "xid at 10")
    merger.add("ecc", 20, "early")  # arrives, then xid falls silent
    clock[0] += 0.5
    merger.add("ecc", 30, "just before the answer")
    clock[0] += PUBLISH_SKEW_SECONDS / 5
    runtime._topic_of["xid"] = "t.ecc"  # xid read to its end (the fake has one input topic)
    asyncio.run(runtime._refresh_progress())
    clock[0] += 0.01
    assert list(merger.release()) == ["xid at 10", "early"]  # "just before" waits for a later answer
    clock[0] += 0.2
    asyncio.run(runtime._refresh_progress())
    assert list(merger.release()) == ["just before the answer"]


class SlowCheckpointStart:
    """A checkpoint topic whose connection takes a moment, and fails if told to."""

    def __init__(self, error: Exception | None = None) -> None:
        self.starts = 0
        self.stops = 0
        self.error = error

    async def start(self, partitions: int) -> None:
        self.starts += 1
        await asyncio.sleep(0.01)
        if self.error is not None:
            raise self.error

    async def stop(self) -> None:
        self.stops += 1


def test_the_checkpoint_topic_is_connected_once_for_every_caller_and_its_failure_reaches_each() -> None:
    runtime, _ = make_runtime()
    runtime.checkpoints = SlowCheckpointStart()  # type: ignore[assignment]

    async def three_callers() -> None:
        # The app's start task and two partitions' first messages, at once.
        await asyncio.gather(*(runtime.connect_checkpoints() for _ in range(3)))
        await runtime.connect_checkpoints()

    asyncio.run(three_callers())
    assert runtime.checkpoints.starts == 1 and runtime.checkpoints_started  # type: ignore[attr-defined]

    failing, _ = make_runtime()
    failing.checkpoints = SlowCheckpointStart(CheckpointError("no such topic"))  # type: ignore[assignment]

    async def two_callers() -> list[BaseException | None]:
        return await asyncio.gather(
            failing.connect_checkpoints(), failing.connect_checkpoints(), return_exceptions=True
        )

    errors = asyncio.run(two_callers())
    assert [str(e) for e in errors] == ["no such topic", "no such topic"]
    assert failing.checkpoints.starts == 1 and not failing.checkpoints_started  # type: ignore[attr-defined]


def test_a_revocation_during_a_round_leaves_the_partitions_it_dropped_alone(clock: list[float]) -> None:
    """The tick goes through the states it took at its start, and a commit point awaits the broker:
    a revocation meanwhile (Faust calls ``forget``) drops the states the round has still to visit.
    Such a state is left as it was. Its partition is no longer this worker's, so its merge would
    take every source for drained and release what it holds back for sources with more to read,
    into rows (`running` MTTF rows of a job whose end is not read yet) in the sink batch the drop
    discarded, which the partition's next state on this worker writes."""
    from schemas.records import JobEvent, JobState, XidEvent
    from stream.sinks.clickhouse import ClickHouseSink

    runtime, _app, consumer = counting_runtime()
    runtime.topics = WorkerTopics(
        kinds={"t.xid": "xid", "t.jobs-by-node": "job"}, rekeyed=(), incidents=None, dead_letters=None
    )
    runtime._sources = ["job", "xid"]
    runtime._topic_of = {"xid": "t.xid", "job": "t.jobs-by-node"}
    runtime.settings = Settings.from_env(kafka_bootstrap="127.0.0.1:1", worker_idle_seconds=0.0)

    def never_connected() -> Any:
        raise AssertionError("nothing is flushed here")

    runtime.sink = ClickHouseSink(None, "faultstream", connect=never_connected)
    tps = {TP(topic, number) for topic in runtime.topics.kinds for number in (1, 2)}
    consumer.assigned = tps
    consumer.highwater_of = dict.fromkeys(tps, 10)  # each partition has more to read
    states = {}
    for number in (1, 2):  # the round visits 1, then 2
        states[number] = runtime.partitions[number] = PartitionWorker.start(
            number, runtime.settings, runtime._sources, None,
            lambda source, number=number: runtime._source_drained(number, source),
            runtime.sink, runtime.dead_letters,
        )  # fmt: skip
    hour = 3_600_000
    run = JobEvent(ts_ms=0, cluster="c", job_id="7", state=JobState.RUNNING, nodes=("n2",), start_ms=0)
    later = [XidEvent(ts_ms=h * hour, cluster="c", node="n2", xid=13, gpu="0000:01:00") for h in (2, 4)]
    dropped = states[2]
    dropped.merger.add("job", run.ts_ms, (run, b""))
    for xid in later:
        dropped.merger.add("xid", xid.ts_ms, (xid, b""))
    dropped.applied = {"t.jobs-by-node": 0, "t.xid": 1}
    revoke = [False]

    async def commit(state: Any) -> None:
        if revoke[0] and state.partition == 1:
            runtime.forget(tps)  # the revocation, while the commit point awaits the broker
        state.uncommitted, state.changed, state.last_commit = 0, False, clock[0]

    runtime.commit = commit  # type: ignore[method-assign]
    states[1].uncommitted = 1
    asyncio.run(runtime.tick())
    # The jobs copies have more to read: the XIDs after the job's start wait for them.
    assert len(dropped.merger) == 2 and dropped.core.max_event_ms == 0
    written = runtime.sink.pending_rows(2)

    states[1].uncommitted, states[1].last_commit = 1, 0.0  # its next commit point is due
    revoke[0] = True
    asyncio.run(runtime.tick())
    assert runtime.partitions == {}
    assert runtime.sink.pending_rows(2) == 0 < written  # discarded by the drop, and nothing since
    assert len(dropped.merger) == 2 and dropped.core.max_event_ms == 0  # the dropped state is left as it was


def test_a_restore_under_the_same_catalog_overrides_changes_nothing_whatever_their_order() -> None:
    """The catalog file may list its codes in any order; the core keeps them by code."""
    from detectors.core import CoreConfig, DetectionCore
    from detectors.xid_catalog import XidOverride
    from schemas.outputs import Severity
    from stream.worker.checkpoints import PartitionCheckpoint
    from stream.worker.partition import adopt_configuration

    overrides = (
        XidOverride(code=79, severity=Severity.WARN),
        XidOverride(code=13, severity=Severity.CRITICAL),
    )
    checkpoint = PartitionCheckpoint(0, {}, DetectionCore(CoreConfig(), xid_overrides=overrides))
    assert adopt_configuration(0, checkpoint, CoreConfig(), overrides) == []
    changed = adopt_configuration(0, checkpoint, CoreConfig(), overrides[:1])
    assert changed == ["XID catalog overrides: codes 13, 79 -> 79"]


class Delivered:
    """A Faust event of one input message: ``message`` and ``value``."""

    def __init__(self, tp: Any, offset: int, generation: int, value: bytes) -> None:
        self.value = value
        self.message = type(
            "Message",
            (),
            {
                "tp": tp, "topic": tp.topic, "partition": tp.partition, "offset": offset,
                "generation_id": generation, "headers": (), "timestamp": None,
            },
        )()  # fmt: skip


COPIES = TP("t.jobs-by-node", 2)


def job_line(number: int) -> bytes:
    """A job copy's line, a minute after the previous job's."""
    return (
        f'{{"ts": {1704067200000 + number * 60_000}, "cluster": "c", "job_id": "{number}", '
        f'"state": "RUNNING", "nodes": ["n2"]}}'
    ).encode()


def copies_runtime() -> tuple[WorkerRuntime, FakeApp]:
    """A runtime applying one partition of job copies, in generation 3, whose commit points do
    nothing; the partition has no checkpoint."""
    from stream.sinks.clickhouse import ClickHouseSink

    runtime, app, consumer = counting_runtime()
    runtime.topics = WorkerTopics(kinds={COPIES.topic: "job"}, rekeyed=(), incidents=None, dead_letters=None)
    runtime._sources = ["job"]
    runtime._topic_of = {"job": COPIES.topic}

    def never_connected() -> Any:
        raise AssertionError("nothing is flushed here")

    runtime.sink = ClickHouseSink(None, "faultstream", connect=never_connected)
    runtime.checkpoints = FakeCheckpoints({})  # type: ignore[assignment]
    runtime.checkpoints_started = True
    consumer.assigned = {COPIES}
    consumer.highwater_of = {COPIES: 100}

    async def commit(state: Any) -> None:
        state.uncommitted, state.changed = 0, False

    runtime.commit = commit  # type: ignore[method-assign]
    return runtime, app


def assigned_again_and_read_from_the_start(runtime: WorkerRuntime, app: FakeApp) -> None:
    """Generation 4 gives the partition back; it is read again from its committed offset, 0, and
    each of its messages must be applied, in order."""
    app.consumer_generation_id = 4  # type: ignore[attr-defined]
    app.rebalancing = False
    runtime.note_assigned()
    for offset in range(3):
        asyncio.run(runtime.apply(Delivered(COPIES, offset, 4, job_line(offset))))
    state = runtime.partitions[2]
    assert state.applied == {COPIES.topic: 2}
    assert state.core.max_event_ms == 1704067200000 + 2 * 60_000


def test_a_message_fetched_before_a_revocation_is_not_applied_before_the_next_assignment() -> None:
    """Between a revocation (``forget``) and the group's next assignment, the agent may still be
    handed messages fetched in the old generation, and the consumer still reports the old
    assignment. Applied, such a message made the partition's state again (from its checkpoint) and
    set its topic's position: a topic the checkpoint had no offset of took the message for the
    first one, so in the new generation every message before it, read again from the committed
    offset, was a repeat and skipped. The 4 x 2 liveness run lost a job's copies that way (its
    MTTF rows): they sat between the checkpoint and the message applied in the rebalance."""
    runtime, app = copies_runtime()
    app.rebalancing = True
    runtime.forget({COPIES})  # the revocation: the consumer reports the old assignment until the next one
    asyncio.run(runtime.apply(Delivered(COPIES, 95, 3, job_line(95))))  # fetched in generation 3
    assigned_again_and_read_from_the_start(runtime, app)


def test_a_message_whose_partition_is_revoked_while_its_checkpoint_is_read_positions_nothing() -> None:
    """The revocation may also come while a message of the old generation waits for its
    partition's checkpoint: the state read is not taken up, and the message must not position its
    topic either (the revocation forgot the positions already; one set now would skip, in the next
    generation, everything before the message)."""
    runtime, app = copies_runtime()
    checkpoints = runtime.checkpoints
    revoked_during_the_read = [True]

    async def load(partition: int) -> Any:
        if revoked_during_the_read[0]:
            revoked_during_the_read[0] = False
            app.rebalancing = True
            runtime.forget({COPIES})
        return await FakeCheckpoints.load(checkpoints, partition)  # type: ignore[arg-type]

    checkpoints.load = load  # type: ignore[method-assign]
    asyncio.run(runtime.apply(Delivered(COPIES, 95, 3, job_line(95))))
    assert runtime.partitions == {}
    assigned_again_and_read_from_the_start(runtime, app)


def test_a_source_message_revoked_while_its_copies_are_sent_is_not_recorded_as_re_keyed() -> None:
    """``rekey`` awaits the sends of a message's copies; a revocation meanwhile forgets the source
    partition's progress (``RekeyedInput.forget``). The message must not be recorded after that:
    its pending delivery would be settled and its offset committed in the next generation, the
    partition marked as started there (its first message then not committed at once), whoever owns
    it by then."""
    from stream.worker.rekeyed import RekeyedInput, job_copies

    runtime, _app, consumer = counting_runtime()
    jobs = TP("t.jobs", 0)
    consumer.assigned = {jobs}
    consumer.topic_partitions = lambda topic: 4  # type: ignore[attr-defined]
    commits: list[dict[int, int]] = []

    async def commit_rekeyed(topic: str, delivered: dict[int, int], committed: dict[int, int]) -> None:
        commits.append(dict(delivered))

    runtime.commit_point.commit_rekeyed = commit_rekeyed  # type: ignore[method-assign]

    class Target:
        async def send(self, **_: Any) -> asyncio.Future[None]:
            runtime.forget({jobs})  # the revocation, while the copy is handed to the producer
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    rekeyed = RekeyedInput("t.jobs", "job", Target(), "t.jobs-by-node", job_copies("default", 8))
    runtime.rekeyed = {rekeyed.topic: rekeyed}
    asyncio.run(runtime.rekey(Delivered(jobs, 7, 3, job_line(7)), rekeyed))
    assert (list(rekeyed.pending), rekeyed.delivered, rekeyed.started, commits) == ([], {}, set(), [])


class CountedHeld:
    def __init__(self) -> None:
        self.count = 0

    def held_count(self, source: str) -> int:
        return self.count if source == "ecc" else 0


def test_an_input_partition_is_held_back_at_its_share_of_the_bound_and_read_again_at_half_of_it() -> None:
    runtime, _ = make_runtime()
    # Two partitions share 20,000 records: 10,000 each, read again at 5,000.
    runtime.settings = Settings.from_env(kafka_bootstrap="127.0.0.1:1", worker_merge_hold_records=20_000)
    runtime.partitions = {5: None, 6: None}  # type: ignore[dict-item]  (two partitions owned)
    state = ReleasedPartition(0.0)
    state.merger = CountedHeld()  # type: ignore[assignment]
    seen = []
    for count in (3_000, 9_000, 10_000, 12_000, 8_000, 6_000, 5_000, 9_000, 10_000):
        state.merger.count = count  # type: ignore[attr-defined]
        runtime._hold_back(state)  # type: ignore[arg-type]
        seen.append(ECC in runtime.held_back.partitions)
    assert seen == [False, False, True, True, True, True, False, False, True]
    runtime.forget({ECC})
    assert not runtime.held_back.partitions  # a revoked partition is not held back any more


def test_no_bound_holds_nothing_back() -> None:
    runtime, _ = make_runtime()
    runtime.settings = Settings.from_env(kafka_bootstrap="127.0.0.1:1", worker_merge_hold_records=0)
    state = ReleasedPartition(0.0)
    state.merger = CountedHeld()  # type: ignore[assignment]
    state.merger.count = 10**9  # type: ignore[attr-defined]
    runtime._hold_back(state)  # type: ignore[arg-type]
    assert not runtime.held_back.partitions


def test_a_partition_held_back_is_silent_on_purpose_not_stalled(clock: list[float]) -> None:
    runtime, app = make_runtime()
    runtime.held_back.partitions = frozenset({ECC})
    for _ in range(4):
        look(runtime, clock)
    assert app.consumer.seeks == []  # never read again, never a WorkerStalled
    runtime.held_back.partitions = frozenset()
    look(runtime, clock)  # its clock starts again when it is read again
    assert app.consumer.seeks == []
    look(runtime, clock)
    assert app.consumer.seeks == [(ECC, 100)]
