"""Kafka worker throughput next to the consumers it could be compared with, in records/s, one table.

    python benchmarks/worker_throughput.py --kafka 127.0.0.1:9092            # 100 nodes x 30 days, 3 runs
    python benchmarks/worker_throughput.py --kafka HOST:PORT --nodes 200 --days 30 --runs 5 \\
        --per-message 1,16,256 --partitions 1 --workdir /tmp/wbench
    python benchmarks/worker_throughput.py --kafka HOST:PORT --smoke       # 8 nodes x 1 day, 1 run (CI)

It simulates a cluster once (``faultstream simulate``; the inputs are kernel.log, sacct.txt and
dcgm.prom) and, for each records-a-message setting of ``--per-message``, publishes it once to
fresh topics (``faultstream replay --to --records-per-message N``), then times every row below
once a round, ``--runs`` rounds one after the other, each figure the median of its ``--runs`` runs:

1. a bare aiokafka consumer (``benchmarks/bare_consumer.py``, a process of its own like every
   row): assigns the xid, ecc and jobs partitions, reads them from the beginning, splits every
   message value on ``b"\\n"`` and ``orjson.loads`` every non-empty line; then the same consumer
   decoding each line into its validated record (``decode_record``, what the worker does before
   anything else: SPEC's "reads and decodes"; the first row is the floor);
2. a minimal quix-streams application (``benchmarks/quix_decode_only.py``; ``pip install -e
   .[bench]``) doing the same in a fresh consumer group — what a Python team would pick instead
   of Faust; the row says "not installed" when the package is missing;
3. a Faust agent doing the same (``benchmarks/faust_decode_only.py``): Faust's own cost;
4. ``faultstream worker``, with a fresh app id (consumer group), checkpoint, jobs-by-node,
   incidents and dead-letter topics and store each run: timed from its launch until the group's
   committed offsets reach the end offsets of xid, ecc, jobs and jobs-by-node, polled every
   0.2 s through ONE admin client and ONE consumer (end offsets) that live for the whole benchmark,
   and its /metrics page says nothing is held or short of a commit point (a commit point
   checkpoints the records the merge holds for the fleet stage and commits past them:
   :func:`stream.worker.caught_up.caught_up_on_gauges`, what the tests wait for too), with
   ``FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS=1`` (the input is all published before the worker
   starts: the fleet stage need not wait 30 s for the end of a partition before the last periods);
5. the embedded replay of the same files (``faultstream replay FILES --data-dir DIR --json``; no
   Kafka): the whole command, and the replay's own ``seconds``; as it runs by default (a file of
   8 MiB or more, here the DCGM scrape, parsed by a helper process on the other CPU), then with
   every file parsed in process (``FAULTSTREAM_PARSE_AHEAD_MIN_BYTES=0``: one CPU, as the worker's
   own work runs);
6. the detection core alone (``benchmarks/core_alone.py``): the replay's records parsed and merged
   beforehand, then only ``DetectionCore.process`` for each (the fleet stage in process), timed
   over that loop: no input, no decoding, no output. No path running this core can go faster, so
   its ratio to the bare consumer is the ceiling of the worker's.

How records are counted: a message value holds one or more newline-delimited records. Every row
is in records/s of the same records: those of the xid, ecc and jobs topics as published (replay
--to's ``sent``, checked against the lines found by reading the topics); the embedded replay's are
the records it used (its ``events``, the same files). The worker also reads its own jobs-by-node
copies of the jobs (one per partition holding a node of the job): internal traffic, reported
apart (records/messages), never added to the records. For the worker's "steady" figure, the
records its first commit covered are found from its committed offsets through a per-offset index
of the records each message holds (built by one untimed read of the topics).

Two figures a row: "launch" counts from the process launch to the last record (the bare
consumer ran in this process until 2026-12: its figure lacked the interpreter's start and
imports every other row's has); "steady" from the first message received (bare consumer, quix,
Faust), the first commit seen (worker; its first ``worker_flush_seconds`` are not in it) or the
replay's own timing (embedded: reading, detection and ClickHouse writes without interpreter
start-up and report).
quix-streams' librdkafka consumer fetches in a background thread while the app is still starting,
so its steady figure can pass the bare consumer's; its launch figure is the one to compare.
The ratios compare the worker with the embedded replay (target >= 0.8) and with the bare consumer
(target >= 0.25, stretch 0.5), launch with launch and steady with steady: each is the median of
the rounds' ratios, a ratio of two runs seconds apart (this machine's speed drifts by a third
between minutes; with every replay run first, the worker's runs half a minute later, one table's
ratio at 256 records a message was 1.15 and the next one's 0.72).

Progress goes to stderr, the table to stdout. Every topic the benchmark creates is deleted at the
end; the work folder too unless ``--workdir`` was given.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import compileall
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError

from stream.settings import Settings
from stream.worker.caught_up import caught_up_on_gauges, metric_sum

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLI = [sys.executable, "-m", "stream.cli"]
INPUTS = ("kernel.log", "sacct.txt", "dcgm.prom")
#: What a launch of the product imports from this checkout (byte-compiled before the runs).
PRODUCT_PACKAGES = ("stream", "detectors", "schemas")
#: The topic settings, by name without the prefix (XID, ECC, ..., FLEET_BASELINES).
TOPIC_SETTINGS = tuple(name.removeprefix("FAULTSTREAM_TOPIC_") for name in Settings.topic_env_names())
#: Topics every worker run gets afresh (the worker writes them; a second run must not read the first's).
PER_RUN_TOPICS = (
    "JOBS_BY_NODE", "KERNEL_LOG_BY_NODE", "INCIDENTS", "DEAD_LETTERS", "CHECKPOINTS", "FLEET",
    "FLEET_BASELINES",
)  # fmt: skip
#: How often a worker run's committed offsets are read (the embedded replay is timed to its exit:
#: at 0.2 s the worker's figure carried ~0.1 s of waiting for the next read, 2% of a run). The
#: metrics page, whose rendering costs the worker CPU, is read only once the offsets are at the end.
POLL_SECONDS = 0.05
#: The input is published before the worker starts, so the fleet stage need not wait long for a
#: partition with nothing left to read before it decides the last periods (the setting's default,
#: 30 s, leaves a live publisher time to reach every partition; the tests use 5 s).
FLEET_IDLE_SECONDS = 1.0
#: Input topic setting -> the record kind its lines decode to.
INPUT_KINDS = {"XID": "xid", "ECC": "ecc", "JOBS": "job"}
#: The topic a Faust app (worker or decode-only agent) creates for its group's leader election.
FAUST_LEADER_TOPIC = "{}-__assignor-__leader"

ROWS = {
    "bare": "bare aiokafka consumer (split + orjson)",
    "validated": "bare consumer + validation (decode_record)",
    "quix": "quix-streams app (split + orjson)",
    "faust": "Faust decode-only agent (split + orjson)",
    "worker": "faultstream worker",
    "embedded": "embedded replay, same files (no Kafka)",
    "embedded1": "embedded replay, files parsed in process (1 CPU)",
    "core": "detection core alone, records in memory (no I/O)",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Measurement:
    """One run of one row: records/s from launch and in the steady part (NaN: not measurable)."""

    launch: float
    steady: float


@dataclass
class Published:
    """One records-a-message setting's topics, what was published and the per-offset index."""

    per_message: int
    env: dict[str, str]
    inputs: list[str]  # xid, ecc, jobs topics
    sent: dict[str, int]
    messages: dict[str, int]
    index: dict[TopicPartition, tuple[list[int], list[int]]] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(self.sent.values())

    def records_before(self, tp: TopicPartition, offset: int) -> int:
        """Records in the messages of ``tp`` before ``offset`` (a committed offset: the next to read)."""
        offsets, cumulative = self.index.get(tp, ([], [0]))
        return cumulative[bisect.bisect_left(offsets, offset)]


