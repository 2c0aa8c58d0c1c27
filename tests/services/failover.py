"""Kill workers with SIGKILL during a replay and time how soon their partitions commit again.

Shared by ``tests/e2e/test_worker_failover.py`` (which asserts the results and the times) and
``tests/soak/failover.py`` (which prints the times, for any number of kills, workers and
partitions, static or dynamic membership).

A run: a simulated cluster is published to ``partitions`` partitions, all of it first (one record a
message, so that the backlog lasts) or at a steady ``rate`` while they work (``replay --to
--rate``), and ``workers`` workers, each with its own static group instance id
(``FAULTSTREAM_WORKER_INSTANCE_ID``), work it. ``kills`` times, a worker (in turn) is killed with
SIGKILL and a replacement with the same instance id is started at once, as a supervisor would
(or, ``replace="later"``, only once the others have taken its partitions over).

**Resume time** (docs/kafka.md#failover), measured from outside through the group's committed
offsets: the committed offset of every input partition is read right after the kill; the time
runs from the replacement's launch (``replace="later"``: from the kill) until every *partition*
that had messages left to commit then has committed past where it stood — partition *p* of the
co-partitioned xid, ecc and jobs-by-node topics on any of the three, a jobs partition on its own.
A partition taken over commits with its first message (:mod:`stream.worker.runtime`), so this is
the interpreter's start, the group join, the checkpoint restore and the first message applied and
made durable. The other workers' partitions commit every ``FAULTSTREAM_WORKER_FLUSH_SECONDS``
anyway, so the figure is an upper bound of the killed worker's own partitions.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream.worker.caught_up import metric_sum
from tests.services.worker import ROOT, Worker, input_topics

#: ``FAULTSTREAM_WORKER_JOIN_RECORDS`` of the workers that read a backlog of one-record messages
#: through kills: their fetch joins such messages (stream/worker/joining.py), two at most here
#: instead of 256, so that the backlog lasts through every change (at 256 the workers were done
#: before the second kill, at 4 before the third); a run of two crosses a restart's checkpoint,
#: and a copy's repeats begin inside a copy, as a run of 256 does.
BACKLOG_JOIN_RECORDS = "2"

__all__ = [
    "GroupWatch",
    "KillRun",
    "checkpointed_repeats",
    "join_kill_leave",
    "kill_during_replay",
    "resume_seconds",
    "wait_until_up",
]


class GroupWatch:
    """The group's committed offset and the end offset of every input partition, on one event loop
    with one admin client and one consumer for the whole run (polled several times a second)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.loop = asyncio.new_event_loop()

        async def connect() -> tuple[AIOKafkaAdminClient, AIOKafkaConsumer]:
            # aiokafka clients are made inside their running loop.
            admin = AIOKafkaAdminClient(bootstrap_servers=env["FAULTSTREAM_KAFKA_BOOTSTRAP"])
            consumer = AIOKafkaConsumer(bootstrap_servers=env["FAULTSTREAM_KAFKA_BOOTSTRAP"])
            await admin.start()
            await consumer.start()
            return admin, consumer

        self.admin, self.consumer = self.loop.run_until_complete(connect())
        self.tps = [
            TopicPartition(topic, partition)
            for topic in input_topics(env)
            for partition in range(
                1
                if topic in (env["FAULTSTREAM_TOPIC_JOBS"], env["FAULTSTREAM_TOPIC_KERNEL_LOG"])
                else int(env["FAULTSTREAM_TOPIC_PARTITIONS"])
            )
        ]

    def offsets(self) -> dict[TopicPartition, tuple[int, int]]:
        """(committed, end) per input partition (committed 0 when the group has none)."""

        async def ask() -> dict[TopicPartition, tuple[int, int]]:
            answer = await self.admin.list_consumer_group_offsets(
                self.env["FAULTSTREAM_WORKER_APP_ID"], partitions=self.tps
            )
            ends = await self.consumer.end_offsets(self.tps)
            return {tp: (max(answer[tp].offset, 0) if tp in answer else 0, ends[tp]) for tp in self.tps}

        return self.loop.run_until_complete(ask())

    def members(self) -> tuple[str, int]:
        """The group's state (``Stable`` once a rebalance is over) and how many members it has."""

        async def ask() -> tuple[str, int]:
            [response] = await self.admin.describe_consumer_groups([self.env["FAULTSTREAM_WORKER_APP_ID"]])
            [group] = response.groups
            return str(group[2]), len(group[5])

        return self.loop.run_until_complete(ask())

    def close(self) -> None:
        self.loop.run_until_complete(self.consumer.stop())
        self.loop.run_until_complete(self.admin.close())
        self.loop.close()


