"""Dump every faultstream table of a store as sorted JSON Lines, to compare two runs with ``diff -r``.

Used to show that a change of code leaves the results unchanged: replay the same inputs before and
after, dump both stores, and diff the folders. Rows are read ``FINAL`` (each fact once, as a reader
sees it) and sorted; wall-clock columns (``recorded_at``) are left out, they differ by design.

    python scripts/dump_tables.py --clickhouse chdb:///tmp/run-a/store --out /tmp/run-a/tables
    diff -r /tmp/run-a/tables /tmp/run-b/tables && echo identical
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import clickhouse_connect
import orjson

TABLES = (
    "xid_events",
    "job_events",
    "ecc_samples",
    "incidents",
    "job_attributions",
    "mttf_partials",
    "mttf_windows",
    "dead_letters",
)
WALL_CLOCK_COLUMNS = {"recorded_at"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clickhouse", required=True, help="DSN of the store (chdb:///abs/path or http://)")
    parser.add_argument("--database", default="faultstream")
    parser.add_argument("--out", type=Path, required=True, help="folder for one <table>.jsonl per table")
    args = parser.parse_args()
    client = clickhouse_connect.get_client(dsn=args.clickhouse)
    args.out.mkdir(parents=True, exist_ok=True)
    for table in TABLES:
        columns = [
            name
            for name, *_ in client.query(f"DESCRIBE TABLE {args.database}.{table}").result_rows
            if name not in WALL_CLOCK_COLUMNS
        ]
        final = "" if table == "mttf_windows" else " FINAL"
        result = client.query(f"SELECT {', '.join(columns)} FROM {args.database}.{table}{final}")
        lines = sorted(
            orjson.dumps(dict(zip(columns, row, strict=True)), default=str, option=orjson.OPT_SORT_KEYS)
            for row in result.result_rows
        )
        data = b"\n".join(lines) + b"\n"
        (args.out / f"{table}.jsonl").write_bytes(data)
        print(f"{table:18} {len(lines):>9} rows  sha1 {hashlib.sha1(data).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
