"""The detection core alone: a replay's records, parsed and merged beforehand, through the core.

What every path that runs this core can reach at most, whatever its input and output cost: no
file, no Kafka, no decoding, no ClickHouse, only ``DetectionCore.process`` for each record (with
the fleet stage in process, as the embedded replay runs it), a drain every 8,192 records as the
replay drains, and the end of the input. ``benchmarks/worker_throughput.py`` runs it as a row
of its table, so that the worker's ratio to a bare consumer can be read against this ceiling.

    python benchmarks/core_alone.py FILE...        # prints {"records": N, "seconds": S} as JSON

Run with the garbage collector tuned as ``faultstream replay`` and ``faultstream worker`` tune it
(``stream/gc_tuning.py``), after the records are in memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from detectors.core import DetectionCore
from schemas.records import InvalidRecord, Record
from stream.gc_tuning import tune_for_streaming
from stream.inputs.files import LateRecord, MergedInputs
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings

#: Records between drains of the core's decisions (as ``stream.replay`` drains).
DRAIN_EVERY = 8192


def run_core(paths: list[Path], settings: Settings) -> tuple[int, float]:
    """(records, seconds of the core alone) for the replay's records of ``paths``."""
    inputs = MergedInputs(paths, ParseOptions(), None, settings.allowed_lateness_seconds * 1000)
    try:
        records = [item for item, _ in inputs if not isinstance(item, InvalidRecord | LateRecord)]
    finally:
        inputs.close()
    tune_for_streaming()
    return len(records), core_seconds(DetectionCore(settings.core_config()), records)


def core_seconds(core: DetectionCore, records: Iterable[Record]) -> float:
    """Seconds of ``core`` processing ``records`` in their order, drained every
    :data:`DRAIN_EVERY`, to the end of the input (:meth:`DetectionCore.finish`, which drains)."""
    started = time.perf_counter()
    for count, record in enumerate(records, 1):
        core.process(record)
        if count % DRAIN_EVERY == 0:
            core.drain()
    core.finish()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    records, seconds = run_core(args.files, Settings())
    print(json.dumps({"records": records, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