@dataclass
class KillRun:
    """What a run did: every worker process it started (killed or alive), and per kill the worker
    killed and the seconds until its partitions committed again (None: not within the patience)."""

    incarnations: list[Worker] = field(default_factory=list)
    alive: list[Worker] = field(default_factory=list)
    resumes: list[tuple[str, float | None]] = field(default_factory=list)
    #: (wall-clock time, what happened): kills, launches, resumes (to read beside the workers' logs).
    events: list[tuple[float, str]] = field(default_factory=list)


Unit = tuple[str, int]


def _unit(tp: TopicPartition, jobs_topic: str) -> Unit:
    """The partition a topic partition belongs to: a jobs partition, or input partition *p*
    (its xid, ecc and jobs-by-node partitions are one detection core's)."""
    return ("jobs", tp.partition) if tp.topic == jobs_topic else ("input", tp.partition)


def resume_seconds(
    watch: GroupWatch,
    at_kill: dict[TopicPartition, tuple[int, int]],
    started: float,
    patience: float,
    events: list[tuple[float, str]] | None = None,
) -> float | None:
    """Seconds from ``started`` until every partition with messages left to commit in ``at_kill``
    (the offsets read right after the kill) has committed past where it stood on one of its
    topics (the module's docstring); None if not within ``patience``. Each partition's own time
    goes to ``events``."""
    jobs = watch.env["FAULTSTREAM_TOPIC_JOBS"]
    waiting: dict[Unit, dict[TopicPartition, int]] = {}
    for tp, (committed, _end) in at_kill.items():
        waiting.setdefault(_unit(tp, jobs), {})[tp] = committed
    waiting = {
        unit: tps for unit, tps in waiting.items() if any(at_kill[tp][0] < at_kill[tp][1] for tp in tps)
    }
    while waiting:
        if time.monotonic() - started > patience:
            return None
        time.sleep(0.1)
        now = watch.offsets()
        moved = [unit for unit, tps in waiting.items() if any(now[tp][0] > done for tp, done in tps.items())]
        for unit in moved:
            del waiting[unit]
            if events is not None:
                events.append((time.time(), f"{unit[0]} partition {unit[1]} committed again"))
    return time.monotonic() - started


def checkpointed_repeats(env: dict[str, str]) -> dict[int, int]:
    """Per input partition, the re-keyed job copies its history skipped as repeats, as its newest
    checkpoint counts them (:attr:`stream.worker.rekeying.CopiesApplied.repeats`): each once,
    whichever worker skipped it and however many were killed after."""
    from stream.worker.checkpoints import CheckpointTopic

    async def read() -> dict[int, int]:
        topic = CheckpointTopic(
            {"bootstrap_servers": env["FAULTSTREAM_KAFKA_BOOTSTRAP"]},
            env["FAULTSTREAM_TOPIC_CHECKPOINTS"],
            env["FAULTSTREAM_WORKER_APP_ID"],
        )
        partitions = int(env["FAULTSTREAM_TOPIC_PARTITIONS"])
        await topic.start(partitions)
        try:
            found = {number: await topic.load(number) for number in range(partitions)}
        finally:
            await topic.stop()
        return {number: loaded[0].repeats for number, loaded in found.items() if loaded is not None}

    return asyncio.run(read())


def wait_until_up(worker: Worker, timeout: float = 120.0) -> None:
    """Until a worker's metrics endpoint answers (it has built its app and started Faust)."""
    deadline = time.monotonic() + timeout
    while worker.metric("faultstream_commits_total", before_start=-1) < 0:
        worker.assert_alive()
        assert time.monotonic() < deadline, f"{worker.log_path.name} did not start in {timeout:.0f} s"
        time.sleep(0.3)


