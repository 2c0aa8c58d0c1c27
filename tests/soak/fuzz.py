"""Fuzz the worker: hostile messages interleaved with the bundled example, on a real broker.

    tests/services/kafka/start.sh /tmp/kafka          # prints KAFKA_BOOTSTRAP=127.0.0.1:PORT
    python tests/soak/fuzz.py --kafka 127.0.0.1:PORT --messages 10000 --receive-bodies 1000

Prints the figures: messages sent (by kind of hostility, the kernel-log topic's among them), dead
letters expected and found (by reason), on the dead-letter topic, the XID events of the example's
kernel log shipped among them, worker crashes, and whether the good data's results equal the
embedded replay's; then the same for hostile remote_write bodies posted to a real receiver (each
body's answer, dead letters, the good samples on the ecc topic). Exit status 1 if any of those is
wrong. tests/e2e/test_fuzz_worker.py and test_fuzz_receive.py run the same with 2,000 messages
and 300 bodies in CI.
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
    parser.add_argument(
        "--receive-bodies", type=int, default=1000,
        help="remote_write bodies posted to a real `faultstream receive` (two thirds hostile; default 1000; 0: none)",
    )  # fmt: skip
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
    print(
        f"good kernel-log lines       {report.kernel_lines:,} shipped among them, {report.kernel_events:,} XIDs"
    )
    print(f"XID events stored           {report.xid_events:,}")
    print(f"worker crashes              {report.worker_crashes}")
    print(f"results equal embedded      {'yes' if report.results_equal else 'no'}")
    if report.results_problem:
        print(report.results_problem)
    print(f"seconds                     {report.seconds:.0f}  (worker log: {report.log})")
    received_ok = True
    if args.receive_bodies:
        from tests.services.fuzz_receive import run_receive_fuzz

        (workdir / "receive").mkdir(exist_ok=True)
        received = run_receive_fuzz(args.kafka, workdir / "receive", args.receive_bodies, seed=args.seed)
        print(f"remote_write bodies posted  {sum(received.sent.values()):,}")
        for what, n in received.sent.most_common():
            print(f"  {what:<26} {n:,}")
        print(f"wrong answers               {len(received.wrong_status)} {received.wrong_status[:5]}")
        print(f"400s without a reason       {received.reasons_missing}")
        print(f"dead letters expected/found {received.letters_expected:,} / {received.letters_on_topic:,}")
        print(f"good samples sent/on topic  {received.samples_expected:,} / {received.samples_on_topic:,}")
        print(f"receiver alive, tracebacks  {received.receiver_alive}, {received.tracebacks}")
        received_ok = (
            received.receiver_alive
            and received.tracebacks == 0
            and not received.wrong_status
            and received.reasons_missing == 0
            and received.letters_on_topic == received.letters_expected
            and received.samples_on_topic == received.samples_expected
        )
    ok = (
        received_ok
        and report.worker_crashes == 0
        # The topic is at least once (a producer retry may write a letter twice): every place once.
        and report.dead_letters == report.bad_lines == report.distinct_on_topic
        and report.letters_without_reason == 0
        and report.results_equal
        and report.xid_events == report.kernel_events
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
