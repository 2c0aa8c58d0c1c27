"""What a storm costs the detection core a record, as the storm grows.

A monitor is needed most when a node logs thousands of XID lines an hour (a flapping NVLink, a
GPU falling off the bus again and again, a job in a crash loop), or when a user's sweep fails
thousands of runs a day: the cost of a record must not grow with the storm. Straight into the
core (``DetectionCore.process``, the fleet stage in process; no input or output), the median of
``--runs`` runs (timed as ``core_alone.py`` times the core), and the largest storm's cost over
the smallest's (1.0: linear):

* XID storms: for each code below, one node's 8 GPUs log N lines within an hour, with no job on
  the node and with one job running there (job-aware storms); microseconds a line;
* a sweep: one user's runs on 16 nodes, N a day for two days, each failing after a minute with
  an application XID (its start, the XID, its end); microseconds a run.

    python benchmarks/storm_cost.py                         # 1,000 / 8,000 / 32,000 lines or runs
    python benchmarks/storm_cost.py --lines 500,4000 --runs 5
    python benchmarks/storm_cost.py --smoke                 # CI: tiny storms, one run
"""

from __future__ import annotations

import argparse
import statistics
import sys

from core_alone import core_seconds

from detectors.core import DetectionCore
from schemas.records import JobEvent, JobState, XidEvent
from schemas.timeutil import DAY_MS, HOUR_MS, MINUTE_MS
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
    return core_seconds(core, events)


def sweep_seconds(runs_a_day: int, settings: Settings) -> float:
    """Seconds of the core for two days of one user's sweep failing ``runs_a_day`` runs a day."""
    core = DetectionCore(settings.core_config())
    records: list[JobEvent | XidEvent] = []
    for number in range(2 * runs_a_day):
        start = T0 + number * DAY_MS // runs_a_day
        node, job_id = f"n{number % 16:02d}", f"sweep-{number}"
        records += [
            JobEvent(ts_ms=start, cluster="c", job_id=job_id, state=JobState.RUNNING, start_ms=start,
                     nodes=(node,), gpus=8, user="sweeper"),
            XidEvent(ts_ms=start + 30_000, cluster="c", node=node, xid=13, pci_bus_id="0000:07:00.0",
                     message="Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
            JobEvent(ts_ms=start + MINUTE_MS, cluster="c", job_id=job_id, state=JobState.FAILED,
                     start_ms=start, end_ms=start + MINUTE_MS, nodes=(node,), gpus=8, user="sweeper"),
        ]  # fmt: skip
    records.sort(key=lambda record: record.ts_ms)
    return core_seconds(core, records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", default="1000,8000,32000", help="storm sizes: lines an hour, runs a day")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny storms (100, 400 lines), one run")
    args = parser.parse_args(argv)
    sizes = [100, 400] if args.smoke else [int(n) for n in args.lines.split(",")]
    runs = 1 if args.smoke else args.runs
    settings = Settings()
    tune_for_streaming()
    print(f"XID storm cost in the detection core: one node, 8 GPUs, N lines within an hour (NVLink: in 4 "
          f"bursts, 15 minutes apart); us a line, median of {runs} run(s)")  # fmt: skip
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
    print()
    print(f"a user's sweep failing N runs a day on 16 nodes, two days; us a run, median of {runs} run(s)")
    print()
    head = "".join(f"{f'{n:,} a day':>14}" for n in sizes)
    print(f"{'':<50}{head}{'largest / smallest':>20}")
    cells = []
    for per_day in sizes:
        seconds = [sweep_seconds(per_day, settings) for _ in range(runs)]
        cells.append(1e6 * statistics.median(seconds) / (2 * per_day))
    row = "".join(f"{cell:>14,.1f}" for cell in cells)
    print(f"{'sweep of failing runs (start, XID 13, FAILED)':<50}{row}{cells[-1] / cells[0]:>20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
