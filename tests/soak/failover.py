"""Time the worker's failover: SIGKILL workers during a replay and print how soon their partitions
commit again.

    tests/services/kafka/start.sh /tmp/kafka          # prints KAFKA_BOOTSTRAP=127.0.0.1:PORT
    python tests/soak/failover.py --kafka 127.0.0.1:PORT                     # 2 workers, 4 partitions, 8 kills
    python tests/soak/failover.py --kafka HOST:PORT --workers 3 --partitions 8 --kills 10
    python tests/soak/failover.py --kafka HOST:PORT --rate 250                # published while they work
    python tests/soak/failover.py --kafka HOST:PORT --dynamic                 # no static instance ids
    python tests/soak/failover.py --kafka HOST:PORT --dynamic --replace later # the others take over

A simulated cluster (60 nodes, 40 days, DCGM scrapes every 2 h: ~250,000 records, a backlog for
about eight kills) is published first, one record a message, and the workers replay it (or with
``--rate``, published at that many records/s while they work). Each kill is a SIGKILL of one worker (in turn) and the launch of its replacement (same static group
instance id unless ``--dynamic``): at once, or with ``--replace later`` only once the other
workers have taken the partitions over (a worker lost for good: the group notices when its session
times out). A kill's resume time runs from the replacement's launch (``--replace later``: from the
kill) until every partition with messages left to commit has committed past where it stood
(:mod:`tests.services.failover` defines it). Prints one line per kill and the median and maximum,
then whether the results equal the embedded replay's. ``tests/e2e/test_worker_failover.py``
asserts such a run's results and its 10 s bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.services import kafka
from tests.services.failover import KillRun, kill_during_replay
from tests.services.worker import cli, query, results, wait_until_caught_up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kafka", required=True, metavar="HOST:PORT", help="bootstrap servers of a test broker"
    )
    parser.add_argument("--workers", type=int, default=2, help="workers in the group (default 2)")
    parser.add_argument("--partitions", type=int, default=4, help="input partitions (default 4)")
    parser.add_argument("--kills", type=int, default=8, help="SIGKILLs (default 8)")
    parser.add_argument("--rate", type=int, help="publish at this many records/s while the workers run")
    parser.add_argument("--seed", type=int, default=17, help="seed of the kill moments (default 17)")
    parser.add_argument("--dynamic", action="store_true", help="no static group instance ids")
    parser.add_argument(
        "--replace",
        choices=("at once", "later"),
        default="at once",
        help="start the killed worker's replacement at once (default) or once the others took over",
    )
    parser.add_argument("--workdir", type=Path, help="keep the stores and logs here (default: a temp dir)")
    args = parser.parse_args()
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="faultstream-failover-"))
    folder.mkdir(parents=True, exist_ok=True)
    sim = folder / "sim"
    cli({}, "simulate", "--nodes", "60", "--days", "40", "--seed", "21", "--ecc-interval-minutes", "120",
        "--out", str(sim))  # fmt: skip
    inputs = [sim / "kernel.log", sim / "sacct.txt", sim / "dcgm.prom"]
    embedded = folder / "embedded"
    cli({}, "replay", *map(str, inputs), "--clickhouse", f"chdb://{embedded}", "--no-progress")
    # MTTF rows up to the day before the last XID, as the failover test compares them (the last
    # hours' rows are decided by the end of the input, which a worker never reaches).
    [last] = query(
        embedded, "SELECT toString(toStartOfDay(max(ts)) - toIntervalDay(1)) AS t FROM faultstream.xid_events"
    )

    prefix = f"failover{uuid.uuid4().hex[:6]}"
    env = kafka.deployment_env(args.kafka, prefix, args.partitions, FAULTSTREAM_DATA_DIR=str(folder / "data"))
    cli(env, "init-kafka")
    run = KillRun()
    try:
        kill_during_replay(
            run, env, inputs, folder, workers=args.workers, kills=args.kills, rate=args.rate,
            seed=args.seed, static=not args.dynamic, replace=args.replace,
        )  # fmt: skip
        wait_until_caught_up(env, run.alive, timeout=600)
    finally:
        for worker in run.alive:
            worker.stop()
    membership = "dynamic membership" if args.dynamic else "static membership"
    how = f"published at {args.rate} records/s" if args.rate else "a backlog, one record a message"
    since = "the replacement's launch" if args.replace == "at once" else "the kill (replaced later)"
    print(f"{args.workers} workers, {args.partitions} partitions, {membership}, {how}")
    for number, (name, seconds) in enumerate(run.resumes, 1):
        shown = "did not resume" if seconds is None else f"{seconds:5.1f} s"
        print(f"kill {number:2d} ({name}): partitions committing again {shown} after {since}")
    times = [seconds for _, seconds in run.resumes if seconds is not None]
    if times:
        print(
            f"resume: median {statistics.median(times):.1f} s, max {max(times):.1f} s over {len(times)} kills"
        )
    same = results([w.store for w in run.incarnations], last["t"]) == results([embedded], last["t"])
    print(f"results equal to the embedded replay's: {'yes' if same else 'NO'}")
    kafka.delete_deployment_topics(env)
    return 0 if same and len(times) == len(run.resumes) else 1


if __name__ == "__main__":
    sys.exit(main())
