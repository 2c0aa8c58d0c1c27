"""Cost of decoding one input record: ``orjson.loads`` alone, then with validation (``from_dict``).

    python benchmarks/decode.py                  # 50 nodes x 3 days simulated, >= 50,000 records a run
    python benchmarks/decode.py --smoke          # tiny input and counts, for CI: checks it runs
    python benchmarks/decode.py --nodes 200 --days 7 --records 200000

The records are realistic: the simulator writes a cluster's DCGM scrape, kernel log and sacct
output, the project's parsers read them into records, and each record is serialised the two
ways a topic may carry it: the human-facing form of ``to_dict()`` (ISO-8601 timestamps) and the
wire form of ``to_wire()`` (integer epoch milliseconds). Every line is first checked to decode
back to the record it came from.

For each kind and form a run decodes at least ``--records`` lines (the distinct lines cycled);
the table shows the median over ``--runs`` runs, in microseconds per record:

* ``loads``: ``orjson.loads`` alone, the floor;
* ``loads+from_dict``: what validation adds, the figure the target (<= 3 us, wire form, ECC and
  XID) is about;
* ``decode_record``: the worker's call for a one-record message
  (``stream.kafka.codec.decode_record``), which also builds the ``source`` string and wraps
  failures;
* ``in 256s``: the worker's call for messages of 256 records (``decode_message_lines``, each
  record with its line), per record: a message of ECC lines is decoded in one call of the typed
  decoder.

The garbage collector stays on, as in the worker. These machines are noisy: compare figures of
one run of this script, not across runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

from schemas.records import RECORD_KIND, EccSample, InvalidRecord, JobEvent, Record, XidEvent
from stream.inputs.files import read_records
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.codec import decode_message_lines, decode_record
from stream.simulator import SimulationConfig, simulate

#: The simulator's files, the kind of record each yields, in the order of the table.
_FILES = (("dcgm.prom", "ecc"), ("kernel.log", "xid"), ("sacct.txt", "job"))
_PARSERS: dict[str, Callable[[object, str], Record]] = {
    "ecc": EccSample.from_dict,
    "xid": XidEvent.from_dict,
    "job": JobEvent.from_dict,
}
#: A ``source`` as the worker passes it (``topic/partition:location``).
_SOURCE = "faultstream.ecc/0:offset 123456"

#: Records a message in the last column (``replay --to``'s default batch).
_PER_MESSAGE = 256

#: Column widths of the table; a negative width aligns left.
_WIDTHS = (-5, -5, 8, 7, 16, 10, 14, 9)


def _cell(value: str | float, width: int) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else value
    return text.ljust(-width) if width < 0 else text.rjust(width)


def _load(sim_dir: Path) -> dict[str, list[Record]]:
    """The simulated files' records by kind (dead letters dropped: there are none to time)."""
    by_kind: dict[str, list[Record]] = {}
    for name, kind in _FILES:
        records = [
            r for r in read_records(sim_dir / name, ParseOptions()) if not isinstance(r, InvalidRecord)
        ]
        if any(RECORD_KIND[type(r)] != kind for r in records):
            raise SystemExit(f"{name}: expected only {kind} records")
        if not records:
            raise SystemExit(f"{name}: no {kind} records; simulate more nodes or days")
        by_kind[kind] = records
    return by_kind


def _serialise(records: Sequence[Record], form: str) -> list[bytes]:
    """Each record as a message value, checked to decode back to the same record."""
    lines = []
    for record in records:
        document: dict[str, Any] = record.to_dict() if form == "iso" else record.to_wire()
        line = orjson.dumps(document)
        back = _PARSERS[RECORD_KIND[type(record)]](orjson.loads(line), _SOURCE)
        replace = msgspec.structs.replace if isinstance(record, msgspec.Struct) else dataclasses.replace
        if back != replace(record, source=_SOURCE):
            raise SystemExit(f"{form} form does not round-trip: {record} -> {line!r} -> {back}")
        lines.append(line)
    return lines


def _measure(kind: str, lines: list[bytes], count: int, runs: int) -> tuple[float, float, float, float]:
    """Median us/record over ``runs`` runs of ``count`` lines: loads, loads+from_dict, decode_record,
    and decode_message_lines over messages of ``_PER_MESSAGE`` lines."""
    batch = (lines * -(-count // len(lines)))[:count]
    messages = [b"\n".join(batch[i : i + _PER_MESSAGE]) for i in range(0, count, _PER_MESSAGE)]
    loads = orjson.loads
    parse = _PARSERS[kind]
    source = _SOURCE

    def loads_only() -> None:
        for line in batch:
            loads(line)

    def loads_and_validate() -> None:
        for line in batch:
            parse(loads(line), source)

    def worker_call() -> None:
        for line in batch:
            decode_record(kind, line, "faultstream.ecc/0", "offset 123456")

    def worker_message() -> None:
        for offset, value in enumerate(messages):
            for item, _ in decode_message_lines(kind, value, "faultstream.ecc/0", offset):
                if isinstance(item, InvalidRecord):
                    raise SystemExit(f"{kind}: a line of a message did not decode: {item.reason}")

    loads_only()  # warm up: orjson's key cache, the PCI id cache, the allocator
    loads_and_validate()
    # The three bodies take turns within each run, so that a burst of load on the machine falls
    # on all three figures of a run rather than on one.
    bodies = (loads_only, loads_and_validate, worker_call, worker_message)
    samples: tuple[list[float], ...] = ([], [], [], [])
    for _ in range(runs):
        for body, times in zip(bodies, samples, strict=True):
            started = time.perf_counter_ns()
            body()
            times.append((time.perf_counter_ns() - started) / count / 1000)
    loads_us, total_us, worker_us, message_us = (statistics.median(times) for times in samples)
    return loads_us, total_us, worker_us, message_us


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--records", type=int, default=50_000, help="records decoded per run (default 50,000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per figure; the median is shown")
    parser.add_argument("--smoke", action="store_true", help="tiny input and counts: only checks it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.records = 16, 1.0, 500

    with tempfile.TemporaryDirectory(prefix="faultstream-decode-") as tmp:
        sim_dir = Path(tmp)
        simulate(SimulationConfig(nodes=args.nodes, days=args.days, seed=args.seed), sim_dir)
        by_kind = _load(sim_dir)

    print(
        f"{args.nodes} nodes x {args.days:g} days (seed {args.seed}); us per record, "
        f"median of {args.runs} runs of {args.records:,} records"
    )
    header = ("kind", "form", "distinct", "loads", "loads+from_dict", "from_dict", "decode_record", "in 256s")
    print(" ".join(_cell(title, width) for title, width in zip(header, _WIDTHS, strict=True)))
    for kind, records in by_kind.items():
        for form in ("iso", "wire"):
            lines = _serialise(records, form)
            loads_us, total_us, worker_us, message_us = _measure(kind, lines, args.records, args.runs)
            row = (
                kind,
                form,
                f"{len(lines):,}",
                loads_us,
                total_us,
                total_us - loads_us,
                worker_us,
                message_us,
            )
            print(" ".join(_cell(value, width) for value, width in zip(row, _WIDTHS, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
