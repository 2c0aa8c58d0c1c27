"""Detector state per GPU: replay files through the detection core (no store) and pickle it.

SPEC 6: state small enough for 100,000 GPUs in one worker's memory budget of 1 GiB, i.e.
under ~10 KiB per GPU. The pickled size is what a checkpoint costs; the in-memory size is
larger by Python's object overhead, so both are printed (tracemalloc for the latter).

    python benchmarks/state_size.py --simulate --nodes 500 --days 30 --workdir /tmp/state
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
import tracemalloc
from pathlib import Path

from detectors.core import CoreConfig, DetectionCore
from schemas.records import InvalidRecord
from stream.inputs.files import read_records
from stream.inputs.parsers.options import ParseOptions


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    files = list(args.files)
    if args.simulate:
        from stream.simulator import SimulationConfig, simulate

        out = args.workdir / "sim"
        simulate(SimulationConfig(nodes=args.nodes, days=args.days, seed=args.seed), out)
        files = [out / name for name in ("kernel.log", "sacct.txt", "dcgm.prom")]
    options = ParseOptions(cluster="state")
    records = []
    for path in files:
        records.extend(r for r in read_records(path, options) if not isinstance(r, InvalidRecord))
    records.sort(key=lambda r: r.ts_ms)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    core = DetectionCore(CoreConfig())
    started = time.perf_counter()
    for record in records:
        core.process(record)
        core.drain()
    elapsed = time.perf_counter() - started
    in_memory = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    pickled = len(pickle.dumps(core, protocol=pickle.HIGHEST_PROTOCOL))
    gpus = len({(r.node, r.gpu_key) for r in records if hasattr(r, "gpu_key")}) or 1
    nodes = len({r.node for r in records if hasattr(r, "node")})
    rate = len(records) / elapsed
    print(f"{len(records):,} records, {nodes:,} nodes, {gpus:,} GPUs; core (traced): {rate:,.0f} records/s")
    print(f"pickled state: {pickled:,} B = {pickled / gpus:,.0f} B per GPU")
    print(f"in-memory state (tracemalloc): {in_memory:,} B = {in_memory / gpus:,.0f} B per GPU")
    print(
        f"extrapolated to 100,000 GPUs: {in_memory / gpus * 100_000 / 2**20:,.0f} MiB in memory "
        f"(budget 1024 MiB); {pickled / gpus * 100_000 / 2**20:,.0f} MiB per checkpoint"
    )
    # The fleet stage's state (the lemon statistics of every node, the storm baselines, jobs
    # waiting for their parts) lives in one checkpoint, that of input partition 0's owner: per
    # node, not per GPU, and it grows with the fleet, not with the partitions.
    fleet = len(pickle.dumps(core.fleet, protocol=pickle.HIGHEST_PROTOCOL))
    print(
        f"fleet stage state (pickled): {fleet:,} B = {fleet / max(nodes, 1):,.0f} B per node; "
        f"extrapolated to 16,384 nodes: {fleet / max(nodes, 1) * 16_384 / 2**20:,.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
