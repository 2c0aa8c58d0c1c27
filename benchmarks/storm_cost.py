"""What an XID storm costs the detection core a line, as the storm grows.

A monitor is needed most when a node logs thousands of XID lines an hour (a flapping NVLink, a
GPU falling off the bus again and again, a job in a crash loop): the cost of a line must not
grow with the storm. For each code below, one node's 8 GPUs log N lines within an hour, with no
job on the node and with one job running there (job-aware storms), straight into the core
(``DetectionCore.process``, the fleet stage in process; no input or output): microseconds a
line, the median of ``--runs`` runs, and the largest storm's cost a line over the smallest's
(1.0: linear).

    python benchmarks/storm_cost.py                         # 1,000 / 8,000 / 32,000 lines an hour
    python benchmarks/storm_cost.py --lines 500,4000 --runs 5
    python benchmarks/storm_cost.py --smoke                 # CI: tiny storms, one run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from detectors.core import DetectionCore
from schemas.records import JobEvent, JobState, XidEvent
from schemas.timeutil import HOUR_MS, MINUTE_MS
from stream.gc_tuning import tune_for_streaming
from stream.settings import Settings

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
#: Code -> (what it stands for, the driver's text after the code).
STORMS = {
    43: ("application (a crash loop)", "Ch 00000010, intr 10000000"),
    79: ("critical hardware (off the bus)", "GPU has fallen off the bus."),
    48: ("critical memory (DBE)", "An uncorrectable double bit error (DBE) has been detected on GPU"),
    144: ("NVLink (a flapping link)", "Link 12 (0x0000000c) Non-fatal error, IntrInfo 0x00000001"),
}


def storm_seconds(code: int, lines: int, with_job: bool, settings: Settings) -> float:
    """Seconds of the core for one storm of ``lines`` lines of ``code`` within an hour."""
    core = DetectionCore(settings.core_config())
    if with_job:
        start = T0 - 1_000
        job = JobEvent(
            ts_ms=start, cluster="c", job_id="1", state=JobState.RUNNING, start_ms=start, nodes=("n1",),
            gpus=8, user="u",
        )  # fmt: skip
        core.process(job)
    message = STORMS[code][1]
    if code == 144:  # a flapping link: 4 bursts of a minute, 15 minutes apart (one burst is no flapping)
        per_burst = -(-lines // 4)
        burst, within = 15 * MINUTE_MS, MINUTE_MS // per_burst
        times = [T0 + i // per_burst * burst + i % per_burst * within for i in range(lines)]
    else:
        times = [T0 + i * HOUR_MS // lines for i in range(lines)]
    events = [
        XidEvent(
            ts_ms=times[i],
            cluster="c",
            node="n1",
            xid=code,
            pci_bus_id=f"0000:{i % 8:02x}:00.0",
            message=message,
        )
        for i in range(lines)
    ]
    started = time.perf_counter()
    for count, event in enumerate(events, 1):
        core.process(event)
        if count % 8192 == 0:
            core.drain()
    core.finish()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", default="1000,8000,32000", help="storm sizes, lines an hour")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny storms (100, 400 lines), one run")
    args = parser.parse_args(argv)
    sizes = [100, 400] if args.smoke else [int(n) for n in args.lines.split(",")]
    runs = 1 if args.smoke else args.runs
    settings = Settings()
    tune_for_streaming()
    print(f"XID storm cost in the detection core: one node, 8 GPUs, N lines within an hour; "
          f"us a line, median of {runs} run(s)")  # fmt: skip
    print()
    head = "".join(f"{f'{n:,} lines':>14}" for n in sizes)
    print(f"{'code':<44}{'job':<6}{head}{'largest / smallest':>20}")
    for code, (what, _) in STORMS.items():
        for with_job in (False, True):
            cells = []
            for lines in sizes:
                seconds = [storm_seconds(code, lines, with_job, settings) for _ in range(runs)]
                cells.append(1e6 * statistics.median(seconds) / lines)
            row = "".join(f"{cell:>14,.1f}" for cell in cells)
            label = f"XID {code} {what}"
            print(f"{label:<44}{'yes' if with_job else 'no':<6}{row}{cells[-1] / cells[0]:>20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
