"""The detection core alone: a replay's records, parsed and merged beforehand, through the core.

What every path that runs this core can reach at most, whatever its input and output cost: no
file, no Kafka, no decoding, no ClickHouse, only ``DetectionCore.process`` for each record (with
the fleet stage in process, as the embedded replay runs it), a drain every 8,192 records as the
replay drains, and the end of the input. ``benchmarks/worker_throughput.py`` runs it as a row
of its table, so that the worker's ratio to a bare consumer can be read against this ceiling.

    python benchmarks/core_alone.py FILE...        # prints {"records": N, "seconds": S} as JSON
    python benchmarks/core_alone.py --digest FILE...   # and "digest": a sha256 of what the core emits

Run with the garbage collector tuned as ``faultstream replay`` and ``faultstream worker`` tune it
(``stream/gc_tuning.py``), after the records are in memory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from detectors.core import DetectionCore, Emitted
from schemas.records import InvalidRecord, Record
from stream.gc_tuning import tune_for_streaming
from stream.inputs.files import LateRecord, MergedInputs
from stream.inputs.parsers.options import ParseOptions
from stream.settings import Settings

#: Records between drains of the core's decisions (as ``stream.replay`` drains).
DRAIN_EVERY = 8192


def replay_records(paths: list[Path], settings: Settings) -> list[Record]:
    """The records of ``paths`` as the replay hands them to the core (parsed and merged)."""
    inputs = MergedInputs(paths, ParseOptions(), None, settings.allowed_lateness_seconds * 1000)
    try:
        return [item for item, _ in inputs if not isinstance(item, InvalidRecord | LateRecord)]
    finally:
        inputs.close()


def run_core(paths: list[Path], settings: Settings) -> tuple[int, float]:
    """(records, seconds of the core alone) for the replay's records of ``paths``."""
    records = replay_records(paths, settings)
    tune_for_streaming()
    return len(records), core_seconds(DetectionCore(settings.core_config()), records)


def core_seconds(core: DetectionCore, records: Iterable[Record]) -> float:
    """Seconds of ``core`` processing ``records`` in their order, drained every
    :data:`DRAIN_EVERY`, to the end of the input (:meth:`DetectionCore.finish`, which drains)."""
    started = time.perf_counter()
    run_through(core, records)
    return time.perf_counter() - started


def core_digest(core: DetectionCore, records: Iterable[Record]) -> str:
    """A sha256 of everything ``core`` emits for ``records`` (incidents, attributions, MTTF rows and
    ECC rows, by their reprs, drained as :func:`core_seconds` drains): equal digests, equal outputs.
    Records name the file they came from: compare digests of the same files at the same paths."""
    digest = hashlib.sha256()

    def take(emitted: Emitted) -> None:
        for rows in (emitted.incidents, emitted.attributions, emitted.mttf, emitted.ecc_rows):
            for row in rows:
                digest.update(repr(row).encode())

    run_through(core, records, take)
    return digest.hexdigest()


def run_through(
    core: DetectionCore, records: Iterable[Record], take: Callable[[Emitted], object] = lambda _: None
) -> None:
    """``records`` through ``core`` in their order, what it decided handed to ``take`` every
    :data:`DRAIN_EVERY` records and at the end of the input (:meth:`DetectionCore.finish`)."""
    for count, record in enumerate(records, 1):
        core.process(record)
        if count % DRAIN_EVERY == 0:
            take(core.drain())
    take(core.finish())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--digest", action="store_true", help="also a digest of the outputs (a run apart)")
    args = parser.parse_args(argv)
    settings = Settings()
    records, seconds = run_core(args.files, settings)
    result: dict[str, object] = {"records": records, "seconds": seconds}
    if args.digest:
        records_again = replay_records(args.files, settings)
        result["digest"] = core_digest(DetectionCore(settings.core_config()), records_again)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
