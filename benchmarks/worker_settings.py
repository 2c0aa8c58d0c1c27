"""The worker alone under several values of one setting, on the same topics, runs alternating.

    python benchmarks/worker_settings.py --kafka 127.0.0.1:9092 \\
        --setting FAULTSTREAM_WORKER_POLL_BYTES --values 1048576,1000000000 --per-message 256
    python benchmarks/worker_settings.py --kafka HOST:PORT --smoke      # CI: 8 nodes x 1 day, 1 run

What a change to the worker costs or saves, measured as ``benchmarks/worker_throughput.py``
measures its worker row (its functions: the same simulated cluster, records counted the same way,
timed from launch until committed and nothing held, a fresh group and internal topics a run), but
on topics published once, with the values' runs taking turns (value A, value B, value A, ...) so
that the machine's drift during the command falls on every value alike. Each cell is the median
of ``--runs`` runs; the ratio column compares each value with the first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import worker_throughput as bench

SMOKE_SETTING = "FAULTSTREAM_WORKER_POLL_BYTES"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    bench.add_cluster_arguments(parser, "runs a value; the table shows the median")
    parser.add_argument("--setting", default=SMOKE_SETTING, help="a FAULTSTREAM_* variable")
    parser.add_argument("--values", default="1048576,1000000000", help="its values, comma-separated")
    parser.add_argument("--per-message", type=int, default=256, help="records a message")
    args = bench.cluster_arguments(parser, argv)
    args.values = [value.strip() for value in args.values.split(",") if value.strip()]
    if (
        not args.setting.startswith("FAULTSTREAM_")
        or not args.values
        or args.runs < 1
        or args.per_message < 1
    ):
        parser.error(
            "--setting needs a FAULTSTREAM_* name, --values at least one value, --runs and --per-message >= 1"
        )
    return args


async def measure(args: argparse.Namespace, files: list[Path], workdir: Path) -> tuple[dict, int]:
    """Per value, its runs' measurements; and the records a run."""
    runs: dict[str, list[bench.Measurement]] = {value: [] for value in args.values}
    results = bench.Results()
    async with bench.Kafka(args.kafka) as kafka:
        try:
            bench.log(f"publishing at {args.per_message} records a message ...")
            published = await bench.publish(kafka, args, files, args.per_message)
            serial = 0
            for turn in range(args.runs):
                for value in args.values:
                    published.env[args.setting] = value
                    measurement = await bench.worker_run(kafka, published, serial, workdir, results)
                    serial += 1
                    bench.log(f"  {args.setting}={value} run {turn}: {measurement.launch:,.0f} / "
                              f"{measurement.steady:,.0f} records/s")  # fmt: skip
                    runs[value].append(measurement)
        finally:
            bench.log(f"deleting {len(kafka.created)} topics")
            await kafka.delete(kafka.created)
    return runs, published.records


def render(args: argparse.Namespace, runs: dict, records: int) -> str:
    medians = {
        value: (bench._median([m.launch for m in found]), bench._median([m.steady for m in found]))
        for value, found in runs.items()
    }
    first_launch, first_steady = medians[args.values[0]]
    width = max(len(args.setting) + 2, *(len(value) + 2 for value in args.values))
    lines = [
        f"faultstream worker under {args.setting}: {args.nodes} nodes x {args.days:g} days (DCGM scraped "
        f"every {args.ecc_interval_minutes:g} min), {args.partitions} partition(s), "
        f"{args.per_message} records a message, {records:,} records a run, "
        f"median of {args.runs} alternating run(s)",
        f"machine: {os.cpu_count()} CPUs",
        "",
        f"{'value':<{width}}{'launch':>12}{'steady':>12}{'launch / first':>16}{'steady / first':>16}",
    ]
    for value in args.values:
        launch, steady = medians[value]
        lines.append(
            f"{value:<{width}}{bench._num(launch):>12}{bench._num(steady):>12}"
            f"{bench._ratio(launch / first_launch):>16}{bench._ratio(steady / first_steady):>16}"
        )
    lines += [
        "",
        "records/s; launch: from the worker's launch; steady: from its first commit (worker_throughput.py).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def table(files: list[Path], workdir: Path) -> str:
        return render(args, *asyncio.run(measure(args, files, workdir)))

    return bench.on_simulated_cluster(args, "worker-settings-", table)


if __name__ == "__main__":
    sys.exit(main())
