"""A minimal Faust app for the Kafka integration tests: an agent that forwards every message of one
topic, key and value unchanged, to another.

Run as a worker process, configured by the environment:

    FAULTSTREAM_TEST_KAFKA=127.0.0.1:9092 FAUST_ECHO_ID=echo FAUST_ECHO_SOURCE=in FAUST_ECHO_SINK=out \
    FAUST_ECHO_DATADIR=/tmp/echo python tests/services/faust_echo.py worker -l warn --without-web

Importing this module does nothing but import faust (pytest's doctest collection imports it).
"""

from __future__ import annotations

import os
from typing import Any

import faust


def make_app(bootstrap: str, app_id: str, source: str, sink: str, datadir: str) -> faust.App:
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        datadir=datadir,
        consumer_auto_offset_reset="earliest",
        topic_replication_factor=1,
        topic_partitions=1,
    )
    raw: dict[str, Any] = {
        "key_type": bytes,
        "value_type": bytes,
        "key_serializer": "raw",
        "value_serializer": "raw",
    }
    source_topic = app.topic(source, **raw)
    sink_topic = app.topic(sink, **raw)

    @app.agent(source_topic)
    async def echo(stream: faust.StreamT[bytes]) -> None:
        async for key, value in stream.items():
            await sink_topic.send(key=key, value=value)

    return app


def main() -> None:
    env = os.environ
    make_app(
        env["FAULTSTREAM_TEST_KAFKA"],
        env["FAUST_ECHO_ID"],
        env["FAUST_ECHO_SOURCE"],
        env["FAUST_ECHO_SINK"],
        env["FAUST_ECHO_DATADIR"],
    ).main()


if __name__ == "__main__":
    main()
