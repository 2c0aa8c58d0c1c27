"""Event-to-incident latency of one ``faultstream worker`` under a sustained, rate-limited live stream.

    python benchmarks/latency.py --kafka 127.0.0.1:9092       # 5,000 and 20,000 records/s, 300 s each
    python benchmarks/latency.py --kafka HOST:PORT --rates 5000 --seconds 60 \\
        --flush-seconds 0.5 --idle-seconds 0.5 --worker-env FAULTSTREAM_SINK_BATCH_ROWS=20000
    python benchmarks/latency.py --kafka HOST:PORT --smoke    # 200 records/s for 5 s (CI)

For each rate of ``--rates`` it creates fresh topics (``faultstream init-kafka``), starts one worker
(its own app id and store; worker settings from the environment, the product defaults unless
``--flush-seconds``, ``--idle-seconds`` or ``--worker-env`` say otherwise; the values used are
printed) and drives it with a producer that plays a live fleet:

* event time = wall time: every record's ``ts`` is the epoch milliseconds at which it is made;
* the mix (JSON documents of ``schemas/jsonschema/``, keyed as the product keys them): ECC samples
  of ``--nodes`` nodes x 8 GPUs, round robin (all eleven counters; a rare correctable SBE on GPU 7),
  ``--app-xids`` application XIDs a second (13, 31, 43: info, no incident), ``--job-events`` job
  starts and ends a second (RUNNING, later COMPLETED, on 1-8 nodes), the rest ECC samples;
* batching as a collector would: every ``--tick-ms`` (5 ms) the records made since the last tick are
  sent, one message per topic partition (newline-delimited records, at most 256 a message, or
  ``--records-per-message``: 1 plays a producer that sends a record a message; the partition from
  the key with Kafka's default partitioner), so a record waits at most one tick;
* planted critical XIDs: after a warm-up (until the worker's first commit, at least ``--warmup``
  seconds), one XID 79 "GPU has fallen off the bus" every ``--plant-every`` seconds, each on a GPU
  no other plant uses (GPUs 0-6 of the fleet's nodes), its send time remembered.

A consumer of the incidents topic (from its beginning) matches every plant to the first
``gpu_bus`` incident naming its node and GPU (``first_evidence`` = the plant's ``ts``); latency =
wall time the incident was received - wall time the planted record's message was handed to the
producer. The worker sends incidents only after its ClickHouse flush at a commit point, so an
incident on the topic means its row is in ClickHouse (the embedded store, chdb, cannot be read
from another process while the worker holds it, so that is not checked separately).

Records are counted as records (lines), not messages. The table gives per rate: the target and
actual producer rate over the measured window (warm-up excluded), records and messages sent,
plants and matches, latency p50/p90/p99/max in ms, the worker's lag (messages past its committed
offsets on xid, ecc, jobs, jobs-by-node) at the end of the window, and how long after the producer
stopped the worker had committed everything. After the window the stream goes on for ``--tail``
seconds without plants (or until every plant's incident came): a plant at the very end of a
stream that then stops waits for the sources to turn idle, which a live stream never makes it do.
Progress goes to stderr, the table to stdout. Topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError
from aiokafka.partitioner import murmur2
from worker_throughput import add_kafka_argument

from schemas.timeutil import format_ts
from stream.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stream.cli"]
#: The topic settings, by name without the prefix (XID, ECC, ..., FLEET_BASELINES).
TOPIC_SETTINGS = tuple(name.removeprefix("FAULTSTREAM_TOPIC_") for name in Settings.topic_env_names())
CLUSTER = "latency"
GPUS = 8
PLANT_GPUS = 7  # GPUs 0-6 take plants; GPU 7 carries the rare SBEs
MAX_RECORDS_A_MESSAGE = 256
COUNTERS = (
    "sbe_volatile", "dbe_volatile", "sbe_aggregate", "dbe_aggregate", "retired_pages_sbe",
    "retired_pages_dbe", "retired_pages_pending", "remapped_rows_correctable",
    "remapped_rows_uncorrectable", "remap_pending", "remap_failure",
)  # fmt: skip
APP_XIDS = ((13, "Graphics SM Warp Exception"), (31, "GPU memory page fault"), (43, "GPU stopped processing"))
#: Settings that shape latency, printed with every result.
SHOWN_SETTINGS = (
    "worker_flush_seconds",
    "worker_idle_seconds",
    "sink_batch_rows",
    "topic_partitions",
    "allowed_lateness_seconds",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pci(gpu: int) -> str:
    """The canonical PCI bus id of GPU ``gpu`` of a node (what incidents name the GPU by)."""
    return f"0000:{0x18 + 0x10 * gpu:02x}:00"


def partition_of(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2), as the product's publishers use it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass
class Plant:
    node: str
    gpu: str
    ts_ms: int
    sent: float = math.nan  # wall time its message was handed to the producer
    received: float = math.nan  # wall time its incident arrived


@dataclass
class Outcome:
    """One rate's figures."""

    rate: int
    actual: float = 0.0
    seconds: float = 0.0
    records: int = 0
    messages: int = 0
    plants: list[Plant] = field(default_factory=list)
    lag_messages: int = 0
    caught_up_after: float = math.nan
    settings: dict[str, Any] = field(default_factory=dict)

    def latencies_ms(self) -> list[float]:
        return sorted((p.received - p.sent) * 1000 for p in self.plants if math.isfinite(p.received - p.sent))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of sorted values; NaN when there are none."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class Fleet:
    """Makes the records of a live fleet, event time = now."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.nodes = [f"lat{n:05d}" for n in range(nodes)]
        self.random = random.Random(seed)
        self._ecc = itertools.cycle([(node, gpu) for gpu in range(GPUS) for node in self.nodes])
        self._sbe: dict[tuple[str, int], int] = {}
        self._jobs = itertools.count(1)
        self._running: list[tuple[str, list[str], int]] = []  # job id, nodes, start ms
        self._plant_slots = ((node, gpu) for gpu in range(PLANT_GPUS) for node in self.nodes)

    def ecc(self, ts_ms: int) -> tuple[str, bytes, bytes]:
        node, gpu = next(self._ecc)
        counters = dict.fromkeys(COUNTERS, 0)
        if gpu == GPUS - 1:
            if self.random.random() < 1e-3:
                self._sbe[node, gpu] = self._sbe.get((node, gpu), 0) + 1
            counters["sbe_volatile"] = counters["sbe_aggregate"] = self._sbe.get((node, gpu), 0)
        doc = {"ts": ts_ms, "cluster": CLUSTER, "node": node, "gpu": gpu, "pci_bus_id": pci(gpu),
               "counters": counters}  # fmt: skip
        return "ecc", node.encode(), orjson.dumps(doc)

    def app_xid(self, ts_ms: int) -> tuple[str, bytes, bytes]:
        node = self.random.choice(self.nodes)
        gpu = self.random.randrange(GPUS)
        xid, message = self.random.choice(APP_XIDS)
        pid = self.random.randrange(1000, 99999)
        doc = {"ts": ts_ms, "cluster": CLUSTER, "node": node, "xid": xid, "pci_bus_id": pci(gpu),
               "pid": pid, "process": "python", "message": message}  # fmt: skip
        return "xid", node.encode(), orjson.dumps(doc)

    def job_event(self, ts_ms: int) -> tuple[str, bytes, bytes]:
        """Start a job, or end the oldest running one (about as many ends as starts)."""
        if self._running and (len(self._running) > 20 or self.random.random() < 0.5):
            job_id, nodes, start = self._running.pop(0)
            doc = {"ts": ts_ms, "cluster": CLUSTER, "job_id": job_id, "state": "COMPLETED",
                   "nodes": nodes, "gpus": GPUS * len(nodes), "start": start, "end": ts_ms,
                   "exit_code": "0:0", "name": "train", "user": "bench"}  # fmt: skip
        else:
            job_id = f"{next(self._jobs)}"
            nodes = sorted(self.random.sample(self.nodes, min(len(self.nodes), self.random.randint(1, 8))))
            self._running.append((job_id, nodes, ts_ms))
            doc = {"ts": ts_ms, "cluster": CLUSTER, "job_id": job_id, "state": "RUNNING",
                   "nodes": nodes, "gpus": GPUS * len(nodes), "start": ts_ms, "name": "train",
                   "user": "bench"}  # fmt: skip
        return "jobs", f"{CLUSTER}/{job_id}".encode(), orjson.dumps(doc)

    def plant(self, ts_ms: int) -> tuple[tuple[str, bytes, bytes], Plant]:
        node, gpu = next(self._plant_slots)
        doc = {"ts": ts_ms, "cluster": CLUSTER, "node": node, "xid": 79, "pci_bus_id": pci(gpu),
               "message": "GPU has fallen off the bus."}  # fmt: skip
        return ("xid", node.encode(), orjson.dumps(doc)), Plant(node, pci(gpu), ts_ms)


class Offsets:
    """One admin client (committed offsets of the worker's group) and one consumer without a group
    (end offsets), alive for a whole rate."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    async def start(self) -> None:
        await self.admin.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def lag(self, group: str, tps: list[TopicPartition]) -> tuple[int, bool]:
        """Messages of ``tps`` past the group's committed offsets; whether anything is committed."""
        try:
            answer = await self.admin.list_consumer_group_offsets(group)
        except GroupCoordinatorNotAvailableError:
            # A fresh broker creates its offsets topic at the first group's lookup: nothing is
            # committed until it has (the warm-up asks before the worker's first commit).
            answer = {}
        committed = {tp: meta.offset for tp, meta in answer.items() if meta.offset >= 0}
        ends = await self.consumer.end_offsets(tps)
        return sum(max(ends[tp] - committed.get(tp, 0), 0) for tp in tps), bool(committed)


def deployment_env(args: argparse.Namespace, prefix: str, data_dir: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "FAULTSTREAM_KAFKA_BOOTSTRAP": args.kafka,
        "FAULTSTREAM_WORKER_APP_ID": prefix,
        "FAULTSTREAM_METRICS_PORT": "0",
        "FAULTSTREAM_DATA_DIR": str(data_dir),
        "FAULTSTREAM_CLUSTER": CLUSTER,
        **{f"FAULTSTREAM_TOPIC_{name}": f"{prefix}.{name.lower()}" for name in TOPIC_SETTINGS},
    }
    if args.partitions:
        env["FAULTSTREAM_TOPIC_PARTITIONS"] = str(args.partitions)
    if args.flush_seconds is not None:
        env["FAULTSTREAM_WORKER_FLUSH_SECONDS"] = str(args.flush_seconds)
    if args.idle_seconds is not None:
        env["FAULTSTREAM_WORKER_IDLE_SECONDS"] = str(args.idle_seconds)
    for item in args.worker_env:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def effective_settings(env: dict[str, str]) -> dict[str, Any]:
    settings = Settings.from_env(env)
    return {name: getattr(settings, name) for name in SHOWN_SETTINGS}


class Producer:
    """Rate-limited producer of the fleet's records, batched per partition every tick."""

    def __init__(
        self,
        args: argparse.Namespace,
        env: dict[str, str],
        fleet: Fleet,
        rate: int,
        by_gpu: dict[tuple[str, str], Plant],
    ) -> None:
        self.args = args
        self.by_gpu = by_gpu  # plants by (node, GPU), shared with the incidents consumer
        self.fleet = fleet
        self.rate = rate
        self.topics = {kind: env[f"FAULTSTREAM_TOPIC_{kind.upper()}"] for kind in ("xid", "ecc", "jobs")}
        self.partitions: dict[str, int] = {}
        self.producer = AIOKafkaProducer(bootstrap_servers=args.kafka, linger_ms=0, acks=1)
        self.planting = False
        self.stopped = False
        self.plants: list[Plant] = []
        self.records = 0
        self.messages = 0
        self.failures = 0
        self.window: tuple[float, int, int] | None = None  # start time, records, messages at it

    async def run(self) -> None:
        await self.producer.start()
        try:
            for kind, topic in self.topics.items():
                self.partitions[kind] = len(await self.producer.partitions_for(topic))
            await self._loop()
            await self.producer.flush()
        finally:
            await self.producer.stop()

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failures += 1

    async def _loop(self) -> None:
        tick = self.args.tick_ms / 1000
        rate = self.rate
        # Seconds between records of each small stream; the rest of the rate is ECC samples.
        every = {"app_xid": 1 / self.args.app_xids if self.args.app_xids else math.inf,
                 "job": 1 / self.args.job_events if self.args.job_events else math.inf}  # fmt: skip
        started = time.monotonic()
        next_due = {"app_xid": started, "job": started, "plant": math.inf}
        made = 0
        ticks = 0
        while not self.stopped:
            now_mono = time.monotonic()
            if self.planting and next_due["plant"] == math.inf:
                next_due["plant"] = now_mono
            ts_ms = int(time.time() * 1000)
            due = int(rate * (now_mono - started)) - made
            pending: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {}
            planted: list[Plant] = []
            add = self._adder(pending)
            for stream, make in (("app_xid", self.fleet.app_xid), ("job", self.fleet.job_event)):
                while due > 0 and next_due[stream] <= now_mono:
                    add(make(ts_ms))
                    next_due[stream] += every[stream]
                    due -= 1
                    made += 1
            while due > 0 and self.planting and next_due["plant"] <= now_mono:
                item, plant = self.fleet.plant(ts_ms)
                add(item)
                planted.append(plant)
                next_due["plant"] += self.args.plant_every
                due -= 1
                made += 1
            for _ in range(max(due, 0)):
                add(self.fleet.ecc(ts_ms))
                made += 1
            sent_at = time.time()
            for plant in planted:
                plant.sent = sent_at
                self.by_gpu[plant.node, plant.gpu] = plant
            self.plants.extend(planted)
            await self._send(pending, ts_ms)
            ticks += 1
            sleep = started + ticks * tick - time.monotonic()
            if sleep > 0:
                await asyncio.sleep(sleep)
            else:
                await asyncio.sleep(0)  # behind: catch up, but let the incidents consumer run

    def _adder(
        self, pending: dict[tuple[str, int], list[tuple[bytes, bytes]]]
    ) -> Callable[[tuple[str, bytes, bytes]], None]:
        """A function holding a record (topic kind, key, value) in its partition's batch of ``pending``."""

        def add(item: tuple[str, bytes, bytes]) -> None:
            kind, key, value = item
            where = (kind, partition_of(key, self.partitions[kind]))
            pending.setdefault(where, []).append((key, value))

        return add

    async def _send(self, pending: dict[tuple[str, int], list[tuple[bytes, bytes]]], ts_ms: int) -> None:
        for (kind, partition), items in pending.items():
            most = self.args.records_per_message
            for start in range(0, len(items), most):
                chunk = items[start : start + most]
                future = await self.producer.send(
                    self.topics[kind],
                    value=b"\n".join(value for _, value in chunk),
                    key=chunk[0][0],
                    partition=partition,
                    timestamp_ms=ts_ms,
                )
                future.add_done_callback(self._delivered)
                self.records += len(chunk)
                self.messages += 1

    def open_window(self) -> None:
        self.planting = True
        self.window = (time.monotonic(), self.records, self.messages)


async def follow_incidents(
    bootstrap: str,
    topic: str,
    partitions: int,
    plants: dict[tuple[str, str], Plant],
    stop: asyncio.Event,
) -> None:
    """Match planted XIDs to the first gpu_bus incident naming their node and GPU."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=50)
            received = time.time()
            for batch in batches.values():
                for message in batch:
                    incident = orjson.loads(message.value)
                    if incident.get("kind") != "gpu_bus":
                        continue
                    plant = plants.get((incident.get("node"), incident.get("gpu")))
                    if (
                        plant is not None
                        and math.isnan(plant.received)
                        and incident.get("first_evidence") == format_ts(plant.ts_ms)
                    ):
                        plant.received = received
    finally:
        await consumer.stop()


async def measure_rate(args: argparse.Namespace, rate: int, workdir: Path) -> Outcome:
    prefix = f"lat{uuid.uuid4().hex[:6]}-r{rate}"
    data_dir = workdir / prefix
    env = deployment_env(args, prefix, data_dir)
    outcome = Outcome(rate, settings=effective_settings(env))
    # The worker's topics, and the one Faust creates for its group's leader election.
    topics = [*(env[f"FAULTSTREAM_TOPIC_{name}"] for name in TOPIC_SETTINGS), f"{prefix}-__assignor-__leader"]
    subprocess.run([*CLI, "init-kafka"], env=env, cwd=ROOT, check=True, capture_output=True)
    fleet = Fleet(args.nodes, seed=rate)
    by_gpu: dict[tuple[str, str], Plant] = {}
    producer = Producer(args, env, fleet, rate, by_gpu)
    stop_following = asyncio.Event()
    offsets = Offsets(args.kafka)
    await offsets.start()
    logfile = workdir / f"{prefix}.log"
    worker = None
    try:
        partitions = outcome.settings["topic_partitions"]
        inputs = [TopicPartition(env[f"FAULTSTREAM_TOPIC_{name}"], p)
                  for name in ("XID", "ECC", "JOBS_BY_NODE") for p in range(partitions)]  # fmt: skip
        inputs.append(TopicPartition(env["FAULTSTREAM_TOPIC_JOBS"], 0))
        follower = asyncio.create_task(
            follow_incidents(
                args.kafka, env["FAULTSTREAM_TOPIC_INCIDENTS"], partitions, by_gpu, stop_following
            )
        )
        with logfile.open("w") as out:
            worker = subprocess.Popen([*CLI, "worker", "--clickhouse", f"chdb://{data_dir / 'store'}"],
                                      env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        producing = asyncio.create_task(producer.run())
        # Warm-up: the worker joins, reads, commits once; no plants yet.
        started = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            _, any_commit = await offsets.lag(prefix, inputs)
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode}) during warm-up: see {logfile}")
            if producing.done():
                await producing  # raises what stopped it
            if any_commit and time.monotonic() - started >= args.warmup:
                break
            if time.monotonic() - started > 120:
                raise SystemExit(f"the worker committed nothing within 120 s: see {logfile}")
        log(f"  warm-up done after {time.monotonic() - started:.1f} s; measuring {args.seconds:g} s")
        producer.open_window()
        window_end = time.monotonic() + args.seconds
        next_report = time.monotonic() + 30
        while time.monotonic() < window_end:
            await asyncio.sleep(0.25)
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode}): see {logfile}")
            if producing.done():
                await producing
            if time.monotonic() >= next_report:
                next_report += 30
                done = sum(1 for p in by_gpu.values() if math.isfinite(p.received))
                lag, _ = await offsets.lag(prefix, inputs)
                seen = f"{done}/{len(by_gpu)} plants seen"
                log(f"  {producer.records:,} records sent; {seen}; lag {lag:,} messages")
        producer.planting = False
        assert producer.window is not None
        window_start, records_at, messages_at = producer.window
        outcome.seconds = time.monotonic() - window_start
        outcome.records = producer.records - records_at
        outcome.messages = producer.messages - messages_at
        outcome.actual = outcome.records / outcome.seconds
        outcome.plants = producer.plants
        outcome.lag_messages, _ = await offsets.lag(prefix, inputs)
        # Tail: the stream goes on without plants, so that the last plants are not held back by
        # sources that stopped (the merge waits for them to turn idle), as they never are live.
        tail_end = time.monotonic() + args.tail
        while time.monotonic() < tail_end and not all(math.isfinite(p.received) for p in outcome.plants):
            await asyncio.sleep(0.25)
            if producing.done():
                await producing
        producer.stopped = True
        await producing
        stopped = time.monotonic()
        if producer.failures:
            log(f"  {producer.failures} messages failed to send")
        # Drain: the worker commits what it holds; the last plants' incidents arrive.
        while time.monotonic() - stopped < args.drain:
            lag, _ = await offsets.lag(prefix, inputs)
            if lag == 0 and math.isnan(outcome.caught_up_after):
                outcome.caught_up_after = time.monotonic() - stopped
            if lag == 0 and all(math.isfinite(p.received) for p in outcome.plants):
                break
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode}): see {logfile}")
            await asyncio.sleep(0.2)
        stop_following.set()
        await follower
    finally:
        producer.stopped = True
        stop_following.set()
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        for topic in topics:
            with contextlib.suppress(Exception):
                await offsets.admin.delete_topics([topic])
        await offsets.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return outcome


def _num(value: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:,.{digits}f}"


def render(args: argparse.Namespace, outcomes: list[Outcome]) -> str:
    settings = outcomes[0].settings
    shown = ", ".join(f"FAULTSTREAM_{name.upper()}={value}" for name, value in settings.items())
    lines = [
        f"faultstream event-to-incident latency: one worker, {args.nodes} nodes x {GPUS} GPUs, "
        f"one planted XID 79 every {args.plant_every:g} s, {args.seconds:g} s a rate after warm-up",
        f"worker settings used: {shown}",
        f"mix a second: {args.app_xids:g} application XIDs, {args.job_events:g} job starts/ends, "
        f"the plants, ECC samples for the rest; event time = wall time",
        f"producer: every {args.tick_ms:g} ms the records made since the last tick go out, one message per "
        f"topic partition (<= {args.records_per_message} records, newline-delimited)",
        "latency = incident received on the incidents topic - planted XID's message handed to the producer;",
        "incidents are sent after the worker's ClickHouse flush at its commit point, so an incident on the "
        "topic means its row is in ClickHouse",
        "(chdb cannot be read from another process while the worker holds it; not checked apart)",
        f"machine: {os.cpu_count()} CPUs, load average (1 min) at the end: {os.getloadavg()[0]:.1f}",
        "",
    ]
    header = (
        f"{'rate/s':>8}{'actual/s':>10}{'seconds':>9}{'records':>11}{'messages':>10}{'planted':>9}"
        f"{'matched':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'lag msgs':>10}"
        f"{'caught up s':>13}"
    )
    lines.append(header)
    for o in outcomes:
        values = o.latencies_ms()
        lines.append(
            f"{o.rate:>8,}{_num(o.actual):>10}{o.seconds:>9.1f}{o.records:>11,}{o.messages:>10,}"
            f"{len(o.plants):>9}{len(values):>9}{_num(percentile(values, 50)):>9}"
            f"{_num(percentile(values, 90)):>9}{_num(percentile(values, 99)):>9}"
            f"{_num(values[-1] if values else math.nan):>9}{o.lag_messages:>10,}"
            f"{_num(o.caught_up_after, 1):>13}"
        )
    lines.append("")
    for o in outcomes:
        kept = "kept" if o.actual >= 0.99 * o.rate else f"did NOT keep ({o.actual / o.rate:.0%} of it)"
        after = f"{o.caught_up_after:.1f} s" if math.isfinite(o.caught_up_after) else "not within --drain"
        lines.append(
            f"at {o.rate:,}/s: the producer {kept} its rate; the worker's lag at the end of the window: "
            f"{o.lag_messages:,} messages; all committed {after} after the producer stopped"
        )
    lines.append("target: p99 < 1,000 ms at 5,000 records/s sustained for 300 s (one worker)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_kafka_argument(parser)
    parser.add_argument("--rates", default="5000,20000", help="records/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=300, help="measured seconds a rate")
    parser.add_argument("--warmup", type=float, default=10, help="at least this, and the first commit")
    parser.add_argument(
        "--tail", type=float, default=10, help="seconds the stream goes on after the window, without plants"
    )
    parser.add_argument(
        "--drain", type=float, default=60, help="seconds to wait, once the producer stopped, for the rest"
    )
    parser.add_argument("--nodes", type=int, default=1000, help="fleet size (8 GPUs a node)")
    parser.add_argument("--plant-every", type=float, default=1.0, help="seconds between planted XID 79s")
    parser.add_argument("--app-xids", type=float, default=2.0, help="application XIDs a second")
    parser.add_argument("--job-events", type=float, default=0.1, help="job starts and ends a second")
    parser.add_argument("--tick-ms", type=float, default=5.0, help="producer batching interval")
    parser.add_argument(
        "--records-per-message",
        type=int,
        default=MAX_RECORDS_A_MESSAGE,
        help="records a message at most (1: a producer that sends one record a message)",
    )
    parser.add_argument(
        "--partitions", type=int, help="FAULTSTREAM_TOPIC_PARTITIONS (default: the setting's)"
    )
    parser.add_argument("--flush-seconds", type=float, help="FAULTSTREAM_WORKER_FLUSH_SECONDS")
    parser.add_argument("--idle-seconds", type=float, help="FAULTSTREAM_WORKER_IDLE_SECONDS")
    parser.add_argument(
        "--worker-env", action="append", default=[], metavar="NAME=VALUE", help="any other worker setting"
    )
    parser.add_argument(
        "--workdir", type=Path, help="stores and worker logs (default: a temp folder, removed)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI: 200 records/s for 5 s")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args(argv)
    if args.records_per_message < 1:
        parser.error("--records-per-message: at least 1")
    if args.smoke:
        args.rates, args.seconds, args.nodes, args.warmup, args.tail, args.drain = (
            "200",
            5.0,
            50,
            3.0,
            5.0,
            30.0,
        )
    args.rates = [int(part) for part in args.rates.split(",") if part.strip()]
    if not args.rates or min(args.rates) < 1 or args.seconds <= 0:
        parser.error("--rates needs numbers >= 1 and --seconds must be positive")
    if args.seconds / args.plant_every > args.nodes * PLANT_GPUS:
        parser.error("more plants than GPUs to plant on: raise --nodes or --plant-every")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="latency-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    outcomes = []
    try:
        for rate in args.rates:
            log(f"rate {rate:,} records/s ...")
            outcomes.append(asyncio.run(measure_rate(args, rate, workdir)))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render(args, outcomes), flush=True)
    if args.json:  # latencies in planting order, null for a plant whose incident never came
        print(json.dumps([
            {"rate": o.rate, "actual": o.actual, "seconds": o.seconds, "records": o.records,
             "messages": o.messages, "planted": len(o.plants),
             "plants": [{"node": p.node, "gpu": p.gpu, "ts_ms": p.ts_ms,
                         "latency_ms": (p.received - p.sent) * 1000 if math.isfinite(p.received) else None}
                        for p in o.plants],
             "lag_messages": o.lag_messages, "caught_up_after": o.caught_up_after, "settings": o.settings}
            for o in outcomes
        ]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
