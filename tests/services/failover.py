"""Kill workers with SIGKILL during a replay and time how soon their partitions commit again.

Shared by ``tests/e2e/test_worker_failover.py`` (which asserts the results, not the times) and
``tests/soak/failover.py`` (which prints the times).

A run: a simulated cluster is published to ``partitions`` partitions, all of it first (one record a
message, so that the backlog lasts) or at a steady ``rate`` while they work (``replay --to
--rate``), and ``workers`` workers, each with its own static group instance id
(``FAULTSTREAM_WORKER_INSTANCE_ID``), work it. ``kills`` times, a worker (in turn) is killed with
SIGKILL and a replacement with the same instance id is started at once, as a supervisor would. The
resume time of a kill counts from the replacement's launch until every input partition that had
messages left to commit at that moment has committed past where it stood (so it includes the
interpreter's start, the group join, the checkpoint restore and one commit interval).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.services.worker import ROOT, Worker, input_topics

__all__ = ["GroupWatch", "KillRun", "kill_during_replay"]


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
                int(env["FAULTSTREAM_TOPIC_PARTITIONS"]) if topic != env["FAULTSTREAM_TOPIC_JOBS"] else 1
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

    def close(self) -> None:
        self.loop.run_until_complete(self.consumer.stop())
        self.loop.run_until_complete(self.admin.close())
        self.loop.close()


@dataclass
class KillRun:
    """What a run did: every worker process it started (killed or alive), and per kill the worker
    killed and the seconds until its partitions committed again (None: not before the end)."""

    incarnations: list[Worker] = field(default_factory=list)
    alive: list[Worker] = field(default_factory=list)
    resumes: list[tuple[str, float | None]] = field(default_factory=list)
    #: faultstream_rekey_repeats_total of each killed worker, read just before its kill.
    repeats_before_kills: float = 0.0
    #: (wall-clock time, what happened): kills, launches, resumes (to read beside the workers' logs).
    events: list[tuple[float, str]] = field(default_factory=list)


def _resume_seconds(watch: GroupWatch, started: float, patience: float) -> float | None:
    """Seconds from ``started`` until every partition with uncommitted messages at the first look
    has committed more; None if not within ``patience``."""
    first = watch.offsets()
    waiting = {tp: committed for tp, (committed, end) in first.items() if committed < end}
    while waiting:
        if time.monotonic() - started > patience:
            return None
        time.sleep(0.2)
        now = watch.offsets()
        waiting = {tp: committed for tp, committed in waiting.items() if now[tp][0] <= committed}
    return time.monotonic() - started


def _wait_until_up(worker: Worker, timeout: float = 120.0) -> None:
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
) -> None:
    """Publish ``inputs`` (first, or at ``rate`` records/s while ``workers`` workers run), killing
    one ``kills`` times (see the module's docstring), into ``run``. The caller stops ``run.alive`` in any case
    (after waiting for them to catch up if it compares results)."""
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
        deadline = time.monotonic() + 120
        while not all(w.metric("faultstream_commits_total", before_start=-1) >= 0 for w in run.alive):
            assert time.monotonic() < deadline, "the workers did not start in 120 s"
            time.sleep(0.5)
        if rate is not None:
            time.sleep(3)  # every member has joined: the history arrives at the whole group
            publisher = subprocess.Popen(
                [*replay, "--rate", str(rate)], env={**os.environ, **env}, cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=(folder / "publisher.log").open("w"),
            )  # fmt: skip
        for kill in range(kills):
            time.sleep(rng.uniform(2.0, 5.0))  # at a random moment of the work
            if publisher is not None:
                assert publisher.poll() is None, f"the replay ended before kill {kill + 1}: use a lower rate"
            left = sum(end - committed for committed, end in watch.offsets().values())
            assert left > 0, f"the workers were done before kill {kill + 1}: nothing to test"
            name, victim = names[kill % workers], run.alive[kill % workers]
            for member in run.alive:
                member.assert_alive()
            run.repeats_before_kills += victim.metric("faultstream_rekey_repeats_total", before_start=0)
            victim.kill()
            run.events.append((time.time(), f"killed {name}"))
            replacement = start(name)
            started = time.monotonic()
            run.alive[kill % workers] = replacement
            run.resumes.append((name, _resume_seconds(watch, started, patience)))
            run.events.append((time.time(), f"resumed after {run.resumes[-1][1]} s"))
            # The next kill comes once the replacement runs (on a loaded machine the others can
            # take its partitions first, when its start outlasts the session timeout).
            _wait_until_up(replacement)
        if publisher is not None:
            assert publisher.wait(timeout=600) == 0, (folder / "publisher.log").read_text()[-2000:]
    finally:
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait()
        watch.close()
