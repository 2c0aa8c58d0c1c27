"""A Faust app whose one agent only decodes each message's JSON: Faust's own cost, for the benchmark.

    python benchmarks/faust_decode_only.py HOST:PORT APP_ID COUNT RESULT_FILE TOPIC [TOPIC ...]

Reads the topics from the start in a fresh consumer group until COUNT messages were decoded, then
writes "<messages> <seconds>" (timed from the first message) to RESULT_FILE and exits. (A file,
because Faust's worker turns stdout into log records, which a hard exit can lose.)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import faust
import orjson


def main() -> None:
    bootstrap, app_id, count, result_file, *topics = sys.argv[1:]
    wanted = int(count)
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        topic_allow_declare=False,
        datadir=tempfile.mkdtemp(prefix="faust-decode-only-"),
    )
    raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    seen = {"count": 0, "start": 0.0}

    @app.agent(app.topic(*topics, **raw))
    async def decode(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            if not seen["count"]:
                seen["start"] = time.perf_counter()
            orjson.loads(event.value)
            seen["count"] += 1
            if seen["count"] >= wanted:
                elapsed = time.perf_counter() - seen["start"]
                with open(result_file, "w") as out:
                    out.write(f"{seen['count']} {elapsed}\n")
                os._exit(0)  # the figure is printed; Faust's orderly shutdown is not part of it

    sys.argv = [sys.argv[0], "worker", "-l", "error", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
