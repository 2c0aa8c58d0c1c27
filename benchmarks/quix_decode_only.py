"""A minimal quix-streams application that only decodes each record: the peer row of the throughput
benchmark (what a Python team would write instead of a Faust app).

    python benchmarks/quix_decode_only.py HOST:PORT GROUP RECORDS RESULT_FILE TOPIC [TOPIC ...]

One ``StreamingDataFrame`` per topic, read from the earliest offset in the fresh consumer group
GROUP, values as raw bytes; a callback splits each message value on ``b"\\n"`` and
``orjson.loads`` every non-empty line (one line = one record, the wire format of the input
topics). When RECORDS records were decoded it writes a JSON object to RESULT_FILE and stops:
``records`` and ``messages`` decoded, ``first`` (wall time of the first message) and ``end``
(wall time of the last record decoded), both ``time.time()`` so the caller can also time the run
from the process launch. Needs ``quixstreams`` (``pip install -e .[bench]``).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time

import orjson
from quixstreams import Application


def main() -> None:
    bootstrap, group, count, result_file, *topics = sys.argv[1:]
    wanted = int(count)
    state_dir = tempfile.mkdtemp(prefix="quix-decode-only-")
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        auto_create_topics=False,
        use_changelog_topics=False,
        state_dir=state_dir,
        loglevel=logging.WARNING,
    )
    seen = {"records": 0, "messages": 0, "first": 0.0}

    def decode(value: bytes) -> None:
        if not seen["messages"]:
            seen["first"] = time.time()
        seen["messages"] += 1
        records = 0
        for line in value.split(b"\n"):
            if line:
                orjson.loads(line)
                records += 1
        seen["records"] += records
        if seen["records"] >= wanted:
            end = time.time()
            with open(result_file, "w") as out:
                json.dump({**seen, "end": end}, out)
            app.stop()

    for name in topics:
        topic = app.topic(name, value_deserializer="bytes", key_deserializer="bytes")
        app.dataframe(topic).update(decode)
    try:
        app.run()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
