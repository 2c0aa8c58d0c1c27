"""The Kafka worker's throughput next to a bare aiokafka consumer's, on the same topics, in one run.

SPEC 6 target: the full pipeline (Kafka -> worker -> detectors -> ClickHouse + incidents topic)
sustains at least 50% of the rate at which a bare aiokafka consumer that only decodes the JSON
reads the same topics.

    python benchmarks/worker_throughput.py --kafka 127.0.0.1:9092 --workdir /tmp/wbench \\
        --nodes 200 --days 30

It simulates a cluster, publishes it to fresh topics with `replay --to`, and times on those topics:

1. a bare aiokafka consumer reading and decoding every input message (the target's reference);
2. a Faust agent that only decodes the JSON (what Faust's consumer costs before any of our work);
3. `faultstream worker`, from its first committed offset to the last (start-up printed apart).

The second figure is there because the first is out of any Faust app's reach on this machine:
Faust hands each message to its agents through per-message asyncio tasks (mode's wait_first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition


async def partitions_of(consumer: AIOKafkaConsumer, topics: list[str]) -> list[TopicPartition]:
    cluster = await consumer._client.fetch_all_metadata()
    return [TopicPartition(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())]


async def bare_consume(bootstrap: str, topics: list[str]) -> tuple[int, float]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topics)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        total = sum(ends.values())
        seen = 0
        started = time.perf_counter()
        while seen < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for messages in batches.values():
                for message in messages:
                    orjson.loads(message.value)
                seen += len(messages)
        return seen, time.perf_counter() - started
    finally:
        await consumer.stop()


async def committed(bootstrap: str, group: str, topics: list[str]) -> tuple[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topics)
        ends = await consumer.end_offsets(tps)
        done = 0
        for tp in tps:
            done += (await consumer.committed(tp)) or 0
        return done, sum(ends.values())
    finally:
        await consumer.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kafka", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--partitions", type=int, default=1)
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "FAULTSTREAM_KAFKA_BOOTSTRAP": args.kafka,
        "FAULTSTREAM_TOPIC_XID": f"{prefix}.xid",
        "FAULTSTREAM_TOPIC_ECC": f"{prefix}.ecc",
        "FAULTSTREAM_TOPIC_JOBS": f"{prefix}.jobs",
        "FAULTSTREAM_TOPIC_JOBS_BY_NODE": f"{prefix}.jobs-by-node",
        "FAULTSTREAM_TOPIC_INCIDENTS": f"{prefix}.incidents",
        "FAULTSTREAM_TOPIC_DEAD_LETTERS": f"{prefix}.dead-letters",
        "FAULTSTREAM_TOPIC_CHECKPOINTS": f"{prefix}.checkpoints",
        "FAULTSTREAM_METRICS_PORT": "0",
        "FAULTSTREAM_TOPIC_PARTITIONS": str(args.partitions),
        "FAULTSTREAM_WORKER_APP_ID": prefix,
        "FAULTSTREAM_DATA_DIR": str(args.workdir / "worker-data"),
    }
    cli = [sys.executable, "-m", "stream.cli"]
    sim = args.workdir / "sim"
    simulate = [*cli, "simulate", "--nodes", str(args.nodes), "--days", str(args.days), "--out", str(sim)]
    subprocess.run(simulate, check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([*cli, "init-kafka"], check=True, env=env, stdout=subprocess.DEVNULL)
    inputs = [sim / name for name in ("kernel.log", "sacct.txt", "dcgm.prom")]
    subprocess.run([*cli, "replay", *map(str, inputs), "--to", f"kafka://{args.kafka}", "--no-progress"],
                   check=True, env=env)  # fmt: skip
    topics = [env["FAULTSTREAM_TOPIC_XID"], env["FAULTSTREAM_TOPIC_ECC"], env["FAULTSTREAM_TOPIC_JOBS"]]
    count, seconds = asyncio.run(bare_consume(args.kafka, topics))
    bare_rate = count / seconds
    print(f"bare aiokafka consumer + JSON decode: {count:,} messages in {seconds:.2f} s = {bare_rate:,.0f}/s")
    result_file = args.workdir / "faust-decode-only.txt"
    subprocess.run(
        [sys.executable, str(Path(__file__).with_name("faust_decode_only.py")), args.kafka, f"{prefix}-noop",
         str(count), str(result_file), *topics],
        check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800,
    )  # fmt: skip
    faust_count, faust_seconds = (float(x) for x in result_file.read_text().split())
    faust_rate = faust_count / faust_seconds
    print(f"Faust agent + JSON decode: {faust_count:,.0f} in {faust_seconds:.2f} s = {faust_rate:,.0f}/s")

    store = args.workdir / "store"
    launched = time.perf_counter()
    worker = subprocess.Popen([*cli, "worker", "--clickhouse", f"chdb://{store}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    all_topics = [*topics, env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]]
    first_progress = None
    try:
        while True:
            done, total = asyncio.run(committed(args.kafka, prefix, all_topics))
            now = time.perf_counter()
            if done and first_progress is None:
                first_progress = (now, done)
            if done >= total:
                break
            if worker.poll() is not None:
                raise SystemExit("the worker exited early")
            time.sleep(0.5)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert first_progress is not None
    start_at, done_at_start = first_progress
    steady = (total - done_at_start) / max(now - start_at, 1e-9)
    overall = total / (now - launched)
    print(
        f"worker: {total:,} input offsets (incl. jobs-by-node) committed; {now - launched:.1f} s from launch "
        f"({overall:,.0f}/s), {now - start_at:.1f} s from its first commit ({steady:,.0f}/s)"
    )
    print(
        f"ratio worker/bare aiokafka = {steady / bare_rate:.3f} from first commit, "
        f"{overall / bare_rate:.3f} from launch (SPEC target >= 0.5)"
    )
    print(f"ratio worker/Faust decode-only agent = {steady / faust_rate:.2f} from first commit")
    print(f"ratio Faust decode-only agent/bare aiokafka = {faust_rate / bare_rate:.3f} (Faust's own ceiling)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
