"""Fuzz the worker: hostile messages interleaved with the bundled example, on a real broker.

    tests/services/kafka/start.sh /tmp/kafka          # prints KAFKA_BOOTSTRAP=127.0.0.1:PORT
    python tests/soak/fuzz.py --kafka 127.0.0.1:PORT --messages 10000

Prints the figures: messages sent (by kind of hostility), dead letters expected and found (by
reason), on the dead-letter topic, worker crashes, and whether the good data's results equal the
embedded replay's. Exit status 1 if any of those is wrong. tests/e2e/test_fuzz_worker.py runs the
same with 2,000 messages in CI.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.services.fuzz import run_fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kafka", required=True, metavar="HOST:PORT", help="bootstrap servers of a test broker"
    )
    parser.add_argument(
        "--messages", type=int, default=10_000, help="hostile messages to send (default 10000)"
    )
    parser.add_argument(
        "--seed", type=int, default=15, help="random seed of the hostile messages (default 15)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the stores and the worker log here (default: a temp dir)"
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="faultstream-fuzz-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = run_fuzz(args.kafka, workdir, args.messages, seed=args.seed)
    print(f"hostile messages sent       {report.sent:,} (seed {args.seed})")
    for what, n in report.sent_by_kind.most_common():
        print(f"  {what:<26} {n:,}")
    print(f"bad lines in them           {report.bad_lines:,}")
    print(f"dead letters stored         {report.dead_letters:,}")
    print(
        f"dead letters on the topic   {report.dead_letters_on_topic:,} ({report.distinct_on_topic:,} distinct places)"
    )
    print(f"dead letters with no reason {report.letters_without_reason}")
    print("dead letters by reason:")
    for reason, n in report.dead_letters_by_reason.most_common():
        print(f"  {n:>7,}  {reason}")
    print(f"worker crashes              {report.worker_crashes}")
    print(f"results equal embedded      {'yes' if report.results_equal else 'no'}")
    if report.results_problem:
        print(report.results_problem)
    print(f"seconds                     {report.seconds:.0f}  (worker log: {report.log})")
    ok = (
        report.worker_crashes == 0
        # The topic is at least once (a producer retry may write a letter twice): every place once.
        and report.dead_letters == report.bad_lines == report.distinct_on_topic
        and report.letters_without_reason == 0
        and report.results_equal
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