def kill_during_replay(
    run: KillRun,
    env: dict[str, str],
    inputs: list[Path],
    folder: Path,
    *,
    workers: int = 2,
    kills: int = 5,
    rate: int | None = None,
    seed: int = 17,
    patience: float = 60.0,
    static: bool = True,
    replace: str = "at once",
    rekeyer_first: bool = False,
) -> None:
    """Publish ``inputs`` (first, or at ``rate`` records/s while ``workers`` workers run), killing
    one ``kills`` times (see the module's docstring), into ``run``. ``replace``: "at once" (a
    supervisor restarting the worker) or "later" (a worker lost for good: the others take its
    partitions over when its session times out; its replacement starts after that, so that the
    group keeps its size for the next kill). ``rekeyer_first``: the first kill takes the worker
    re-keying the jobs topic then, if one is: its copies sent since its last commit are sent
    again by its successor, the repeats the workers must skip (the jobs topic has one partition,
    re-keyed in the first seconds of a backlog: killing the other worker first once left no
    repeat to test). The caller stops ``run.alive`` in any case (after
    waiting for them to catch up if it compares results)."""
    assert replace in ("at once", "later"), replace
    rng = random.Random(seed)
    serial = iter(range(10**6))

    def start(instance: str) -> Worker:
        number = next(serial)
        worker = Worker(
            {**env, "FAULTSTREAM_WORKER_INSTANCE_ID": instance if static else ""},
            folder / f"store-{instance}-{number}",
            folder / f"worker-{instance}-{number}.log",
        )
        run.incarnations.append(worker)
        run.events.append((time.time(), f"launched {instance}: {worker.log_path.name}"))
        return worker

    watch = GroupWatch(env)
    publisher: subprocess.Popen[bytes] | None = None
    replay = [sys.executable, "-m", "stream.cli", "replay", *map(str, inputs), "--to",
              f"kafka://{env['FAULTSTREAM_KAFKA_BOOTSTRAP']}", "--no-progress"]  # fmt: skip
    if rate is None:
        # One record a message: the backlog lasts long enough for every kill to land in it.
        subprocess.run([*replay, "--records-per-message", "1"], env={**os.environ, **env}, cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
    try:
        names = [f"w{n}" for n in range(workers)]
        run.alive = [start(name) for name in names]
        for worker in run.alive:
            wait_until_up(worker)
        if rate is not None:
            time.sleep(3)  # every member has joined: the history arrives at the whole group
            publisher = subprocess.Popen(
                [*replay, "--rate", str(rate)], env={**os.environ, **env}, cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=(folder / "publisher.log").open("w"),
            )  # fmt: skip
        first = 0  # the victims in turn, from this one
        for kill in range(kills):
            time.sleep(rng.uniform(1.5, 3.0))  # at a random moment of the work (commits come every 2 s)
            if kill == 0 and rekeyer_first:
                rekeyer = _rekeying_burst(run.alive, env["FAULTSTREAM_TOPIC_JOBS"])
                who = "nobody" if rekeyer is None else names[rekeyer]
                run.events.append((time.time(), f"re-keying the jobs now: {who}"))
                first = rekeyer or 0
            if publisher is not None:
                assert publisher.poll() is None, f"the replay ended before kill {kill + 1}: use a lower rate"
            turn = (first + kill) % workers
            name, victim = names[turn], run.alive[turn]
            for member in run.alive:
                member.assert_alive()
            victim.kill()
            killed = time.monotonic()
            run.events.append((time.time(), f"killed {name}"))
            at_kill = watch.offsets()  # the victim commits nothing more: where its partitions stand
            left = sum(end - committed for committed, end in at_kill.values())
            assert left > 0, f"the workers were done before kill {kill + 1}: nothing to test"
            if replace == "at once":
                replacement = start(name)
                started = time.monotonic()
            else:
                started = killed
            seconds = resume_seconds(watch, at_kill, started, patience, run.events)
            run.resumes.append((name, seconds))
            run.events.append((time.time(), f"resumed after {seconds} s"))
            if replace == "later":
                replacement = start(name)
            run.alive[turn] = replacement
            # The next kill comes once the replacement runs (on a loaded machine the others can
            # take its partitions first, when its start outlasts the session timeout).
            wait_until_up(replacement)
        if publisher is not None:
            assert publisher.wait(timeout=600) == 0, (folder / "publisher.log").read_text()[-2000:]
    finally:
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait()
        watch.close()


def _rekeying(workers: list[Worker], jobs_topic: str, seconds: float = 0.3) -> int | None:
    """The index of the worker reading the jobs topic now (its count of jobs messages read grew
    over ``seconds``), or None when none is."""

    def counts() -> list[float]:
        pages = [worker.metrics_page() or "" for worker in workers]
        return [metric_sum(page, "faultstream_events_in_total", f'topic="{jobs_topic}"') for page in pages]

    before = counts()
    time.sleep(seconds)
    grown = [after - was for after, was in zip(counts(), before, strict=True)]
    busiest = max(range(len(workers)), key=grown.__getitem__)
    return busiest if grown[busiest] > 0 else None


def _rekeying_burst(workers: list[Worker], jobs_topic: str, within: float = 3.0) -> int | None:
    """The index of a worker re-keying the jobs topic at this very moment, or None when none is.

    A re-keyer reads the jobs topic in bursts (a share of each poll), and the timer commits a
    burst's messages about 0.1 s after their copies are delivered. A worker seen re-keying over
    0.3 s (:func:`_rekeying`) and killed right after had, in 2 runs of 10, committed all it had sent
    by then: its successor sent nothing again, and the test had no repeat to check. So, once one is
    re-keying at all, wait (up to ``within`` seconds) for its count to grow within 50 ms, and
    return it then: killed at once, its last burst is not committed yet.
    """
    found = _rekeying(workers, jobs_topic)
    if found is None:
        return None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        burst = _rekeying(workers, jobs_topic, seconds=0.05)
        if burst is not None:
            return burst
    return found


def _left(watch: GroupWatch) -> int:
    """Messages of the input topics the group has not committed yet."""
    return sum(end - committed for committed, end in watch.offsets().values())


def _wait_for(worker: Worker, what: str, ready: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        worker.assert_alive()
        assert time.monotonic() < deadline, f"{worker.log_path.name}: not {what} within {timeout:.0f} s"
        time.sleep(0.2)


def join_kill_leave(
    run: KillRun,
    env: dict[str, str],
    folder: Path,
    *,
    publish: Callable[[], subprocess.Popen[bytes]] | None = None,
    patience: float = 30.0,
) -> None:
    """Three workers through every change of membership, into ``run``: w0 (static instance id)
    and w1 start; w2 joins mid-stream (a rebalance); w0 is SIGKILLed and replaced at once with its
    id (no rebalance; the resume time goes to ``run.resumes``); w1 stops with SIGTERM and leaves
    the group (dynamic membership: a LeaveGroup, the others take its partitions at once). w2 takes
    partitions over from their checkpoints at its join, or (fewer than two partitions a worker)
    when w1 leaves: Faust's assignor is sticky.

    The input is a backlog already published, or what ``publish`` starts publishing once w0 and
    w1 run (a replay at a steady rate: a small input lasts through every change that way). Each
    change comes once the workers concerned have work (the leaver: rows of its own), and mid-stream — the publisher
    still running or the group with input left — else the run tested nothing (an assertion). The
    caller waits for ``run.alive`` to catch up (and the publisher to end) and stops them."""
    serial = iter(range(100))
    publisher: subprocess.Popen[bytes] | None = None

    def start(name: str, instance: str = "") -> Worker:
        worker = Worker(
            {**env, "FAULTSTREAM_WORKER_INSTANCE_ID": instance},
            folder / f"store-{name}-{next(serial)}",
            folder / f"{name}-{len(run.incarnations)}.log",
        )
        run.incarnations.append(worker)
        run.events.append((time.time(), f"launched {name}: {worker.log_path.name}"))
        return worker

    def working(worker: Worker) -> Callable[[], bool]:
        """It has partitions and has committed (a partition commits with its first message)."""
        return lambda: worker.metric("faultstream_commits_total", before_start=0) >= 1

    def wrote(worker: Worker) -> Callable[[], bool]:
        """It has written rows of its own (a commit may carry only records the merge still holds,
        which a clean stop hands over unapplied)."""
        return lambda: worker.metric("faultstream_sink_rows_total", before_start=0) > 0

    def mid_stream(before: str) -> None:
        publishing = publisher is not None and publisher.poll() is None
        assert publishing or _left(watch) > 0, f"the workers were done {before}: nothing to test"

    watch = GroupWatch(env)
    try:
        first, second = start("w0", "w0"), start("w1")
        run.alive = [first, second]
        if publish is not None:
            for worker in run.alive:
                wait_until_up(worker)
            _wait_for(second, "a member of the group", lambda: watch.members() == ("Stable", 2))
            publisher = publish()
            run.events.append((time.time(), "publishing"))
        for worker in run.alive:
            _wait_for(worker, "working", working(worker))
        mid_stream("before the third joined")
        third = start("w2")
        run.alive.append(third)
        # It joined once the rebalance is over with three members. (Faust's assignor is sticky:
        # with fewer partitions than 2 a worker it keeps two each and gives the third none until
        # someone leaves, so that it may have no input partition yet.)
        _wait_for(third, "a member of the group", lambda: watch.members() == ("Stable", 3))
        run.events.append((time.time(), "w2 joined"))
        first.kill()
        run.events.append((time.time(), "killed w0"))
        at_kill = watch.offsets()
        mid_stream("before the kill")
        replacement = start("w0", "w0")
        started = time.monotonic()
        run.alive[0] = replacement
        run.resumes.append(("w0", resume_seconds(watch, at_kill, started, patience, run.events)))
        run.events.append((time.time(), f"resumed after {run.resumes[-1][1]} s"))
        _wait_for(second, "writing rows", wrote(second))
        mid_stream("before the leave")
        second.stop()
        run.alive.remove(second)
        run.events.append((time.time(), "w1 left"))
        mid_stream("when w1 had left")
        # The joiner took partitions over from their checkpoints (at its join, or when w1 left).
        _wait_for(third, "restored from a checkpoint",
                  lambda: third.metric("faultstream_checkpoints_restored_total", before_start=0) >= 1)  # fmt: skip
        _wait_for(third, "writing rows", wrote(third))
        run.events.append((time.time(), "w2 restored a checkpoint and wrote rows"))
        if publisher is not None:
            assert publisher.wait(timeout=600) == 0, "the publisher failed"
            publisher = None
            run.events.append((time.time(), "published"))
    finally:
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait()
        watch.close()
