"""Drain a dense backlog published to Kafka before any worker runs (issue 40's scenario) and print how
long the workers take, how many records the event-time merge held at most and the workers' memory.

    tests/services/kafka/start.sh /tmp/kafka          # prints KAFKA_BOOTSTRAP=127.0.0.1:PORT
    python tests/soak/backlog.py --kafka 127.0.0.1:PORT                       # 100 nodes, 30 days, 1 worker
    python tests/soak/backlog.py --kafka HOST:PORT --sim /tmp/sim100 --embedded /tmp/sim100-store
    python tests/soak/backlog.py --kafka HOST:PORT --partitions 8 --workers 3 --kills 8
    python tests/soak/backlog.py --kafka HOST:PORT --nodes 20 --days 7 --workdir /tmp/backlog

The cluster is ``--sim``'s files (kernel.log, sacct.txt, dcgm.prom of ``faultstream simulate``),
or one simulated here (default: 100 nodes, 30 days, DCGM scrapes every 10 minutes, ~3.5 M
records: a month the merge once held for good). Its embedded replay (``--embedded``: a store kept
across runs, made there if absent) gives the expected incidents, attributions and MTTF rows, up to
the last hour of XID events as ``tests/e2e/test_fleet_stage.py`` compares them. The files are
published to a fresh deployment (256 records a message), all of it before the first worker
starts; ``--workers`` workers (static group instance ids) then drain it, and with ``--kills``
one worker in turn is SIGKILLed every ``--kill-every`` seconds and replaced at once with its
id. The drain runs from the first worker's launch until the group is caught up (every input
committed, nothing held: ``wait_until_caught_up``). Prints the publish and drain times, the
records/s, the peak ``faultstream_merge_held_records`` (sampled every 2 s: the group's sum and
each worker's), each worker's peak RSS (VmHWM, over its incarnations) and whether the results
equal the embedded replay's (exit 0 only then).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from stream.worker.caught_up import caught_up_on_gauges, metric_sum
from tests.services import kafka
from tests.services.failover import wait_until_up
from tests.services.worker import (
    ROOT,
    Worker,
    assert_same_results,
    progress,
    query,
    results,
    wait_until_caught_up,
)

HELD = "faultstream_merge_held_records"


def faultstream(env: dict[str, str], timeout: float, *args: str) -> str:
    """Run the command line (no 300 s bound, unlike ``cli``: a month's replay takes minutes)."""
    done = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args], capture_output=True, text=True, timeout=timeout,
        check=False, env={**os.environ, **env}, cwd=ROOT,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"faultstream {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM, KiB); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Every ``period`` seconds: the held records of each live worker (and their sum), and the peak
    RSS of each incarnation, kept per worker name."""

    def __init__(self, alive: dict[str, Worker], period: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.alive, self.period = alive, period
        self.stopping = threading.Event()
        self.held_total = 0.0
        self.held: dict[str, float] = {}
        self.rss: dict[str, dict[int, int]] = {}  # name -> pid -> VmHWM (KiB)

    def sample(self) -> None:
        total = 0.0
        for name, worker in list(self.alive.items()):
            try:  # a worker killed meanwhile resets the connection
                page = worker.metrics_page()
                held = metric_sum(page, HELD) if page else 0.0
            except (OSError, ValueError):
                held = 0.0
            total += held
            self.held[name] = max(self.held.get(name, 0.0), held)
            rss = peak_rss_kib(worker.process.pid)
            seen = self.rss.setdefault(name, {})
            seen[worker.process.pid] = max(seen.get(worker.process.pid, 0), rss)
        self.held_total = max(self.held_total, total)

    def run(self) -> None:
        while not self.stopping.wait(self.period):
            self.sample()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--kafka", required=True, metavar="HOST:PORT", help="bootstrap servers of a test broker")
    add("--sim", type=Path, help="folder of kernel.log, sacct.txt, dcgm.prom (default: simulate one)")
    add("--nodes", type=int, default=100, help="simulated nodes without --sim (default 100)")
    add("--days", type=int, default=30, help="simulated days without --sim (default 30)")
    add("--ecc-interval-minutes", type=int, default=10, help="DCGM scrape interval (default 10)")
    add("--seed", type=int, default=7, help="simulation seed (default 7)")
    add("--partitions", type=int, default=4, help="input partitions (default 4)")
    add("--workers", type=int, default=1, help="workers in the group (default 1)")
    add("--kills", type=int, default=0, help="SIGKILLs during the drain (default 0)")
    add("--kill-every", type=float, default=10.0, help="seconds between kills (default 10)")
    add("--embedded", type=Path, help="embedded replay's store, reused if present (default: in --workdir)")
    add("--workdir", type=Path, help="keep the stores and logs here (default: a temp dir)")
    add("--timeout", type=float, default=1800, help="seconds the drain may take (default 1800)")
    args = parser.parse_args()
    folder = (args.workdir or Path(tempfile.mkdtemp(prefix="faultstream-backlog-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"workdir {folder}", flush=True)
    sim = args.sim.resolve() if args.sim else folder / "sim"
    if not args.sim:
        faultstream({}, 3600, "simulate", "--nodes", str(args.nodes), "--days", str(args.days), "--seed",
                    str(args.seed), "--ecc-interval-minutes", str(args.ecc_interval_minutes), "--out", str(sim))  # fmt: skip
    inputs = [str(sim / name) for name in ("kernel.log", "sacct.txt", "dcgm.prom")]
    embedded = (args.embedded or folder / "embedded").resolve()
    if not (embedded.exists() and any(embedded.iterdir())):
        started = time.monotonic()
        faultstream({}, 7200, "replay", *inputs, "--clickhouse", f"chdb://{embedded}", "--no-progress")
        print(f"embedded replay into {embedded}: {time.monotonic() - started:.1f} s", flush=True)
    [last] = query(embedded, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    before = last["t"]
    expected = results([embedded], before)

    prefix = f"backlog{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(args.kafka, prefix, args.partitions, FAULTSTREAM_DATA_DIR=str(folder / "data"))
    faultstream(env, 300, "init-kafka")
    started = time.monotonic()
    sent = json.loads(
        faultstream(env, 7200, "replay", *inputs, "--to", f"kafka://{args.kafka}", "--no-progress", "--json")
    )
    published, messages = sum(sent["sent"].values()), sum(sent["messages"].values())
    publish_seconds = time.monotonic() - started
    print(f"published {published:,} records in {messages:,} messages in {publish_seconds:.1f} s "
          f"({published / publish_seconds:,.0f} records/s)", flush=True)  # fmt: skip

    serial = iter(range(10**6))
    incarnations: list[Worker] = []

    def start(name: str) -> Worker:
        number = next(serial)
        worker = Worker({**env, "FAULTSTREAM_WORKER_INSTANCE_ID": name}, folder / f"store-{name}-{number}",
                        folder / f"worker-{name}-{number}.log")  # fmt: skip
        incarnations.append(worker)
        return worker

    names = [f"w{n}" for n in range(args.workers)]
    launched = time.monotonic()
    alive = {name: start(name) for name in names}
    sampler = Sampler(alive)
    sampler.start()
    kills, failure = 0, None
    try:
        for worker in alive.values():
            wait_until_up(worker)
        for kill in range(args.kills):
            time.sleep(args.kill_every)
            done = progress(env)
            pages = [worker.metrics_page() for worker in alive.values()]
            if all(committed >= end for committed, end in done.values()) and caught_up_on_gauges(pages):
                print(f"caught up before kill {kill + 1}: no more kills", flush=True)
                break
            name = names[kill % args.workers]
            sampler.sample()  # the victim's last RSS and held records
            alive[name].kill()
            alive[name] = start(name)
            kills += 1
            left = sum(end - committed for committed, end in done.values())
            print(f"kill {kills} ({name}) at {time.monotonic() - launched:.0f} s, "
                  f"{left:,} messages left to commit", flush=True)  # fmt: skip
            wait_until_up(alive[name])
        remaining = args.timeout - (time.monotonic() - launched)
        wait_until_caught_up(env, list(alive.values()), timeout=max(remaining, 1))
    except AssertionError as exc:
        failure = str(exc)
    drained = time.monotonic() - launched
    sampler.sample()
    sampler.stopping.set()
    sampler.join()
    for worker in alive.values():
        worker.stop()

    how = f"{kills} kills of {args.kills}, every {args.kill_every:.0f} s" if args.kills else "no kills"
    print(f"{args.partitions} partitions, {args.workers} workers, {how}")
    if failure:
        print(f"NOT caught up after {drained:.1f} s from the first worker's launch:\n{failure}")
    else:
        rate = published / drained
        print(f"drained in {drained:.1f} s from the first worker's launch: {rate:,.0f} records/s")
    per_worker = ", ".join(f"{name} {sampler.held.get(name, 0):,.0f}" for name in names)
    print(f"peak {HELD}: {sampler.held_total:,.0f} (sum over the workers; {per_worker})")
    rss = ", ".join(f"{name} {max(sampler.rss.get(name, {0: 0}).values()) / 1024:,.0f} MiB" for name in names)
    print(f"peak RSS (VmHWM, max over incarnations): {rss}")
    same = False
    if not failure:
        got = results([worker.store for worker in incarnations], before)
        try:
            assert_same_results(got, expected)
            same = True
            n = {table: f"{len(rows):,}" for table, rows in expected.items()}
            print(f"equal to the embedded replay: incidents {n['incidents']}, "
                  f"attributions {n['attributions']}, MTTF rows {n['mttf']}")  # fmt: skip
        except AssertionError as exc:
            print(f"NOT equal to the embedded replay:\n{exc}")
    print(f"worker logs: {folder}/worker-*.log")
    kafka.delete_deployment_topics(env)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
