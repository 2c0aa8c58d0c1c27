"""``faultstream receive``: Prometheus remote_write samples per second, through to Kafka.

    python benchmarks/receive_throughput.py --kafka 127.0.0.1:9092        # 256 nodes x 8 GPUs, 3 runs
    python benchmarks/receive_throughput.py --kafka HOST:PORT --nodes 1024 --scrapes 10 --per-request 2000

The requests are made before anything is timed, as Prometheus would send them: a fleet of
``--nodes`` nodes x 8 GPUs, each GPU with dcgm-exporter's 12 series faultstream reads (11 ECC and
row-remapping counters and the XID gauge) and 3 it does not (temperature, power, utilisation),
scraped ``--scrapes`` times; the series of each scrape in label order cut into requests of
``--per-request`` samples (Prometheus 2.42's ``max_samples_per_send`` is 500), each a snappy
``WriteRequest``. A fresh receiver (its own deployment) is started per run, sent one scrape first
(untimed: each GPU's first sample settles, and its counters are known from then on, as in a
receiver that has run a while), then the others over
``--connections`` connections (Prometheus' shards); timed from the first request to the last
answer (every one a 204: the values are in Kafka), then until the last sample is on the ``ecc``
topic. Samples are counted as Prometheus sends them: every sample of every series, read or not.
Median of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import cramjam
from worker_throughput import (
    CLI,
    ROOT,
    TOPIC_SETTINGS,
    Kafka,
    deployment_env,
    free_port,
    log,
    run_cli,
    stop_process,
    topics_of,
    work_folder,
)

from stream.inputs.parsers.dcgm import METRIC_COUNTERS, XID_METRIC
from stream.inputs.parsers.remote_write import WriteRequest

OTHER = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL")


def requests(nodes: int, scrapes: int, per_request: int, first: int = 0) -> tuple[list[bytes], int, int]:
    """The bodies of scrapes ``first`` to ``first + scrapes``, the samples they hold, and the ECC
    samples they make."""
    names = sorted([*METRIC_COUNTERS, XID_METRIC, *OTHER])
    bodies: list[bytes] = []
    samples = 0
    start = 1_704_067_200_000
    for scrape in range(first, first + scrapes):
        series = []
        for node in range(nodes):
            ts = start + scrape * 30_000 + node  # each target scraped at its own moment
            for gpu in range(8):
                host = f"node{node:05d}"
                labels = {
                    "gpu": str(gpu), "UUID": f"GPU-{node:05d}-{gpu}", "device": f"nvidia{gpu}",
                    "pci_bus_id": f"00000000:{0x07 + 8 * gpu:02X}:00.0", "modelName": "NVIDIA H100 80GB HBM3",
                    "Hostname": host, "DCGM_FI_DRIVER_VERSION": "550.54.15", "instance": f"{host}:9400",
                    "job": "dcgm",
                }  # fmt: skip
                for name in names:
                    series.append(({**labels, "__name__": name}, float(scrape if "SBE" in name else 0), ts))
        for first in range(0, len(series), per_request):
            request = WriteRequest()
            for labels, value, ts in series[first : first + per_request]:
                added = request.timeseries.add()
                for key, label in sorted(labels.items()):
                    added.labels.add(name=key, value=label)
                added.samples.add(value=value, timestamp=ts)
            bodies.append(bytes(cramjam.snappy.compress_raw(request.SerializeToString())))
        samples += len(series)
    return bodies, samples, nodes * 8 * scrapes


async def send_all(url: str, bodies: list[bytes], connections: int) -> float:
    """Send every body over ``connections`` connections; the seconds from the first to the last answer."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for item in bodies:
        queue.put_nowait(item)
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}

    async def shard(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            data = queue.get_nowait()
            async with session.post(url, data=data, headers=headers) as answer:
                if answer.status != 204:
                    raise SystemExit(f"the receiver answered {answer.status}: {await answer.text()}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(shard(session) for _ in range(connections)))
        return time.perf_counter() - started


async def run_once(
    args: argparse.Namespace, warmup: list[bytes], bodies: list[bytes], ecc_samples: int, workdir: Path
) -> tuple[float, float]:
    """One fresh receiver: the warm-up scrape sent and settled (each GPU's counters known, as in a
    receiver running for a while), then ``bodies`` timed."""
    prefix = f"rbench{uuid.uuid4().hex[:6]}"
    env = deployment_env(args.kafka, prefix, args.partitions)
    port = free_port()
    async with Kafka(args.kafka) as kafka:
        kafka.created.extend(topics_of(env, TOPIC_SETTINGS))
        try:
            run_cli(["init-kafka"], env)
            logfile = workdir / f"{prefix}.log"
            receiver = subprocess.Popen(
                [*CLI, "receive", "--listen", f"127.0.0.1:{port}"], env=env, cwd=ROOT,
                stdout=logfile.open("w"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                while "receiving Prometheus remote_write" not in logfile.read_text():
                    if receiver.poll() is not None:
                        raise SystemExit(f"the receiver exited: see {logfile}")
                    await asyncio.sleep(0.1)
                url = f"http://127.0.0.1:{port}/api/v1/write"
                ecc = await kafka.partitions([env["FAULTSTREAM_TOPIC_ECC"]])
                await send_all(url, warmup, args.connections)
                while sum((await kafka.end_offsets(ecc)).values()) < args.nodes * 8:
                    await asyncio.sleep(0.1)
                began = time.perf_counter()
                answered = await send_all(url, bodies, args.connections)
                while sum((await kafka.end_offsets(ecc)).values()) < ecc_samples + args.nodes * 8:
                    await asyncio.sleep(0.05)
                out = time.perf_counter() - began
            finally:
                stop_process(receiver)
        finally:
            await kafka.delete(kafka.created)
    return answered, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kafka", required=True, help="bootstrap server, HOST:PORT")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--per-request", type=int, default=500, help="samples a request (default 500)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--smoke", action="store_true", help="8 nodes, 2 scrapes, 1 run (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.scrapes, args.runs = 8, 2, 1
    with work_folder(args.workdir, "receive-bench-") as workdir:
        warmup, _, _ = requests(args.nodes, 1, args.per_request)
        bodies, samples, ecc_samples = requests(args.nodes, args.scrapes, args.per_request, first=1)
        log(f"{len(bodies):,} requests, {samples:,} samples, {ecc_samples:,} ECC samples to come out")
        runs = []
        for run in range(args.runs):
            answered, out = asyncio.run(run_once(args, warmup, bodies, ecc_samples, workdir))
            runs.append((answered, out))
            log(f"  run {run + 1}: answered in {answered:.2f} s, all on the ecc topic after {out:.2f} s")
        answered = statistics.median(r[0] for r in runs)
        out = statistics.median(r[1] for r in runs)
        print(
            f"faultstream receive: {args.nodes} nodes x 8 GPUs x 15 series, {args.scrapes} scrapes, "
            f"{args.per_request} samples a request, {args.connections} connections; median of {args.runs}\n"
        )
        print("| requests | samples | answered s | samples/s answered | all out s | samples/s to Kafka |")
        print("|---:|---:|---:|---:|---:|---:|")
        cells = [
            f"{len(bodies):,}",
            f"{samples:,}",
            f"{answered:.2f}",
            f"{samples / answered:,.0f}",
            f"{out:.2f}",
        ]
        print(f"| {' | '.join(cells)} | {samples / out:,.0f} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
