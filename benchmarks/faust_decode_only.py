"""A Faust app whose one agent only decodes each message's JSON: Faust's own cost, for the benchmark.

    python benchmarks/faust_decode_only.py HOST:PORT APP_ID COUNT TOPIC [TOPIC ...]

Reads the topics from the start in a fresh consumer group until COUNT messages were decoded, then
prints "RESULT <messages> <seconds>" (timed from the first message) and exits.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import faust
import orjson


def main() -> None:
    bootstrap, app_id, count, *topics = sys.argv[1:]
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
                print("RESULT", seen["count"], time.perf_counter() - seen["start"], flush=True)
                os._exit(0)  # the figure is printed; Faust's orderly shutdown is not part of it

    sys.argv = [sys.argv[0], "worker", "-l", "error", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
