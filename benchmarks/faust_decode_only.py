"""A Faust app whose one agent only decodes each record: Faust's own cost, for the throughput benchmark.

    python benchmarks/faust_decode_only.py HOST:PORT APP_ID RECORDS RESULT_FILE TOPIC [TOPIC ...]

Reads the topics from the start in a fresh consumer group (APP_ID), values as raw bytes, one
message at a time (``stream.events()``, as the worker's agents do); splits each value on
``b"\\n"`` and ``orjson.loads`` every non-empty line (one line = one record, the wire format of the
input topics). When RECORDS records were decoded it writes a JSON object to RESULT_FILE and exits:
``records`` and ``messages`` decoded, ``first`` (wall time of the first message) and ``end`` (wall
time of the last record decoded), both ``time.time()`` so the caller can also time the run from
the process launch. (A file, because Faust's worker turns stdout into log records, which a hard
exit can lose.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import faust
import orjson

from stream.settings import Settings


def main() -> None:
    bootstrap, app_id, count, result_file, *topics = sys.argv[1:]
    wanted = int(count)
    datadir = tempfile.mkdtemp(prefix="faust-decode-only-")  # removed at the exit below
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        consumer_max_fetch_size=Settings().worker_fetch_partition_bytes,  # the worker's
        topic_allow_declare=False,
        datadir=datadir,
    )
    raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    seen = {"records": 0, "messages": 0, "first": 0.0}

    @app.agent(app.topic(*topics, **raw))
    async def decode(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            if not seen["messages"]:
                seen["first"] = time.time()
            seen["messages"] += 1
            records = 0
            for line in event.value.split(b"\n"):
                if line:
                    orjson.loads(line)
                    records += 1
            seen["records"] += records
            if seen["records"] >= wanted:
                end = time.time()
                with open(result_file, "w") as out:
                    json.dump({**seen, "end": end}, out)
                shutil.rmtree(datadir, ignore_errors=True)
                os._exit(0)  # the figure is written; Faust's orderly shutdown is not part of it

    sys.argv = [sys.argv[0], "worker", "-l", "error", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