@dataclass
class Results:
    """Every measurement, by row and records-a-message setting; a string says why a row has none."""

    runs: dict[tuple[str, int], list[Measurement]] = field(default_factory=dict)
    notes: dict[tuple[str, int], str] = field(default_factory=dict)
    jobs_by_node: dict[int, tuple[int, int]] = field(default_factory=dict)  # records, messages
    #: Per worker run, seconds from "processed" to "done" (the end of the input's tail).
    tails: list[float] = field(default_factory=list)

    def add(self, row: str, per_message: int, measurement: Measurement) -> None:
        self.runs.setdefault((row, per_message), []).append(measurement)

    def median(self, row: str, per_message: int) -> Measurement | None:
        runs = self.runs.get((row, per_message))
        if not runs:
            return None
        return Measurement(_median([m.launch for m in runs]), _median([m.steady for m in runs]))

    def ratio(self, row: str, other: str, per_message: int) -> Measurement | None:
        """``row`` over ``other``, the median of the ratios of the runs of one round each."""
        runs, others = self.runs.get((row, per_message)), self.runs.get((other, per_message))
        if not runs or not others:
            return None
        pairs = list(zip(runs, others, strict=True))
        return Measurement(
            _median([a.launch / b.launch for a, b in pairs]), _median([a.steady / b.steady for a, b in pairs])
        )


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def deployment_env(bootstrap: str, prefix: str, partitions: int) -> dict[str, str]:
    """FAULTSTREAM_* variables naming ``prefix``-ed topics and consumer group."""
    return {
        **os.environ,
        "FAULTSTREAM_KAFKA_BOOTSTRAP": bootstrap,
        "FAULTSTREAM_TOPIC_PARTITIONS": str(partitions),
        "FAULTSTREAM_WORKER_APP_ID": prefix,
        "FAULTSTREAM_METRICS_PORT": "0",
        **{f"FAULTSTREAM_TOPIC_{name}": f"{prefix}.{name.lower()}" for name in TOPIC_SETTINGS},
    }


