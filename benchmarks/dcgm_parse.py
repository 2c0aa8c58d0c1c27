"""DCGM text parsing speed on one core: the reference reading (line by line) and the block reading
that files use, in one run on the same files.

    python benchmarks/dcgm_parse.py --workdir /tmp/dcgm-bench
    python benchmarks/dcgm_parse.py --workdir /tmp/dcgm-bench --nodes 2048 --runs 3 FILE...

Two inputs are written unless files are given: the simulator's ``dcgm.prom`` (``--nodes`` nodes x
8 GPUs, ``--hours`` of 15-minute scrapes: every series is one we read) and an exporter-like scrape
history (``--exporter-nodes`` nodes, dcgm-exporter's default counters, of which we read four:
mostly series we skip). Each side parses each file ``--runs`` times, taking turns; the table shows
the median MB/s (of the file's bytes) and records/s (ECC samples and XID events, counted the same
way on both sides, which must agree), the MB per CPU second (what a shared machine's load does not
move), and the block reading's speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from schemas.records import EccSample, XidEvent
from stream.gc_tuning import tune_for_streaming
from stream.inputs.parsers.dcgm import parse_dcgm
from stream.inputs.parsers.dcgm_blocks import parse_dcgm_file
from stream.inputs.parsers.options import ParseOptions

#: dcgm-exporter's default counters (etc/default-counters.csv), in its order; we read four.
EXPORTER_METRICS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)  # fmt: skip


def write_exporter_history(path: Path, nodes: int, scrapes: int, gpus: int = 8) -> None:
    """An exporter-like history: ``scrapes`` scrapes 15 minutes apart of every GPU, with time stamps."""
    start_ms = 1_704_067_200_000
    labels = [
        f'{{gpu="{gpu}",UUID="GPU-{node:05d}{gpu:03d}-0000-0000-0000-000000000000",'
        f'pci_bus_id="00000000:{0x07 + 8 * gpu:02X}:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA A100-SXM4-80GB",Hostname="node{node:05d}",DCGM_FI_DRIVER_VERSION="535.104.12"}} '
        for node in range(1, nodes + 1)
        for gpu in range(gpus)
    ]
    with path.open("w") as out:
        for scrape in range(scrapes):
            suffix = f" {start_ms + scrape * 900_000}\n"
            for index, metric in enumerate(EXPORTER_METRICS):
                out.write(f"# HELP {metric} {metric.lower()}\n# TYPE {metric} gauge\n")
                value = "0" if "ROW" in metric or "XID" in metric else str(1000 + index + scrape % 7)
                out.write("".join(f"{metric}{label}{value}{suffix}" for label in labels))


def _records(items: Iterable[object]) -> int:
    return sum(1 for item in items if isinstance(item, (EccSample, XidEvent)))


def _old(path: Path) -> int:
    with path.open("rb") as handle:
        return _records(parse_dcgm(handle, ParseOptions(), str(path)))


def _new(path: Path) -> int:
    with path.open("rb") as handle:
        return _records(parse_dcgm_file(handle, ParseOptions(), str(path)))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--workdir", type=Path, required=True, help="the written inputs go here")
    parser.add_argument("--nodes", type=int, default=512, help="simulated fleet (8 GPUs a node)")
    parser.add_argument("--hours", type=float, default=24, help="simulated history (15-minute scrapes)")
    parser.add_argument(
        "--exporter-nodes", type=int, default=96, help="exporter-like history's nodes (96 scrapes)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="runs of each side, taking turns; the median counts"
    )
    args = parser.parse_args()
    tune_for_streaming()

    files = list(args.files)
    if not files:
        from stream.simulator import SimulationConfig, simulate

        args.workdir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        config = SimulationConfig(nodes=args.nodes, days=args.hours / 24, seed=1, ecc_interval_minutes=15)
        simulate(config, args.workdir / "sim")
        exporter = args.workdir / "exporter.prom"
        write_exporter_history(exporter, args.exporter_nodes, 96)
        print(f"wrote the inputs in {time.perf_counter() - started:.1f} s")
        files = [args.workdir / "sim" / "dcgm.prom", exporter]

    sides: dict[str, Callable[[Path], int]] = {"reference (line by line)": _old, "blocks": _new}
    print(f"median of {args.runs} run(s) a side, taking turns, one core")
    print(f"{'file':<16}{'MB':>8}  {'reader':<26}{'MB/s':>8}{'records/s':>12}{'records':>12}{'MB/CPU s':>12}")
    for path in files:
        size = path.stat().st_size
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        counts: dict[str, int] = {}
        for _ in range(args.runs):
            for name, read in sides.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                counts[name] = read(path)
                seconds[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu_started)
        if len(set(counts.values())) != 1:
            print(f"{path}: the readers disagree: {counts}", file=sys.stderr)
            return 1
        median = {name: statistics.median(values) for name, values in seconds.items()}
        median_cpu = {name: statistics.median(values) for name, values in cpu.items()}
        for name in sides:
            print(
                f"{path.name:<16}{size / 1e6:>8,.0f}  {name:<26}{size / 1e6 / median[name]:>8,.1f}"
                f"{counts[name] / median[name]:>12,.0f}{counts[name]:>12,}"
                f"{size / 1e6 / median_cpu[name]:>12,.1f}"
            )
        print(f"{'':<26}speed-up {median['reference (line by line)'] / median['blocks']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
