"""A bare aiokafka consumer that reads and decodes every record: the floor row of the throughput
benchmark, in a process of its own, as every other row runs.

    python benchmarks/bare_consumer.py HOST:PORT LABEL RECORDS RESULT_FILE TOPIC:PARTITIONS[=KIND] [...]

Assigns the partitions of the topics (no consumer group; LABEL only names the run), reads them
from the beginning with the worker's fetch size, splits each message value on ``b"\\n"`` and
``orjson.loads`` every non-empty line (one line = one record, the wire format of the input topics);
a topic given with ``=KIND`` (``xid``, ``ecc`` or ``job``) has each line decoded into its
validated record instead (``decode_record``, what the worker does before anything else). When
RECORDS records were decoded it writes a JSON object to RESULT_FILE and exits: ``records`` and
``messages`` decoded, ``first`` (wall time of the first message) and ``end`` (wall time of the
last record decoded), both ``time.time()`` so the caller also times the run from the process
launch, as it does the quix-streams, Faust and worker rows (in the benchmark's own process the
consumer skipped the interpreter's start and its imports, ~0.1-0.2 s, that every other row paid).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream.settings import Settings


async def consume(
    bootstrap: str, wanted: int, kinds: dict[str, str | None], partitions: dict[str, int]
) -> dict[str, float]:
    decode_record = None
    if any(kinds.values()):
        from stream.kafka.codec import decode_record  # the validating row's cost includes its import
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=Settings().worker_fetch_partition_bytes,  # the worker's round trips
    )
    await consumer.start()
    try:
        tps = [
            TopicPartition(topic, partition)
            for topic, count in partitions.items()
            for partition in range(count)
        ]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records = messages = 0
        first = 0.0
        deadline = time.monotonic() + 1800
        loads = orjson.loads
        while records < wanted:
            if time.monotonic() > deadline:
                raise SystemExit(f"bare consumer: {records} of {wanted} records after 30 minutes")
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if batches and not first:
                first = time.time()
            for tp, batch in batches.items():
                kind = kinds[tp.topic]
                source = f"{tp.topic}/{tp.partition}"
                for message in batch:
                    messages += 1
                    for line in message.value.split(b"\n"):
                        if line:
                            if kind is None:
                                loads(line)
                            else:
                                decode_record(kind, line, source, "bench")
                            records += 1
        return {"records": records, "messages": messages, "first": first, "end": time.time()}
    finally:
        await consumer.stop()


def main() -> None:
    bootstrap, _label, count, result_file, *topics = sys.argv[1:]
    kinds: dict[str, str | None] = {}
    partitions: dict[str, int] = {}
    for spec in topics:
        where, _, kind = spec.partition("=")
        topic, _, number = where.rpartition(":")
        kinds[topic], partitions[topic] = kind or None, int(number)
    seen = asyncio.run(consume(bootstrap, int(count), kinds, partitions))
    with open(result_file, "w") as out:
        json.dump(seen, out)


if __name__ == "__main__":
    main()
