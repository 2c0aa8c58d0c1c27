"""The worker on raw kernel-log lines, as shippers send them, next to the same XIDs as JSON records.

    python benchmarks/kernel_log_worker.py --kafka 127.0.0.1:9092          # 10,000 XIDs, 3 runs
    python benchmarks/kernel_log_worker.py --kafka HOST:PORT --xids 20000 --noise 99 --runs 5

A fleet's XID lines (``--xids`` of them, ``--nodes`` nodes over ``--days`` days, NVIDIA's
application and hardware codes) are written once as a kernel log (rsyslog's default
``RSYSLOG_FileFormat``) and published three ways, each before any worker starts:

1. **JSON**: ``faultstream replay kernel.log --to`` (the file parsed by the publisher; 256 xid
   records a message on the ``xid`` topic): the worker's rate on the records themselves;
2. **raw, XID lines only**: each line one Kafka record with its newline and no key, as omkafka
   sends it, on the ``kernel-log`` topic;
3. **raw, a kernel log**: the same XID lines with ``--noise`` other drivers' lines around each one
   (99: one line in a hundred is the GPU driver's, what a kernel log is).

Each is timed from a fresh worker's launch (its own consumer group, internal topics and store)
until the group has committed every input offset (and every re-keyed copy) and the worker's
gauges say nothing is held or short of a commit point; ``--runs`` rounds, each row in each round,
the figure the median. Records are counted as published: xid records (1), lines (2 and 3); the
XID events every row processes are the same ``--xids``. The ratios, each the median of the
rounds' own, compare rows 2 and 3 with row 1 (target for the raw lines: >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from worker_throughput import (
    CLI,
    ROOT,
    TOPIC_SETTINGS,
    Kafka,
    deployment_env,
    free_port,
    log,
    metrics_page,
    run_cli,
    stop_process,
    topics_of,
    work_folder,
)

from stream.worker.caught_up import caught_up_on_gauges

#: Topics a worker run writes (each run gets its own).
PER_RUN = (
    "JOBS_BY_NODE",
    "KERNEL_LOG_BY_NODE",
    "INCIDENTS",
    "DEAD_LETTERS",
    "CHECKPOINTS",
    "FLEET",
    "FLEET_BASELINES",
)
#: Codes drawn for the XID lines: mostly application XIDs, some hardware ones (NVIDIA's catalog).
CODES = (13, 13, 31, 31, 43, 45, 48, 63, 64, 74, 79, 94, 119)
NOISE = (
    "mlx5_core 0000:8d:00.0: Port module event: module 4, Cable plugged",
    "EXT4-fs (md0): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib1: link becomes ready",
    "docker0: port 4(vethab86b2c) entered forwarding state",
    'audit: type=1400 audit(1704067200.123:42): apparmor="STATUS" operation="profile_load"',
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
    "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
)
START_MS = 1_704_067_200_000  # 2024-01-01


def kernel_lines(xids: int, noise: int, nodes: int, days: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """(the XID lines, the kernel log: each XID line after ``noise`` other lines), time-ordered."""
    rng = random.Random(seed)
    span_us = days * 86_400_000_000
    times = sorted(START_MS * 1000 + rng.randrange(span_us) for _ in range(xids))
    xid_lines: list[bytes] = []
    log_lines: list[bytes] = []
    previous = START_MS * 1000
    for at in times:
        for step in range(noise):
            noise_at = previous + (at - previous) * (step + 1) // (noise + 1)
            log_lines.append(_line(noise_at, f"node{rng.randrange(nodes):05d}", rng.choice(NOISE)))
        node = f"node{rng.randrange(nodes):05d}"
        gpu = rng.randrange(8)
        code, pid = rng.choice(CODES), rng.randrange(1, 10**6)
        text = f"NVRM: Xid (PCI:0000:{0x07 + 8 * gpu:02x}:00): {code}, pid={pid}, name=python, benchmark line"
        line = _line(at, node, text)
        xid_lines.append(line)
        log_lines.append(line)
        previous = at
    return xid_lines, log_lines


def _line(at_us: int, node: str, text: str) -> bytes:
    stamp = datetime.fromtimestamp(at_us / 1e6, UTC).isoformat(timespec="microseconds")
    return f"{stamp} {node} kernel: {text}".encode()


async def produce_raw(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    """Each line one record, newline kept, no key (omkafka's default)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        pending = []
        for line in lines:
            pending.append(await producer.send(topic, value=line + b"\n"))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def worker_run(
    kafka: Kafka, base: dict[str, str], inputs: list[str], records: int, workdir: Path
) -> float:
    """Records/s of one fresh worker over ``inputs`` (published already), launch to caught up."""
    group = f"{base['FAULTSTREAM_WORKER_APP_ID']}-w{uuid.uuid4().hex[:6]}"
    env = {**base, "FAULTSTREAM_WORKER_APP_ID": group, "FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS": "1"}
    for name in PER_RUN:
        env[f"FAULTSTREAM_TOPIC_{name}"] = f"{group}.{name.lower().replace('_', '-')}"
    own = topics_of(env, PER_RUN)
    kafka.created.extend(own)
    run_cli(["init-kafka"], env)
    port = free_port()
    env["FAULTSTREAM_METRICS_PORT"] = str(port)
    data_dir = workdir / group
    watched = await kafka.partitions([*inputs, env["FAULTSTREAM_TOPIC_KERNEL_LOG_BY_NODE"]])
    with (workdir / f"{group}.log").open("w") as out:
        launched = time.perf_counter()
        store = f"chdb://{data_dir / 'store'}"
        worker = subprocess.Popen(
            [*CLI, "worker", "--clickhouse", store], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            while True:
                await asyncio.sleep(0.05)
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited early: see {workdir / f'{group}.log'}")
                committed = await kafka.committed(group)
                ends = await kafka.end_offsets(watched)
                if all(committed.get(tp, 0) >= ends[tp] for tp in watched) and caught_up_on_gauges(
                    [metrics_page(port)]
                ):
                    done = time.perf_counter()
                    break
        finally:
            stop_process(worker)
    await kafka.delete(own)
    shutil.rmtree(data_dir, ignore_errors=True)
    return records / (done - launched)


async def measure(args: argparse.Namespace, workdir: Path) -> int:
    xid_lines, log_lines = kernel_lines(args.xids, args.noise, args.nodes, args.days, args.seed)
    (workdir / "kernel.log").write_bytes(b"\n".join(xid_lines) + b"\n")
    prefix = f"kbench{uuid.uuid4().hex[:6]}"
    rows: dict[str, tuple[dict[str, str], list[str], int]] = {}
    async with Kafka(args.kafka) as kafka:
        try:
            for row, lines in (
                ("json", None),
                ("raw XID lines", xid_lines),
                (f"raw, {args.noise} others each", log_lines),
            ):
                env = deployment_env(args.kafka, f"{prefix}{len(rows)}", args.partitions)
                kafka.created.extend(topics_of(env, TOPIC_SETTINGS))
                run_cli(["init-kafka"], env)
                started = time.perf_counter()
                if lines is None:
                    run_cli(
                        [
                            "replay",
                            str(workdir / "kernel.log"),
                            "--to",
                            f"kafka://{args.kafka}",
                            "--no-progress",
                        ],
                        env,
                    )
                    rows[row] = (env, [env["FAULTSTREAM_TOPIC_XID"]], len(xid_lines))
                else:
                    await produce_raw(args.kafka, env["FAULTSTREAM_TOPIC_KERNEL_LOG"], lines)
                    rows[row] = (env, [env["FAULTSTREAM_TOPIC_KERNEL_LOG"]], len(lines))
                log(f"published {row}: {rows[row][2]:,} records in {time.perf_counter() - started:.1f} s")
            rates: dict[str, list[float]] = {row: [] for row in rows}
            for run in range(1, args.runs + 1):
                for row, (env, inputs, records) in rows.items():
                    rates[row].append(await worker_run(kafka, env, inputs, records, workdir))
                    log(f"  round {run}, {row}: {rates[row][-1]:,.0f} records/s")
        finally:
            await kafka.delete(kafka.created)
    json_rates = rates["json"]
    print(
        f"worker on {args.xids:,} XID events ({args.nodes} nodes, {args.days} days, {args.partitions} "
        f"partitions), median of {args.runs} runs; records as published\n"
    )
    print("| input | records | records/s | XID events/s | ratio to JSON |")
    print("|---|---:|---:|---:|---:|")
    for row, (_, _, records) in rows.items():
        rate = statistics.median(rates[row])
        ratio = statistics.median(r / j for r, j in zip(rates[row], json_rates, strict=True))
        events = rate * args.xids / records
        print(f"| {row} | {records:,} | {rate:,.0f} | {events:,.0f} | {ratio:.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kafka", required=True, help="bootstrap server, HOST:PORT")
    parser.add_argument("--xids", type=int, default=10_000, help="XID lines (default 10,000)")
    parser.add_argument("--noise", type=int, default=99, help="other lines around each XID line (default 99)")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions of the node-keyed topics (default 1)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, help="kept after the run (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="300 XIDs, 9 others each, 20 nodes, 1 run (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.xids, args.noise, args.nodes, args.days, args.runs = 300, 9, 20, 2, 1
    with work_folder(args.workdir, "kernel-bench-") as workdir:
        return asyncio.run(measure(args, workdir))


if __name__ == "__main__":
    sys.exit(main())
