"""A 16,384-node x 8-GPU fleet (131,072 GPUs) for a day, simulated and replayed embedded: records/s,
peak memory and the DCGM text's MB/s, in one command.

    python benchmarks/scale.py --workdir /tmp/scale-bench
    python benchmarks/scale.py --workdir /tmp/scale-bench --nodes 2048 --days 0.25 --keep

Steps, each timed:

1. ``faultstream simulate --nodes N --days D --ecc-interval-minutes M`` writes the fleet's kernel log,
   ``sacct -P`` output and ``dcgm.prom`` (a day of 16,384 nodes: about 13 GB of DCGM text), with the
   simulator's peak RSS;
2. the block reading of ``dcgm.prom`` alone on one core (``--parse-mb`` of it), in MB/s;
3. ``faultstream replay`` of the three files into a fresh embedded store, in a child process whose
   peak RSS (``VmHWM``) and its parse helper's are read from ``/proc`` while it runs: wall time,
   records/s (records the replay used, from its ``--json`` summary) and the DCGM MB/s through the
   whole replay.

The generated files and the store are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from stream.inputs.parsers.dcgm_blocks import parse_dcgm_file
from stream.inputs.parsers.options import ParseOptions

_POLL_SECONDS = 0.2
_TICKS = os.sysconf("SC_CLK_TCK")


def _peak_kib(pid: int) -> int:
    """A live process's peak resident set (``VmHWM``) in KiB, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """A live process's CPU time so far (user + system), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]
    except OSError:
        return []


@dataclass
class Watched:
    """What :func:`run_watched` saw of a process: wall seconds; peak RSS (KiB) and CPU seconds of the
    process and of its busiest child (last seen, polled every 0.2 s)."""

    seconds: float = 0.0
    peak_kib: int = 0
    cpu: float = 0.0
    child_peak_kib: int = 0
    child_cpu: float = 0.0


def run_watched(command: list[str], output: Path | None = None) -> Watched:
    """Run ``command`` (its standard output to ``output``, else nowhere) and watch it in ``/proc``."""
    started = time.perf_counter()
    seen = Watched()
    children: dict[int, float] = {}
    with open(output or os.devnull, "wb") as stdout:
        process = subprocess.Popen(command, stdout=stdout)
        while process.poll() is None:
            seen.peak_kib = max(seen.peak_kib, _peak_kib(process.pid))
            seen.cpu = max(seen.cpu, _cpu_seconds(process.pid))
            for child in _children(process.pid):
                seen.child_peak_kib = max(seen.child_peak_kib, _peak_kib(child))
                children[child] = max(children.get(child, 0.0), _cpu_seconds(child))
            time.sleep(_POLL_SECONDS)
    seen.seconds = time.perf_counter() - started
    seen.child_cpu = max(children.values(), default=0.0)
    if process.returncode != 0:
        raise SystemExit(f"{command[:4]} failed with exit status {process.returncode}")
    return seen


class _Head:
    """The first ``limit`` bytes of a file, read as a file (cut after a whole line by the reader)."""

    def __init__(self, handle: BinaryIO, limit: int) -> None:
        self._handle = handle
        self._left = limit

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(self._left if size < 0 else min(size, self._left))
        self._left -= len(data)
        return data


def parse_speed(path: Path, limit: int) -> tuple[float, float, int]:
    """MB/s (wall, and per CPU second) and items of the block reading over the first ``limit`` bytes
    of ``path`` (its last line may be cut), on one core."""
    with path.open("rb") as handle:
        started, cpu = time.perf_counter(), time.process_time()
        items = sum(1 for _ in parse_dcgm_file(_Head(handle, limit), ParseOptions(), str(path)))  # type: ignore[arg-type]
        megabytes = handle.tell() / 1e6
    return megabytes / (time.perf_counter() - started), megabytes / (time.process_time() - cpu), items


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, required=True, help="the fleet's files and the store go here")
    parser.add_argument("--nodes", type=int, default=16_384)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--ecc-interval-minutes", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parse-mb", type=int, default=2048, help="MB of dcgm.prom parsed alone (step 2)")
    parser.add_argument("--keep", action="store_true", help="keep the files and the store")
    parser.add_argument(
        "--reuse", action="store_true", help="replay the files a --keep run left (no simulation)"
    )
    args = parser.parse_args()

    sim = args.workdir / "sim"
    store = args.workdir / "store"
    reuse = args.reuse and (sim / "dcgm.prom").is_file()
    if not reuse:
        shutil.rmtree(sim, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "stream.cli"]
    fleet = f"{args.nodes:,} nodes x {args.gpus_per_node} GPUs ({args.nodes * args.gpus_per_node:,} GPUs)"
    print(f"fleet: {fleet}, {args.days:g} day(s), DCGM every {args.ecc_interval_minutes:g} min")
    try:
        if not reuse:
            simulated = run_watched(
                [
                    *cli, "simulate", "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
                    "--days", str(args.days), "--ecc-interval-minutes", str(args.ecc_interval_minutes),
                    "--seed", str(args.seed), "--out", str(sim),
                ],
            )  # fmt: skip
        dcgm = sim / "dcgm.prom"
        sizes = {path.name: path.stat().st_size for path in sim.iterdir()}
        simulation = "simulate: (the files of a kept run)"
        if not reuse:
            simulation = (
                f"simulate: {simulated.seconds:,.1f} s ({simulated.cpu:,.1f} CPU s), "
                f"peak RSS {simulated.peak_kib / 1024:,.0f} MiB"
            )
        print(
            f"{simulation}; dcgm.prom {sizes['dcgm.prom'] / 1e9:,.2f} GB, "
            f"kernel.log {sizes['kernel.log'] / 1e6:,.1f} MB, sacct.txt {sizes['sacct.txt'] / 1e6:,.1f} MB"
        )

        wall, per_cpu, items = parse_speed(dcgm, args.parse_mb << 20)
        print(
            f"parse alone (block reading, one core, first {args.parse_mb:,} MB): {wall:,.1f} MB/s "
            f"({per_cpu:,.1f} MB per CPU second), {items:,} items"
        )

        inputs = [str(sim / "kernel.log"), str(sim / "sacct.txt"), str(dcgm)]
        summary_file = args.workdir / "replay.json"
        replayed = run_watched(
            [*cli, "replay", *inputs, "--clickhouse", f"chdb://{store.resolve()}", "--no-progress", "--json"],
            summary_file,
        )
        summary = json.loads(summary_file.read_text())
        records = int(summary["events"])
        seconds = replayed.seconds
        print(
            f"replay (embedded): {seconds:,.1f} s, {records:,} records, {records / seconds:,.0f} records/s, "
            f"DCGM {sizes['dcgm.prom'] / 1e6 / seconds:,.1f} MB/s through the replay"
        )
        print(
            f"  replay process: peak RSS {replayed.peak_kib / 1024:,.0f} MiB, {replayed.cpu:,.1f} CPU s "
            f"({records / max(replayed.cpu, 1e-9):,.0f} records per CPU second); parse helper: peak RSS "
            f"{replayed.child_peak_kib / 1024:,.0f} MiB, {replayed.child_cpu:,.1f} CPU s"
        )
        print(f"  incidents: {len(summary['incidents_this_run'])}, dead letters: {summary['dead_letters']}")
    finally:
        if not args.keep:
            shutil.rmtree(sim, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"(this script's own peak RSS: {own / 1024:,.0f} MiB; pid {os.getpid()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
