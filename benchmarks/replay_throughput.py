"""Embedded replay speed next to the speed of merely reading and decoding the same files.

SPEC 6 target: replay (files -> detectors -> embedded ClickHouse) at no less than half the speed
of reading and decoding the files. Both are measured in one run on the same files, each the
median of ``--runs`` runs, and the ratio is what to compare (these machines are noisy).

    python benchmarks/replay_throughput.py --simulate --nodes 1000 --days 30 --seed 1 --workdir /tmp/bench
    python benchmarks/replay_throughput.py --workdir /tmp/bench FILE...

The decode baseline parses every line into validated records (the cheapest a pipeline can
be); the replay adds the event-time merge, the detection core and the ClickHouse inserts. Both
run with the garbage collector tuned as ``faultstream replay`` tunes it (``stream/gc_tuning.py``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

from stream.gc_tuning import tune_for_streaming
from stream.inputs.files import read_records
from stream.inputs.parsers.options import ParseOptions
from stream.replay import replay
from stream.settings import Settings
from stream.sinks.store import connect


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--workdir", type=Path, required=True, help="simulation output and the store go here")
    parser.add_argument("--simulate", action="store_true", help="simulate the input first")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3, help="runs of each side; the median counts")
    args = parser.parse_args()

    files = list(args.files)
    if args.simulate:
        from stream.simulator import SimulationConfig, simulate

        sim_dir = args.workdir / "sim"
        started = time.perf_counter()
        truth = simulate(SimulationConfig(nodes=args.nodes, days=args.days, seed=args.seed), sim_dir)
        print(
            f"simulated {args.nodes} nodes x {args.days} days in {time.perf_counter() - started:.1f} s "
            f"(true r_f {truth.true_rf_per_1000_node_days:.3f} per 1000 node-days)"
        )
        files = sorted(p for p in sim_dir.iterdir() if p.name != "truth.json")
    if not files:
        parser.error("give input files or --simulate")
    size = sum(p.stat().st_size for p in files)
    print(f"input: {len(files)} files, {size / 1e6:,.1f} MB")

    # As `faultstream replay` does before its first record; both sides run with it.
    tune_for_streaming()
    options = ParseOptions(cluster="bench")
    decode_rates = []
    for run in range(args.runs):
        started = time.perf_counter()
        decoded = 0
        for path in files:
            for _ in read_records(path, options):
                decoded += 1
        decode_s = time.perf_counter() - started
        decode_rates.append(decoded / decode_s)
        rate = decode_rates[-1]
        print(f"read+decode run {run}: {decoded:,} records in {decode_s:.2f} s = {rate:,.0f} records/s")

    store = args.workdir / "store"
    shutil.rmtree(store, ignore_errors=True)
    settings = Settings(clickhouse_dsn=f"chdb://{store.resolve()}")
    client = connect(settings)
    replay_rates = []
    for run in range(args.runs):
        # Each run into empty tables (chdb opens one path per process: the same store, emptied;
        # the tables stay, as the replay made them on its first run).
        tables = client.query(
            f"SELECT name FROM system.tables "
            f"WHERE database = '{settings.database}' AND engine NOT IN ('View', 'MaterializedView')"
        )
        for (table,) in tables.result_rows:
            client.command(f"TRUNCATE TABLE {settings.database}.{table}")
        started = time.perf_counter()
        summary = replay(files, settings, client, options)
        replay_s = time.perf_counter() - started
        handled = summary.events + summary.dead_letters
        replay_rates.append(handled / replay_s)
        print(
            f"replay run {run}:      {handled:,} records in {replay_s:.2f} s = {replay_rates[-1]:,.0f} "
            f"records/s ({summary.rows_written:,} rows written, {len(summary.incidents):,} incidents)"
        )
    decode_rate, replay_rate = statistics.median(decode_rates), statistics.median(replay_rates)
    print(
        f"median of {args.runs}: read+decode {decode_rate:,.0f} records/s, "
        f"replay {replay_rate:,.0f} records/s"
    )
    print(f"ratio replay/decode = {replay_rate / decode_rate:.2f} (target >= 0.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
