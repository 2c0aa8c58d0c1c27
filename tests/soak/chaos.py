"""Chaos soak: a simulated cluster through Kafka while workers are killed, the broker restarts and
ClickHouse fails; the tables must equal the embedded replay's.

    python tests/soak/chaos.py --nodes 200 --days 30 --kills 10 --seed 15

It simulates the cluster (``faultstream simulate``), replays it embedded for the expected tables,
starts its own broker (tests/services/kafka/start.sh, in the work folder: it restarts it, so it
shares it with nobody), publishes the logs with ``replay --to`` to a deployment of ``--partitions``
partitions and runs ``--workers`` worker processes while it kills one with SIGKILL at ``--kills``
random moments (and starts it again), stops and restarts the broker once, and fails every
ClickHouse insert for ``--outage-seconds`` (tests/services/chaos.py says how). Then it prints:
kills survived, broker restarts, outage seconds, records in, incidents expected and found, rows
lost and unexpected per table, ids duplicated after FINAL, repeats on the incidents topic.
Exit status 1 if anything was lost, extra or duplicated. tests/e2e/test_chaos_smoke.py runs a
short plan on the bundled example in CI.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.services.chaos import KAFKA_SCRIPTS, run_chaos
from tests.services.worker import cli


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes (default 200)")
    parser.add_argument("--days", type=int, default=30, help="simulated days (default 30)")
    parser.add_argument(
        "--ecc-interval-minutes", type=int, default=360, help="DCGM scrape period (default 360)"
    )
    parser.add_argument("--partitions", type=int, default=4, help="partitions a topic (default 4)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs (default 10)")
    parser.add_argument("--outage-seconds", type=float, default=30, help="ClickHouse outage (default 30)")
    parser.add_argument(
        "--seed", type=int, default=15, help="seed of the cluster and of the chaos plan (default 15)"
    )
    parser.add_argument(
        "--timeout", type=float, default=7200, help="give up after this many seconds (default 7200)"
    )
    parser.add_argument("--no-broker-restart", action="store_true", help="leave the broker up throughout")
    parser.add_argument("--keep-broker", action="store_true", help="leave the broker running at the end")
    parser.add_argument(
        "--workdir", type=Path, help="keep the logs, stores and broker here (default: a temp dir)"
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="faultstream-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sim = workdir / "sim"
    cli({}, "simulate", "--nodes", str(args.nodes), "--days", str(args.days), "--seed", str(args.seed),
        "--ecc-interval-minutes", str(args.ecc_interval_minutes), "--out", str(sim))  # fmt: skip
    logs = [sim / "kernel.log", sim / "sacct.txt", sim / "dcgm.prom"]
    embedded = workdir / "embedded-store"
    cli({}, "replay", *map(str, logs), "--clickhouse", f"chdb://{embedded}", "--no-progress")
    broker_dir = workdir / "kafka"
    started = subprocess.run([str(KAFKA_SCRIPTS / "start.sh"), str(broker_dir)], capture_output=True, text=True,
                             check=False)  # fmt: skip
    if started.returncode != 0:
        print(started.stderr, file=sys.stderr)
        return 2
    bootstrap = started.stdout.strip().splitlines()[-1].split("=", 1)[1]
    try:
        report = run_chaos(
            bootstrap, broker_dir, workdir / "run", logs, embedded,
            partitions=args.partitions, workers=args.workers, kills=args.kills,
            outage_seconds=args.outage_seconds, seed=args.seed, broker_restart=not args.no_broker_restart, timeout=args.timeout, say=True,
        )  # fmt: skip
    finally:
        if not args.keep_broker:
            subprocess.run([str(KAFKA_SCRIPTS / "stop.sh"), str(broker_dir)], check=False)
    print()
    print(f"cluster                      {args.nodes} nodes x {args.days} days (seed {args.seed}), "
          f"{report.partitions} partitions, {report.workers} workers")  # fmt: skip
    print(f"records in                   {report.records_in:,} ({report.messages_in:,} messages)")
    print(f"kills survived (SIGKILL)     {report.kills}")
    print(f"worker exits on their own    {len(report.worker_exits)}")
    for why in report.worker_exits:
        print(f"  {why}")
    print(f"broker restarts              {report.broker_restarts} (down {report.broker_down_seconds:.0f} s)")
    print(
        f"ClickHouse outage seconds    {report.outage_seconds:.0f} ({report.flush_failures_seen} failed flushes seen)"
    )
    committed = ", ".join(
        f"{topic.split('.', 1)[1]} {n}" for topic, n in report.committed_during_outage.items()
    )
    print(f"offsets committed in outage  {committed or '-'} (after the first failed flush)")
    print(f"caught up                    {'yes' if report.caught_up else 'NO'}")
    print(f"incidents expected/found     {report.incidents_expected}/{report.incidents_found}")
    print(f"rows lost                    {sum(report.rows_lost.values())}  {report.rows_lost}")
    print(f"rows unexpected              {sum(report.rows_unexpected.values())}  {report.rows_unexpected}")
    print(f"duplicate ids after FINAL    {sum(report.duplicate_ids_after_final.values())}")
    print(f"incident-topic messages      {report.incident_messages:,}, extra repeats {report.incident_repeats:,}, "
          f"incidents missing their newest version {report.incidents_missing_on_topic}")  # fmt: skip
    print(f"jobs lines re-keyed twice    {report.rekeyed_repeats:,}")
    for example in report.examples:
        print(f"  {example}")
    print(f"seconds                      {report.seconds:.0f}  (logs: {workdir / 'run'})")
    if args.keep_broker:
        print(
            f"broker                       {bootstrap}, stop it with {KAFKA_SCRIPTS / 'stop.sh'} {broker_dir}"
        )
        print(f"deployment                   {' '.join(f'{k}={v}' for k, v in report.env.items())}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
