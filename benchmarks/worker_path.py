"""The worker's per-record path without Kafka: decode, event-time merge, release, detection core.

    python benchmarks/worker_path.py --sim DIR            # a simulation already made
    python benchmarks/worker_path.py --nodes 60 --days 1 --ecc-interval-minutes 1
    python benchmarks/worker_path.py --smoke              # tiny input, for CI: checks it runs

What ``faultstream worker`` does with each message once Faust hands it over, on one partition,
timed in parts, with nothing else in the process: the records of a simulated cluster are cut into
messages as ``replay --to`` cuts them (:class:`~stream.kafka.publish.MessageBatcher`, one partition
a topic), and each message is decoded (``decode_message_lines``), added to the partition's merge
and released through its pipeline into the core (``PartitionWorker.process_released``), as
``WorkerRuntime.apply`` does. A source counts as idle once none of its messages is left (a
backlog, all of it fetched): the merge orders the three topics by event time as the worker's does.
The core runs the fleet stage in process, as the embedded replay's does (the worker's stage is
elsewhere and decides the same things; it is not timed here), and writes into a sink that writes
nothing and keeps what the core decided. Beside it, the core alone on the same records in memory
(``core_alone.py``'s loop): the path's ratio to it is what decoding and the merge cost on top of
detection. The outputs of the two are compared by a digest of every incident and row, sorted (the
merge must hand the core the records in the replay's order for them to be equal).

Kafka, Faust, ClickHouse and checkpoints are left out on purpose: this is the part of the
worker's time that is ours alone, to be measured without the broker's noise (a code change's
effect on it shows here in one run; in ``worker_throughput.py`` it drowns in the machine's drift).
Median of ``--runs`` runs, taking turns with the core alone.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core_alone import core_seconds, replay_records, run_through

from detectors.core import DetectionCore, Emitted
from schemas.records import RECORD_KIND, InvalidRecord, Record
from stream.gc_tuning import tune_for_streaming
from stream.kafka.codec import decode_message_lines, encode_record, record_key
from stream.kafka.publish import MessageBatcher, OutgoingMessage
from stream.pipeline import RecordPipeline
from stream.settings import Settings
from stream.simulator import SimulationConfig, simulate
from stream.worker.merge import EventTimeMerger
from stream.worker.partition import HeldLine, PartitionWorker

#: The simulator's files, as ``replay`` takes them.
_FILES = ("kernel.log", "sacct.txt", "dcgm.prom")
#: The merge's sources, one a record kind (the worker's are these, named by topic).
_KINDS = ("ecc", "job", "xid")


@dataclass(frozen=True)
class PathTimes:
    """Seconds of one run through the path, by part, and a digest of what the core emitted."""

    decode: float
    merge_add: float
    release_and_core: float
    digest: str

    @property
    def total(self) -> float:
        return self.decode + self.merge_add + self.release_and_core


class _KeepingSink:
    """A sink that writes nothing (ClickHouse is not what is measured) and keeps what the core
    decided, for the digest."""

    def __init__(self) -> None:
        self.emitted: list[Emitted] = []

    def add(self, item: object, partition: int = 0) -> None:
        pass

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None:
        self.emitted.append(emitted)


class _NoDeadLetters:
    def produce(self, letter: object, batch: int) -> None:
        raise SystemExit(f"a dead letter on simulated input: {letter}")


def messages_of(records: list[Record], per_message: int) -> list[OutgoingMessage]:
    """``records`` cut into messages as ``replay --to`` cuts them, one partition a topic (each
    topic named by its record kind), in publish order."""
    batcher = MessageBatcher(dict.fromkeys(_KINDS, 1), per_message)
    messages: list[OutgoingMessage] = []
    for record in records:
        messages += batcher.add(
            RECORD_KIND[type(record)], record_key(record), record.ts_ms, encode_record(record)
        )
    return messages + batcher.drain()


def in_fair_polls(messages: list[OutgoingMessage], poll_bytes: int) -> list[OutgoingMessage]:
    """``messages`` in the order a worker's fair poll hands them on (:mod:`stream.worker.fetching`)
    with every topic's backlog fetched: polls of about ``poll_bytes``, shared evenly by the topics
    with messages left, at least one message each; each topic's in its own order. A sparse topic
    (XIDs, jobs) is read far ahead of the ECC samples, as in the worker, so the merge does not
    hold the samples until that topic's next message comes."""
    left = {kind: [m for m in reversed(messages) if m.topic == kind] for kind in _KINDS}
    order: list[OutgoingMessage] = []
    while any(left.values()):
        topics = [kind for kind in _KINDS if left[kind]]
        share = poll_bytes // len(topics)
        for kind in topics:
            queue, taken = left[kind], 0
            while queue and (taken == 0 or taken + len(queue[-1].value) <= share):
                taken += len(queue[-1].value)
                order.append(queue.pop())
    return order


