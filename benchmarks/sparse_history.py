"""Replay speed of a long, sparse failure history against a dense one of as many events (issue 45).

A reliability engineer's first data set is often years of a large fleet's GPU failures and nothing
else: a few thousand XID 48 (double-bit ECC) and XID 79 (off the bus) lines over years and tens of
thousands of nodes. The cost of a replay must follow the records, not the span times the nodes.
This writes two kernel logs with the same events on the same node names — one spread over
``--years``, one packed into 30 days — replays each ``--runs`` times into a fresh embedded store,
and prints events/s (median) and the sparse/dense ratio measured in the same run.

    python benchmarks/sparse_history.py --events 6367 --nodes 18687 --years 6
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MESSAGES = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    79: "GPU has fallen off the bus.",
}


def write_history(path: Path, events: int, nodes: int, span_days: float, seed: int) -> None:
    """Kernel-log lines of ``events`` XID 48/79 failures on a third of ``nodes`` over ``span_days``."""
    rng = random.Random(seed)
    names = [f"n{n:05d}" for n in range(nodes)]
    failing = names[: max(1, nodes // 3)]
    start = datetime(2018, 1, 1, tzinfo=UTC).timestamp()
    lines = []
    for _ in range(events):
        at = start + rng.random() * span_days * 86_400
        xid = rng.choice((48, 48, 48, 79))
        stamp = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
        bus = rng.randrange(8) * 16 + 7
        line = f"{stamp} {rng.choice(failing)} kernel: NVRM: Xid (PCI:0000:{bus:02x}:00): {xid}, pid=0, "
        lines.append((at, line + _MESSAGES[xid]))
    lines.sort()
    path.write_text("".join(line + "\n" for _, line in lines))


def replay_seconds(log: Path, folder: Path) -> float:
    """Wall time of one replay of ``log`` into a fresh embedded store (the command's own figure)."""
    store = folder / "store"
    shutil.rmtree(store, ignore_errors=True)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stream.cli", "replay", str(log), "--clickhouse", f"chdb://{store}",
         "--no-progress", "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"replay failed:\n{done.stderr[-2000:]}")
    seconds = json.loads(done.stdout)["seconds"]
    return float(seconds) if seconds else time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6367)
    parser.add_argument("--nodes", type=int, default=18687)
    parser.add_argument("--years", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparse-history-") as temp:
        folder = Path(temp)
        sparse, dense = folder / "sparse.log", folder / "dense.log"
        write_history(sparse, args.events, args.nodes, args.years * 365, args.seed)
        write_history(dense, args.events, args.nodes, 30, args.seed)
        rates: dict[str, list[float]] = {"sparse": [], "dense": []}
        for _ in range(args.runs):  # interleaved: both see the same machine
            for name, log in (("sparse", sparse), ("dense", dense)):
                rates[name].append(args.events / replay_seconds(log, folder))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{args.events:,} XID events on {args.nodes:,} node names, median of {args.runs}:")
    print(f"  sparse ({args.years:g} years): {medians['sparse']:,.0f} events/s  "
          f"({', '.join(f'{r:,.0f}' for r in rates['sparse'])})")  # fmt: skip
    print(f"  dense (30 days):     {medians['dense']:,.0f} events/s  "
          f"({', '.join(f'{r:,.0f}' for r in rates['dense'])})")  # fmt: skip
    print(f"  sparse / dense: {medians['sparse'] / medians['dense']:.2f}x")


if __name__ == "__main__":
    main()
