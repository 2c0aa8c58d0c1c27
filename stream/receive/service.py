"""``faultstream receive``: Prometheus remote_write in, ECC samples and XID events out to Kafka.

A request is answered only once what it brought is safe in Kafka, so that an outage of Kafka
makes Prometheus retry and nothing is lost:

1. the body is decoded (:mod:`stream.inputs.parsers.remote_write`); one that is not a snappy
   ``WriteRequest`` is a 400 with the reason (and a dead letter); a series that cannot be used is
   a dead letter, the others go on;
2. its DCGM values, grouped by GPU and time, are written to the deployment's internal, compacted
   ``<app id>.remote-write-parts`` topic, and the request is answered (204) once Kafka acknowledged
   them (a 503 otherwise: Prometheus sends it again);
3. the values are gathered into whole samples (:class:`~stream.inputs.ecc_assembly.EccAssembly`):
   one GPU's counters of one scrape come in several requests. A sample complete, or settled, goes
   to the ``ecc`` topic (an XID gauge change to ``xid``), keyed by node; once Kafka acknowledged
   it, its parts are deleted from the parts topic (tombstones) and the GPU's place (its last time,
   XID gauge value and counters) is written there.

A receiver restarted reads the parts topic first: parts of samples not yet out are gathered again,
each GPU's place taken up. A sample that went out but whose tombstones did not is sent again: a
repeat of a record with the same id and event time, harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.records import EccSample, InvalidRecord, XidEvent
from stream.inputs.ecc_assembly import EccAssembly
from stream.inputs.parsers.remote_write import DcgmPoint, RemoteWriteError, dcgm_points, decode_write_request
from stream.kafka.codec import encode_record, partition_for_key, record_key
from stream.settings import Settings
from stream.sinks.dead_letters import to_dead_letter

__all__ = ["Answer", "Receiver"]

_log = logging.getLogger("faultstream.receive")

#: Dead letters' source for what the receiver refuses.
SOURCE = "remote_write"


@dataclass(frozen=True, slots=True)
class Answer:
    """The HTTP answer to a request: status and the reason, if any."""

    status: int
    reason: str = ""


@dataclass
class ReceiveCounts:
    """What the receiver did, for its metrics."""

    requests: int = 0
    refused: int = 0
    points: int = 0
    passed_over: int = 0
    dead_letters: int = 0
    samples_out: int = 0
    xids_out: int = 0
    repeats_restored: int = 0
    by_status: dict[int, int] = field(default_factory=dict)


def _part_key(node: str, gpu: int, ts_ms: int, request: int, number: int) -> bytes:
    return f"part/{node}/{gpu}/{ts_ms}/{request}/{number}".encode()


def _gpu_key(node: str, gpu: int) -> bytes:
    return f"gpu/{node}/{gpu}".encode()


class Receiver:
    """The remote_write receiver's state: the producer, the assembly, the parts saved."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer, assembly: EccAssembly) -> None:
        self.settings = settings
        self.producer = producer
        self.assembly = assembly
        self.lock = asyncio.Lock()
        self.counts = ReceiveCounts()
        #: Saved part keys of each gathering not out yet.
        self._parts: dict[tuple[str, int, int], list[bytes]] = {}
        self._request = 0
        self._partitions: dict[str, int] = {}

    async def restore(self, consumer_options: dict[str, Any]) -> int:
        """Read the parts topic to its end: gather again what is not out, take up each GPU's place;
        return how many parts were taken up."""
        topic = self.settings.topic_remote_write_parts
        consumer = AIOKafkaConsumer(enable_auto_commit=False, **consumer_options)
        await consumer.start()
        taken = 0
        try:
            partitions = [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})
            ]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            latest: dict[bytes, bytes | None] = {}
            left = {tp for tp in partitions if ends[tp] > 0}
            while left:
                for tp, messages in (await consumer.getmany(timeout_ms=1000)).items():
                    for message in messages:
                        latest[message.key] = message.value
                        if message.offset + 1 >= ends[tp]:
                            left.discard(tp)
        finally:
            await consumer.stop()
        points: list[DcgmPoint] = []
        for key, value in latest.items():
            if value is None:
                continue
            document = orjson.loads(value)
            if key.startswith(b"gpu/"):
                self.assembly.restore_gpu(
                    document["node"],
                    document["gpu"],
                    document["last_ms"],
                    document["last_xid"],
                    document["known"],
                )
                continue
            found = [
                DcgmPoint(document["node"], document["gpu"], document["pci"], document["ts"], counter, value)
                for counter, value in document["values"].items()
            ]
            self._parts.setdefault((document["node"], document["gpu"], document["ts"]), []).append(key)
            points.extend(found)
            taken += 1
        self.counts.repeats_restored = taken
        out = self.assembly.add(points)
        await self._send_out(out)
        return taken

    async def receive(self, body: bytes) -> Answer:
        """One remote_write request (see the module for the order of things)."""
        self.counts.requests += 1
        try:
            request = decode_write_request(body)
        except RemoteWriteError as exc:
            self.counts.refused += 1
            await self._dead_letters(
                [InvalidRecord(str(exc), raw=body[:65536], source=SOURCE, location="body")]
            )
            return Answer(400, str(exc))
        points, bad, skipped = dcgm_points(request, SOURCE)
        self.counts.points += len(points)
        self.counts.passed_over += skipped
        if bad:
            await self._dead_letters(bad)
        async with self.lock:
            self._request += 1
            groups: dict[tuple[str, int, int], dict[str, Any]] = {}
            for point in points:
                group = groups.setdefault(
                    (point.node, point.gpu, point.ts_ms),
                    {
                        "node": point.node,
                        "gpu": point.gpu,
                        "ts": point.ts_ms,
                        "pci": point.pci_bus_id,
                        "values": {},
                    },
                )
                group["values"][point.counter] = point.value
            sends = []
            for number, (where, group) in enumerate(groups.items()):
                key = _part_key(*where, self._request, number)
                self._parts.setdefault(where, []).append(key)
                sends.append(
                    await self._send(self.settings.topic_remote_write_parts, key, orjson.dumps(group))
                )
            await asyncio.gather(*sends)
            # Saved: answered below whatever the assembly does next (it is redone from the parts).
            await self._send_out(self.assembly.add(points))
        return Answer(204)

    async def settle(self) -> None:
        """Send out the samples that have gathered long enough (the timer calls this)."""
        async with self.lock:
            await self._send_out(self.assembly.due())

    async def _send_out(self, records: Iterable[EccSample | XidEvent]) -> None:
        """Records to their topics; once acknowledged, their parts deleted and their GPUs' places saved."""
        sends = []
        for record in records:
            topic = self.settings.topic_ecc if isinstance(record, EccSample) else self.settings.topic_xid
            sends.append(await self._send(topic, record_key(record), encode_record(record), record.ts_ms))
            if isinstance(record, EccSample):
                self.counts.samples_out += 1
            else:
                self.counts.xids_out += 1
        await asyncio.gather(*sends)
        closed = self.assembly.take_closed()
        if not closed:
            return
        tombstones = []
        for node, gpu, ts_ms in closed:
            for key in self._parts.pop((node, gpu, ts_ms), ()):
                tombstones.append(await self._send(self.settings.topic_remote_write_parts, key, None))
        for node, gpu in sorted({(node, gpu) for node, gpu, _ in closed}):
            place = self.assembly.gpu_state(node, gpu)
            assert place is not None
            value = {
                "node": node,
                "gpu": gpu,
                "last_ms": place[0],
                "last_xid": place[1],
                "known": list(place[2]),
            }
            tombstones.append(
                await self._send(
                    self.settings.topic_remote_write_parts, _gpu_key(node, gpu), orjson.dumps(value)
                )
            )
        await asyncio.gather(*tombstones)

    async def _send(self, topic: str, key: bytes, value: bytes | None, ts_ms: int | None = None) -> Any:
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = self._partitions[topic] = len(await self.producer.partitions_for(topic))
        return await self.producer.send(
            topic, key=key, value=value, partition=partition_for_key(key, partitions), timestamp_ms=ts_ms
        )

    async def _dead_letters(self, letters: list[InvalidRecord]) -> None:
        sends = []
        for error in letters:
            letter = to_dead_letter(error, "ecc")
            headers = [
                ("reason", letter.reason.encode()),
                ("source", letter.source.encode()),
                ("location", letter.location.encode()),
            ]
            sends.append(
                await self.producer.send(
                    self.settings.topic_dead_letters,
                    key=letter.source.encode(),
                    value=letter.raw,
                    headers=headers,
                )
            )
            self.counts.dead_letters += 1
        await asyncio.gather(*sends)
