"""A large fleet's multi-year failure history, replayed and scored against what was planted.

A reliability engineer's first data set is often years of GPU failures and nothing else. This
writes one from the public description of such a fleet (a Cray supercomputer of single-GPU nodes,
``c{col}-{row}c{cage}s{slot}n{node}``, whose GPUs wore out over six years: double-bit ECC errors,
Xid 48, and GPUs off the bus, Xid 79, about 3 to 1), with

* wear-out: each GPU's life is Weibull (shape 4, ``--life-years`` scale; the top cage runs hotter
  and wears out 20% sooner); a failed GPU is replaced 1-10 days later by a new one;
* a failure episode logs one to a few lines of its GPU within the hour, and 3% of the double-bit
  errors take the GPU off the bus minutes later (one episode, two kinds of line);
* ``--bad-share`` of the slots are bad for two to six months: whatever GPU sits there fails
  about every ``--bad-every-days`` and is back in service a day or two later (the lemons).

It then replays the kernel log with the fleet's inventory (``replay --inventory``) and without it,
and prints: the share of the fleet called lemons and how many of the bad slots were among them;
critical incidents per failure episode per quarter; the report's MTBF per quarter against hours /
episodes; events per second.

    python benchmarks/fleet_history.py --nodes 18688 --years 6
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAY_S = 86_400
QUIET_S = 3_600  # the critical incidents' quiet period: repeats of a GPU within it are one episode
_MESSAGES = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    79: "GPU has fallen off the bus.",
}


@dataclass(frozen=True)
class History:
    nodes: list[str]
    bad: list[str]
    lines: list[tuple[float, str, int]]  # (time, node, xid)
    episodes: list[tuple[float, str]]  # (first line's time, node)


def node_names(count: int) -> list[str]:
    """Cray names: 25 columns x 8 rows of cabinets, 3 cages, 8 slots, 4 nodes (the first ``count``)."""
    names = [
        f"c{col}-{row}c{cage}s{slot}n{node}"
        for col in range(25) for row in range(8) for cage in range(3)
        for slot in range(8) for node in range(4)
    ]  # fmt: skip
    if count > len(names):
        raise SystemExit(f"--nodes at most {len(names)}")
    return names[:count]


def simulate(nodes: int, years: float, life_years: float, bad_share: float, bad_every_days: float,
             seed: int) -> History:  # fmt: skip
    rng = random.Random(seed)
    names = node_names(nodes)
    span = years * 365 * DAY_S
    # A bad slot (a board, a riser) is bad for two to six months, somewhere in the span, until it
    # is found and its board replaced.
    bad = {
        name: (begin, begin + rng.uniform(60, 180) * DAY_S)
        for name in rng.sample(names, max(1, round(bad_share * nodes)))
        for begin in [rng.uniform(0, span - 60 * DAY_S)]
    }
    failures: list[tuple[float, str]] = []
    for name in names:
        scale = life_years * 365 * DAY_S * (0.8 if "c2s" in name else 1.0)
        installed = 0.0
        while True:
            at = installed + rng.weibullvariate(scale, 4.0)
            if at >= span:
                break
            failures.append((at, name))
            installed = at + rng.uniform(1, 10) * DAY_S
        if name in bad:
            begin, end = bad[name]
            at = begin
            while True:
                at += rng.expovariate(1 / (bad_every_days * DAY_S))
                if at >= min(end, span):
                    break
                failures.append((at, name))
                at += rng.uniform(1, 2) * DAY_S  # reseated, back in service
    lines: list[tuple[float, str, int]] = []
    episodes: list[tuple[float, str]] = []
    for at, name in failures:
        xid = 48 if rng.random() < 0.76 else 79
        episodes.append((at, name))
        lines.append((at, name, xid))
        repeat = at
        while rng.random() < 0.4:  # the same GPU again within the hour
            repeat += rng.uniform(60, 20 * 60)
            lines.append((repeat, name, xid))
        if xid == 48 and rng.random() < 0.03:
            lines.append((at + rng.uniform(30, 300), name, 79))
    lines.sort()
    episodes.sort()
    return History(names, sorted(bad), lines, episodes)


def write_kernel_log(history: History, path: Path, start: datetime) -> None:
    origin = start.timestamp()
    with path.open("w") as out:
        for at, node, xid in history.lines:
            stamp = datetime.fromtimestamp(origin + at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
            out.write(f"{stamp} {node} kernel: NVRM: Xid (PCI:0000:02:00): {xid}, pid=0, {_MESSAGES[xid]}\n")


def replay(folder: Path, log: Path, inventory: Path | None) -> tuple[Path, float]:
    store = folder / ("store-inventory" if inventory else "store-bare")
    shutil.rmtree(store, ignore_errors=True)
    command = [sys.executable, "-m", "stream.cli", "replay", str(log), "--clickhouse", f"chdb://{store}",
               "--no-progress", "--json"]  # fmt: skip
    if inventory is not None:
        command += ["--inventory", str(inventory)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"replay failed:\n{done.stderr[-2000:]}")
    return store, float(json.loads(done.stdout)["seconds"])


def query(store: Path, sql: str) -> list[tuple[object, ...]]:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
    try:
        return list(client.query(sql).result_rows)
    finally:
        client.close()


def fleet_report(store: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "stream.cli", "report", "--clickhouse", f"chdb://{store}", "--json",
         "--fleet-window", "quarter"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    fleet: dict[str, object] = json.loads(done.stdout)["fleet"]
    return fleet


def quarter(moment: datetime) -> str:
    return f"{moment.year}Q{(moment.month - 1) // 3 + 1}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=18688)
    parser.add_argument("--years", type=float, default=6.0)
    parser.add_argument("--life-years", type=float, default=9.5)
    parser.add_argument("--bad-share", type=float, default=0.003)
    parser.add_argument("--bad-every-days", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the inputs and stores in this folder")
    args = parser.parse_args()
    start = datetime(2014, 1, 1, tzinfo=UTC)
    history = simulate(
        args.nodes, args.years, args.life_years, args.bad_share, args.bad_every_days, args.seed
    )
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fleet-history-"))
    folder.mkdir(parents=True, exist_ok=True)
    log, inventory = folder / "kern.log", folder / "inventory.txt"
    write_kernel_log(history, log, start)
    inventory.write_text("".join(f"{name}\n" for name in history.nodes))
    print(f"{args.nodes:,} nodes, {args.years:g} years: {len(history.lines):,} XID lines, "
          f"{len(history.episodes):,} failure episodes, {len(history.bad)} bad slots")  # fmt: skip
    bad = set(history.bad)
    for label, given in (("with inventory", inventory), ("without inventory", None)):
        store, seconds = replay(folder, log, given)
        found = query(
            store, "SELECT DISTINCT node FROM faultstream.incidents FINAL WHERE kind = 'lemon_node'"
        )
        lemons = {str(row[0]) for row in found}
        print(f"\n{label}: replay {seconds:.1f} s, {len(history.lines) / seconds:,.0f} events/s")
        print(f"  lemon nodes: {len(lemons)} = {100 * len(lemons) / args.nodes:.2f}% of the fleet; "
              f"bad slots among them {len(lemons & bad)} of {len(bad)}; "
              f"others {len(lemons - bad)}")  # fmt: skip
        if given is None:
            continue
        critical = query(
            store,
            """SELECT toUnixTimestamp(first_evidence) FROM faultstream.incidents FINAL
            WHERE severity = 'critical' AND kind IN ('gpu_memory', 'gpu_bus')""",
        )
        incidents = Counter(quarter(datetime.fromtimestamp(int(row[0]), tz=UTC)) for row in critical)
        origin = start.timestamp()
        episodes = Counter(quarter(datetime.fromtimestamp(origin + at, tz=UTC)) for at, _ in history.episodes)
        ratios = {q: incidents[q] / episodes[q] for q in sorted(episodes) if episodes[q] >= 20}
        print(f"  critical incidents per episode, per quarter with >= 20 episodes ({len(ratios)}): "
              f"min {min(ratios.values()):.3f}, max {max(ratios.values()):.3f}; "
              f"overall {sum(incidents.values()) / len(history.episodes):.3f}")  # fmt: skip
        report = fleet_report(store)
        windows = report["windows"]
        assert isinstance(windows, list)
        errors, counted = [], []
        for window in windows:
            q = quarter(datetime.fromisoformat(window["start"].replace("Z", "+00:00")))
            if episodes[q] < 20 or not window["mtbf_hours"]:
                continue
            hours = window["node_days"] / window["nodes"] * 24
            truth = hours / episodes[q]
            errors.append(abs(window["mtbf_hours"] - truth) / truth)
            counted.append(window["hardware_failures"] / episodes[q])
        print(f"  the report's hardware failures per episode, per quarter: min {min(counted):.3f}, "
              f"max {max(counted):.3f}")  # fmt: skip
        print(f"  MTBF per quarter (report) against hours / episodes: {len(errors)} quarters, "
              f"median error {sorted(errors)[len(errors) // 2]:.1%}, max {max(errors):.1%}")  # fmt: skip
        first, last = windows[0], windows[-1]
        print(f"  fleet MTBF: first quarter {first['mtbf_hours']} h, last {last['mtbf_hours']} h")
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