def decoded_records(messages: list[OutgoingMessage], records: list[Record]) -> list[Record]:
    """The records the path decodes from ``messages`` (located at their topic offset and line, as
    the worker locates them), in the order of ``records`` (the replay's: the core alone's)."""
    offsets = dict.fromkeys(_KINDS, 0)
    by_kind: dict[str, list[Record]] = {kind: [] for kind in _KINDS}
    for message in messages:
        offset = offsets[message.topic]
        offsets[message.topic] += 1
        for item, _ in decode_message_lines(message.topic, message.value, f"{message.topic}/0", offset):
            if isinstance(item, InvalidRecord):
                raise SystemExit(f"an invalid record on simulated input: {item}")
            by_kind[message.topic].append(item)
    taken = dict.fromkeys(_KINDS, 0)
    ordered: list[Record] = []
    for record in records:
        kind = RECORD_KIND[type(record)]
        ordered.append(by_kind[kind][taken[kind]])
        taken[kind] += 1
    return ordered


def digest_of(emitted: list[Emitted]) -> str:
    """A sha256 of every incident, attribution, MTTF and ECC row in ``emitted``, in sorted order:
    where the drains fall (every message here, every 8,192 records in the core alone) moves the
    fleet stage's decisions among the core's rows, not what they are."""
    rows = sorted(
        repr(row)
        for batch in emitted
        for kind in (batch.incidents, batch.attributions, batch.mttf, batch.ecc_rows)
        for row in kind
    )
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def run_path(messages: list[OutgoingMessage], settings: Settings) -> PathTimes:
    """One run of ``messages`` (in the order they are handed on) through a fresh partition's
    path; seconds by part."""
    remaining = dict.fromkeys(_KINDS, 0)
    for message in messages:
        remaining[message.topic] += 1
    clock = time.monotonic

    def drained(source: str) -> float | None:
        return clock() if remaining[source] == 0 else None  # idle once nothing of it is left to read

    sink = _KeepingSink()
    core = DetectionCore(settings.core_config())
    pipeline = RecordPipeline(core, sink, _NoDeadLetters(), settings.allowed_lateness_seconds)  # type: ignore[arg-type]
    merger: EventTimeMerger[HeldLine] = EventTimeMerger(
        list(_KINDS), idle_after=0.0, clock=clock, drained=drained
    )
    partition = PartitionWorker(0, pipeline, merger)
    decode = merge_add = release = 0.0
    now = time.perf_counter
    offsets = dict.fromkeys(_KINDS, 0)
    for message in messages:
        kind = message.topic
        offset = offsets[kind]
        offsets[kind] += 1
        started = now()
        items = decode_message_lines(kind, message.value, f"{kind}/0", offset)
        decoded: list[tuple[int, HeldLine]] = [
            (item.ts_ms, (item, line)) for item, line in items if not isinstance(item, InvalidRecord)
        ]
        if len(decoded) < len(items):
            raise SystemExit(f"an invalid record on simulated input: {items}")
        decoded_at = now()
        remaining[kind] -= 1
        merger.add_many(kind, decoded)
        del decoded
        added_at = now()
        partition.process_released()  # and drains the core into the sink, as the worker's does
        release += now() - added_at
        merge_add += added_at - decoded_at
        decode += decoded_at - started
    started = now()
    partition.process_released()  # every source drained: the rest of the merge
    pipeline.finish()
    release += now() - started
    if len(merger):
        raise SystemExit(f"{len(merger)} records left in the merge at the end")
    return PathTimes(decode, merge_add, release, digest_of(sink.emitted))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def table(records: list[Record], settings: Settings, per_message: int, runs: int, label: str) -> str:
    """Run the path and the core alone (on the records the path decodes, in the replay's order)
    ``runs`` times each, in turns; the table of medians."""
    published = messages_of(records, per_message)
    messages = in_fair_polls(published, settings.worker_poll_bytes)
    records = decoded_records(published, records)  # what the path decodes, sources and all
    n = len(records)
    tune_for_streaming()
    paths: list[PathTimes] = []
    cores: list[float] = []
    for _ in range(runs):
        paths.append(run_path(messages, settings))
        cores.append(core_seconds(DetectionCore(settings.core_config()), records))
    alone: list[Emitted] = []
    run_through(DetectionCore(settings.core_config()), records, alone.append)
    outputs_equal = digest_of(alone) == paths[0].digest

    def us(seconds: Callable[[PathTimes], float]) -> str:
        return f"{_median([seconds(p) for p in paths]) / n * 1e6:10.2f}"

    total = _median([p.total for p in paths])
    core = _median(cores)
    lines = [
        f"worker path without Kafka: {label}, {n:,} records in {len(messages):,} messages "
        f"of up to {per_message} (fair polls of {settings.worker_poll_bytes:,} bytes), "
        f"median of {runs} run(s)",
        f"{'':44}{'µs a record':>12}{'records/s':>12}",
        f"{'decode (decode_message_lines)':44}{us(lambda p: p.decode):>12}",
        f"{'merge: add':44}{us(lambda p: p.merge_add):>12}",
        f"{'merge: release, pipeline, detection core':44}{us(lambda p: p.release_and_core):>12}",
        f"{'path in all':44}{total / n * 1e6:12.2f}{n / total:12,.0f}",
        f"{'detection core alone, records in memory':44}{core / n * 1e6:12.2f}{n / core:12,.0f}",
        f"ratio path / core alone (records/s): {core / total:.2f}",
        f"outputs equal to the core alone's: {'yes' if outputs_equal else 'NO'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sim", type=Path, help="a simulation folder (default: simulate one)")
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument(
        "--ecc-interval-minutes", type=float, default=1.0, help="DCGM scrape period (default 1, a real one)"
    )
    parser.add_argument("--per-message", type=int, default=256, help="records a message (default 256)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny input, one run: only checks it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.ecc_interval_minutes, args.runs = 8, 0.25, 5.0, 1
    settings = Settings()
    if args.sim is not None:
        records = replay_records([args.sim / name for name in _FILES], settings)
        label = str(args.sim)
    else:
        config = SimulationConfig(
            nodes=args.nodes, days=args.days, ecc_interval_minutes=args.ecc_interval_minutes
        )
        print(f"simulating {args.nodes} nodes x {args.days:g} days ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="faultstream-worker-path-") as tmp:
            simulate(config, Path(tmp))
            records = replay_records([Path(tmp) / name for name in _FILES], settings)
        label = (
            f"{args.nodes} nodes x {args.days:g} days (DCGM scraped every {args.ecc_interval_minutes:g} min)"
        )
    out = table(records, settings, args.per_message, args.runs, label)
    print(out)
    return 0 if out.endswith("yes") else 1


if __name__ == "__main__":
    sys.exit(main())