def topics_of(env: dict[str, str], names: Sequence[str] = TOPIC_SETTINGS) -> list[str]:
    return [env[f"FAULTSTREAM_TOPIC_{name}"] for name in names]


def run_cli(args: list[str], env: dict[str, str]) -> str:
    """Run a faultstream command; return its stdout (raise with its stderr if it fails)."""
    done = subprocess.run([*CLI, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"faultstream {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


class Kafka:
    """The benchmark's long-lived clients: an admin client (committed offsets of any group, topic
    deletion) and a consumer without a group (end offsets, and reading topics)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
        self.offsets = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.created: list[str] = []

    async def __aenter__(self) -> Kafka:
        await self.admin.start()
        await self.offsets.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.offsets.stop()
        await self.admin.close()

    async def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        described = await self.admin.describe_topics(list(topics))
        found = {d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described}
        return [TopicPartition(t, p) for t in topics for p in found.get(t, [])]

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self.offsets.end_offsets(list(tps)))

    async def committed(self, group: str) -> dict[TopicPartition, int]:
        try:
            answer = await self.admin.list_consumer_group_offsets(group)
        except GroupCoordinatorNotAvailableError:
            # A fresh broker creates its offsets topic at the first group's lookup: nothing
            # is committed until it has.
            return {}
        return {tp: meta.offset for tp, meta in answer.items() if meta.offset >= 0}

    async def delete(self, topics: Sequence[str]) -> None:
        for topic in topics:
            with contextlib.suppress(Exception):  # absent, or already deleted
                await self.admin.delete_topics([topic])


async def read_index(
    kafka: Kafka, topics: Sequence[str]
) -> tuple[dict[TopicPartition, tuple[list[int], list[int]]], dict[str, int], dict[str, int]]:
    """Read ``topics`` to their current end (untimed): per partition the offsets and the records
    before each, and the records and messages per topic."""
    tps = await kafka.partitions(topics)
    ends = await kafka.end_offsets(tps)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    index: dict[TopicPartition, tuple[list[int], list[int]]] = {tp: ([], [0]) for tp in tps}
    records = dict.fromkeys(topics, 0)
    messages = dict.fromkeys(topics, 0)
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        left = {tp for tp in tps if ends[tp] > 0}
        while left:
            for tp, batch in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).items():
                offsets, cumulative = index[tp]
                for message in batch:
                    count = sum(1 for line in message.value.split(b"\n") if line.strip())
                    offsets.append(message.offset)
                    cumulative.append(cumulative[-1] + count)
                    records[tp.topic] += count
                    messages[tp.topic] += 1
                    if message.offset + 1 >= ends[tp]:
                        left.discard(tp)
    finally:
        await consumer.stop()
    return index, records, messages


def decode_app(
    script: str, bootstrap: str, group: str, wanted: int, topics: Sequence[str], workdir: Path
) -> Measurement:
    """Rows 1 to 3: a consumer or decode-only app in a process of its own, timed from its launch;
    it writes what it read to a result file."""
    result = workdir / f"{group}.json"
    logfile = workdir / "logs" / f"{group}.log"
    launched = time.time()
    with logfile.open("w") as out:
        done = subprocess.run(
            [sys.executable, str(HERE / script), bootstrap, group, str(wanted), str(result), *topics],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=1800, check=False,
        )  # fmt: skip
    if done.returncode or not result.exists():
        tail = logfile.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{script} failed ({done.returncode}); its log {logfile} ends:\n{tail}")
    data = json.loads(result.read_text())
    if data["records"] != wanted:
        raise SystemExit(f"{script}: decoded {data['records']} records, expected {wanted}")
    return Measurement(wanted / (data["end"] - launched), wanted / (data["end"] - data["first"]))


async def worker_run(
    kafka: Kafka, published: Published, run: int, workdir: Path, results: Results
) -> Measurement:
    """Row 4: one ``faultstream worker`` with its own group, internal topics and store."""
    n = published.per_message
    group = f"{published.env['FAULTSTREAM_WORKER_APP_ID']}-worker{run}"
    env = {**published.env, "FAULTSTREAM_WORKER_APP_ID": group}
    for name in PER_RUN_TOPICS:
        env[f"FAULTSTREAM_TOPIC_{name}"] = f"{group}.{name.lower().replace('_', '-')}"
    data_dir = workdir / f"worker-{n}-{run}"
    env["FAULTSTREAM_DATA_DIR"] = str(data_dir)
    metrics_port = free_port()
    env["FAULTSTREAM_METRICS_PORT"] = str(metrics_port)
    env["FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS"] = str(FLEET_IDLE_SECONDS)
    own_topics = [*topics_of(env, PER_RUN_TOPICS), FAUST_LEADER_TOPIC.format(group)]
    kafka.created.extend(own_topics)
    run_cli(["init-kafka"], env)
    inputs = await kafka.partitions(published.inputs)
    jobs_by_node = await kafka.partitions([env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]])
    input_ends = await kafka.end_offsets(inputs)
    total = published.records
    logfile = workdir / "logs" / f"{group}.log"
    with logfile.open("w") as out:
        launched = time.perf_counter()
        worker = subprocess.Popen([*CLI, "worker", "--clickhouse", f"chdb://{data_dir / 'store'}"],
                                  env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        first: tuple[float, int] | None = None
        processed: float | None = None
        try:
            deadline = time.monotonic() + 3600
            while True:
                await asyncio.sleep(POLL_SECONDS)
                committed = await kafka.committed(group)
                now = time.perf_counter()
                done = sum(published.records_before(tp, committed.get(tp, 0)) for tp in inputs)
                if first is None and any(committed.get(tp, 0) for tp in inputs):
                    first = (now, done)
                if all(committed.get(tp, 0) >= input_ends[tp] for tp in inputs):
                    ends = await kafka.end_offsets(jobs_by_node)  # final once every job is committed
                    # Committed is not processed: a commit point checkpoints the records the merge
                    # still holds (for the fleet stage) and commits past them. Processed: every
                    # input offset committed and nothing held back. Done, what the tests wait
                    # for: the gauges say nothing is pending (the fleet stage's decisions at the
                    # end of the input, and the commit point after them), reported apart.
                    if all(committed.get(tp, 0) >= ends[tp] for tp in jobs_by_node):
                        page = metrics_page(metrics_port)
                        if (
                            processed is None
                            and page
                            and not metric_sum(page, "faultstream_merge_held_records")
                        ):
                            processed = now
                        if caught_up_on_gauges([page]):
                            break
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited ({worker.returncode}) early: see {logfile}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not catch up within an hour: see {logfile}")
        finally:
            stop_process(worker)
    assert first is not None and processed is not None
    start_at, done_at_first = first
    steady = (total - done_at_first) / (processed - start_at) if processed > start_at else math.nan
    _, jbn_records, jbn_messages = await read_index(kafka, [env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]])
    results.jobs_by_node[n] = (sum(jbn_records.values()), sum(jbn_messages.values()))
    log(
        f"  worker run {run}: {processed - launched:.1f} s from launch, first commit at "
        f"{start_at - launched:.1f} s covering {done_at_first:,} records; all done {now - processed:.1f} s "
        f"later; jobs-by-node copies {results.jobs_by_node[n][0]:,} records in "
        f"{results.jobs_by_node[n][1]:,} messages"
    )
    results.tails.append(now - processed)
    await kafka.delete(own_topics)
    shutil.rmtree(data_dir, ignore_errors=True)
    return Measurement(total / (processed - launched), steady)


def stop_process(process: subprocess.Popen[Any], timeout: float = 60) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``timeout`` seconds."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def work_folder(given: Path | None, prefix: str) -> Iterator[Path]:
    """The benchmark's work folder: ``given`` (kept), or a temporary one (deleted at the end)."""
    folder = given or Path(tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if given is None:
            shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the worker's metrics endpoint)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metrics_page(port: int) -> str | None:
    """The worker's /metrics page, or None while its endpoint does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def embedded_run(
    files: list[Path], workdir: Path, run: int, one_cpu: bool = False
) -> tuple[Measurement, int]:
    """Row 5: the embedded replay of the same files, the whole command timed; ``one_cpu``: every
    file parsed in process (by default large files are parsed by a helper on another CPU)."""
    data_dir = workdir / f"embedded-{run}"
    env = {**os.environ, "FAULTSTREAM_METRICS_PORT": "0"}
    if one_cpu:
        env["FAULTSTREAM_PARSE_AHEAD_MIN_BYTES"] = "0"
    launched = time.perf_counter()
    out = run_cli(["replay", *map(str, files), "--data-dir", str(data_dir), "--no-progress", "--json"], env)
    elapsed = time.perf_counter() - launched
    summary = json.loads(out)
    shutil.rmtree(data_dir, ignore_errors=True)
    events = int(summary["events"])
    return Measurement(events / elapsed, events / summary["seconds"]), events


def core_alone_run(files: list[Path], records: int) -> Measurement:
    """The last row: the detection core alone on the replay's records, parsed beforehand in its
    process (``core_alone.py``); what any path running this core can reach at most. No launch
    figure: only the core is timed."""
    done = subprocess.run(
        [sys.executable, str(HERE / "core_alone.py"), *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"core_alone.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    data = json.loads(done.stdout)
    if data["records"] != records:
        raise SystemExit(f"core_alone.py: {data['records']} records, the embedded replay {records}")
    return Measurement(math.nan, data["records"] / data["seconds"])


def quix_version() -> str | None:
    if importlib.util.find_spec("quixstreams") is None:
        return None
    return importlib.metadata.version("quixstreams")


async def publish(kafka: Kafka, args: argparse.Namespace, files: list[Path], per_message: int) -> Published:
    prefix = f"bench{uuid.uuid4().hex[:6]}-m{per_message}"
    env = deployment_env(args.kafka, prefix, args.partitions)
    kafka.created.extend(topics_of(env))
    run_cli(["init-kafka"], env)
    out = run_cli(
        ["replay", *map(str, files), "--to", f"kafka://{args.kafka}", "--records-per-message",
         str(per_message), "--no-progress", "--json"],
        env,
    )  # fmt: skip
    summary = json.loads(out)
    inputs = topics_of(env, ("XID", "ECC", "JOBS"))
    published = Published(per_message, env, inputs, summary["sent"], summary["messages"])
    index, records, messages = await read_index(kafka, inputs)
    published.index = index
    if records != {t: published.sent.get(t, 0) for t in inputs}:
        raise SystemExit(f"records read {records} differ from records sent {published.sent}")
    if messages != {t: published.messages.get(t, 0) for t in inputs}:
        raise SystemExit(f"messages read {messages} differ from messages sent {published.messages}")
    if summary.get("dead_letters"):
        log(f"  note: {summary['dead_letters']} dead letters while publishing (not counted)")
    return published


async def measure(args: argparse.Namespace, files: list[Path], workdir: Path) -> tuple[Results, dict]:
    results = Results()
    facts: dict = {"quix": quix_version(), "load": [os.getloadavg()[0]]}
    async with Kafka(args.kafka) as kafka:
        try:
            for n in args.per_message:
                log(f"publishing at {n} records a message ...")
                published = await publish(kafka, args, files, n)
                facts.setdefault("published", {})[n] = published
                log(f"  {published.records:,} records in {sum(published.messages.values()):,} messages")
                partitions = collections.Counter(tp.topic for tp in await kafka.partitions(published.inputs))
                kinds = {
                    published.env[f"FAULTSTREAM_TOPIC_{name}"]: kind for name, kind in INPUT_KINDS.items()
                }
                if facts["quix"] is None:
                    results.notes[("quix", n)] = "not installed"
                # Every row once a round, the rounds one after the other: a ratio compares runs
                # of one round, seconds apart, so the machine's drift over the command (its
                # speed moved by a third between minutes here) falls on both of its sides.
                for run in range(args.runs):
                    log(f"  round {run + 1} of {args.runs}:")
                    label = f"{published.env['FAULTSTREAM_WORKER_APP_ID']}-bare{run}"
                    specs = [f"{topic}:{count}" for topic, count in partitions.items()]
                    m = decode_app("bare_consumer.py", args.kafka, label, published.records, specs, workdir)
                    log(f"    bare consumer: {m.launch:,.0f} / {m.steady:,.0f} records/s")
                    results.add("bare", n, m)
                    m = decode_app("bare_consumer.py", args.kafka, f"{label}-validated", published.records,
                                   [f"{topic}:{partitions[topic]}={kind}" for topic, kind in kinds.items()],
                                   workdir)  # fmt: skip
                    log(f"    bare consumer + validation: {m.launch:,.0f} / {m.steady:,.0f} records/s")
                    results.add("validated", n, m)
                    if facts["quix"] is not None:
                        group = f"{published.env['FAULTSTREAM_WORKER_APP_ID']}-quix{run}"
                        m = decode_app("quix_decode_only.py", args.kafka, group, published.records,
                                       published.inputs, workdir)  # fmt: skip
                        log(f"    quix-streams: {m.launch:,.0f} / {m.steady:,.0f} records/s")
                        results.add("quix", n, m)
                    group = f"{published.env['FAULTSTREAM_WORKER_APP_ID']}-faust{run}"
                    kafka.created.append(FAUST_LEADER_TOPIC.format(group))
                    m = decode_app("faust_decode_only.py", args.kafka, group, published.records,
                                   published.inputs, workdir)  # fmt: skip
                    log(f"    Faust decode-only: {m.launch:,.0f} / {m.steady:,.0f} records/s")
                    results.add("faust", n, m)
                    for row, one_cpu in (("embedded", False), ("embedded1", True)):
                        m, facts["embedded_records"] = embedded_run(files, workdir, run, one_cpu)
                        log(f"    {row}: {m.launch:,.0f} records/s whole command, {m.steady:,.0f} own")
                        results.add(row, n, m)
                    m = core_alone_run(files, facts["embedded_records"])
                    log(f"    core alone: {m.steady:,.0f} records/s")
                    results.add("core", n, m)
                    m = await worker_run(kafka, published, run, workdir, results)
                    log(f"    worker: {m.launch:,.0f} / {m.steady:,.0f} records/s")
                    results.add("worker", n, m)
        finally:
            facts["load"].append(os.getloadavg()[0])
            log(f"deleting {len(kafka.created)} topics")
            await kafka.delete(kafka.created)
    return results, facts


def _setting(per_message: int) -> str:
    return "1 record a message" if per_message == 1 else f"{per_message} records a message"


def _ratio(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.3g}"


def _num(value: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:,.{digits}f}"


def render(args: argparse.Namespace, results: Results, facts: dict) -> str:
    settings = args.per_message
    published: dict[int, Published] = facts["published"]
    label_width = 52
    cell_width = 26
    lines = []
    first = published[settings[0]]
    parts = " + ".join(f"{t.rsplit('.', 1)[1]} {first.sent.get(t, 0):,}" for t in first.inputs)
    lines.append(
        f"faultstream worker throughput: {args.nodes} nodes x {args.days:g} days (DCGM scraped every "
        f"{args.ecc_interval_minutes:g} min), {args.partitions} partition(s), records/s, median of "
        f"{args.runs} run(s)"
    )
    embedded = facts["embedded_records"]
    lines.append(f"records a run: {first.records:,} = {parts} (embedded replay: {embedded:,})")
    load = " / ".join(f"{x:.1f}" for x in facts["load"])
    lines.append(f"machine: {os.cpu_count()} CPUs, load average (1 min) at start / end: {load}")
    lines.append("")
    head = "".join(f"{_setting(n):>{cell_width}}" for n in settings)
    sub = "".join(f"{'launch':>13}{'steady':>13}" for _ in settings)
    lines.append(f"{'':<{label_width}}{head}")
    lines.append(f"{'records/s':<{label_width}}{sub}")
    for row, label in ROWS.items():
        if row == "quix" and facts["quix"]:
            label = f"quix-streams {facts['quix']} app (split + orjson)"
        cells = []
        for n in settings:
            m = results.median(row, n)
            if m is None:
                note = results.notes.get((row, n), "not run")
                cells.append(f"{note[: cell_width - 2]:>{cell_width}}")
            else:
                cells.append(f"{_num(m.launch):>13}{_num(m.steady):>13}")
        lines.append(f"{label:<{label_width}}{''.join(cells)}")
    lines.append("")
    for row, other, label in (
        ("worker", "embedded", "ratio worker / embedded replay (target >= 0.8)"),
        ("worker", "embedded1", "ratio worker / embedded replay on 1 CPU"),
        ("worker", "bare", "ratio worker / bare consumer (>= 0.25, stretch 0.5)"),
        ("worker", "validated", "ratio worker / bare consumer + validation"),
        ("core", "bare", "ratio core alone / bare consumer (a ceiling)"),
        ("worker", "core", "ratio worker / core alone"),
    ):
        cells = []
        for n in settings:
            ratio = results.ratio(row, other, n)
            if ratio is None:
                cells.append(f"{'n/a':>{cell_width}}")
            else:
                cells.append(f"{_ratio(ratio.launch):>13}{_ratio(ratio.steady):>13}")
        lines.append(f"{label:<{label_width}}{''.join(cells)}")
    lines.append("")
    cells = []
    for n in settings:
        p = published[n]
        counts = " / ".join(f"{p.messages.get(t, 0):,}" for t in p.inputs)
        cells.append(f"{counts:>{cell_width}}")
    lines.append(f"{'messages xid / ecc / jobs':<{label_width}}{''.join(cells)}")
    cells = []
    for n in settings:
        records, messages = results.jobs_by_node.get(n, (0, 0))
        cells.append(f"{f'{records:,} / {messages:,}':>{cell_width}}")
    lines.append(f"{'jobs-by-node copies, records / messages (apart)':<{label_width}}{''.join(cells)}")
    lines.append("")
    lines.append(
        "launch: from process launch to the last record; steady: from the "
        "first message (worker: first commit; embedded: the replay's own seconds; core alone: its loop "
        "over records parsed beforehand). Ratios: the median of the rounds' ratios (every row runs "
        "once a round)."
    )
    lines.append(
        "every row launches from this checkout, its modules byte-compiled first, as `pip install` does "
        "(PYTHONDONTWRITEBYTECODE would have them compiled from source at every launch)."
    )
    tail = f"{min(results.tails, default=0):.1f}-{max(results.tails, default=0):.1f}"
    lines.append(
        "worker's last record: every input offset committed and nothing held back by its merge; after "
        f"that, the end of the input took {tail} s "
        f"more (the fleet stage's wait for idle partitions, FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS="
        f"{FLEET_IDLE_SECONDS:g}, and the commit point after its decisions)."
    )
    if facts["quix"]:
        lines.append(
            "quix-streams' librdkafka fetches in the background while the app starts, so its steady "
            "figure can pass the bare consumer's: compare its launch figure."
        )
    else:
        lines.append("quix-streams: pip install -e .[bench] for its row.")
    return "\n".join(lines)


def add_kafka_argument(parser: argparse.ArgumentParser) -> None:
    """``--kafka``, as every benchmark that needs the broker takes it."""
    parser.add_argument(
        "--kafka",
        default=os.environ.get("FAULTSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="bootstrap HOST:PORT (default FAULTSTREAM_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser, runs_help: str) -> None:
    """The options of a worker benchmark on a simulated cluster (this one, worker_settings.py):
    the broker, the work folder, the cluster's size, the runs, the partitions and ``--smoke``."""
    add_kafka_argument(parser)
    parser.add_argument(
        "--workdir", type=Path, help="simulation, stores and logs (default: a temp folder, removed)"
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument(
        "--ecc-interval-minutes",
        type=float,
        default=360.0,
        help="DCGM scrape period of the simulated cluster (the simulator's default, 360; DCGM "
        "exporters scrape every 0.5-1 minute, where ECC samples are nearly all the records)",
    )
    parser.add_argument("--runs", type=int, default=3, help=runs_help)
    parser.add_argument("--partitions", type=int, default=1, help="partitions of xid, ecc, jobs-by-node")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI: 8 nodes x 1 day, 1 run")


def cluster_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, a ``--smoke`` run made tiny (8 nodes x 1 day, 1 run)."""
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.runs = 8, 1.0, 1
    return args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_cluster_arguments(parser, "runs a row; the table shows the median")
    parser.add_argument("--per-message", default="1,256", help="records-a-message settings, comma-separated")
    args = cluster_arguments(parser, argv)
    args.per_message = [int(part) for part in args.per_message.split(",") if part.strip()]
    if not args.per_message or min(args.per_message) < 1 or args.runs < 1:
        parser.error("--per-message needs numbers >= 1 and --runs at least 1")
    return args


def byte_compile_product() -> None:
    """Byte-compile the product's packages, as ``pip install`` does for the image.

    Every row launches ``faultstream`` from this checkout (an editable install), and where
    ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it) each launch compiled the ~14,000
    lines it imports from source again: ~0.2 s a launch, more for the worker, which imports more.
    Python reads the compiled files whatever that variable says; a source changed later is
    compiled again in memory, as before.
    """
    for package in PRODUCT_PACKAGES:
        if not compileall.compile_dir(ROOT / package, quiet=1):
            raise SystemExit(f"byte-compiling {ROOT / package} failed")


def on_simulated_cluster(
    args: argparse.Namespace, prefix: str, table: Callable[[list[Path], Path], str]
) -> int:
    """Simulate ``args.nodes`` x ``args.days`` into the work folder (``--workdir``, or a temp
    folder ``prefix``..., removed after), print ``table(files, workdir)`` for its input files."""
    # The long-lived clients warn about the benchmark's own deleted topics still in their metadata.
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("aiokafka.cluster").setLevel(logging.CRITICAL)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    byte_compile_product()
    try:
        sim = workdir / "sim"
        log(f"simulating {args.nodes} nodes x {args.days:g} days into {sim} ...")
        run_cli(["simulate", "--nodes", str(args.nodes), "--days", str(args.days),
                 "--ecc-interval-minutes", str(args.ecc_interval_minutes), "--out", str(sim)],
                dict(os.environ))  # fmt: skip
        print(table([sim / name for name in INPUTS], workdir), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def table(files: list[Path], workdir: Path) -> str:
        return render(args, *asyncio.run(measure(args, files, workdir)))

    return on_simulated_cluster(args, "worker-throughput-", table)


if __name__ == "__main__":
    sys.exit(main())
