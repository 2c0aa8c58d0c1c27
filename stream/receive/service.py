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
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.records import EccSample, InvalidRecord, XidEvent
from stream.inputs.ecc_assembly import EccAssembly
from stream.inputs.parsers.remote_write import DcgmPoint, RemoteWriteError, dcgm_points, decode_write_request
from stream.kafka.codec import encode_record, record_key
from stream.settings import Settings
from stream.sinks.dead_letters import KafkaDeadLetters, to_dead_letter

__all__ = ["Answer", "Receiver"]

_log = logging.getLogger("faultstream.receive")

#: Dead letters' source for what the receiver refuses.
SOURCE = "remote_write"


@dataclass(frozen=True, slots=True)
class Answer:
    """The HTTP answer to a request: status and the reason, if any."""

    status: int
    reason: str = ""


_Where = tuple[str, int, int]  # (node, GPU, time) of a gathering


def _gpu_key(node: str, gpu: int) -> bytes:
    return f"gpu/{node}/{gpu}".encode()


class Receiver:
    """The remote_write receiver's state: the producer, the assembly, the parts saved."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer, assembly: EccAssembly) -> None:
        self.settings = settings
        self.producer = producer
        self.assembly = assembly
        self.lock = asyncio.Lock()

        async def send_dead_letter(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
            return await producer.send(settings.topic_dead_letters, key=key, value=value, headers=headers)

        self._letters = KafkaDeadLetters(send_dead_letter)
        #: Each saved request (its key on the parts topic) and its gatherings not out yet; the saved
        #: requests of each gathering. A request's message is deleted once all its gatherings are out.
        self._open: dict[bytes, set[_Where]] = {}
        self._saved_in: dict[_Where, list[bytes]] = {}
        #: Each GPU's place as last saved: written again only when its counters or XID gauge change.
        self._places: dict[tuple[str, int], tuple[tuple[str, ...], int, int]] = {}
        self._run = uuid.uuid4().hex[:12]  # request keys of this run never meet a previous run's
        #: Deliveries under way; set when one failed (the server stops: a restart sends again).
        self._deliveries: set[asyncio.Task[None]] = set()
        self.failed = asyncio.Event()
        self._request = 0

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
                node, gpu, known = document["node"], document["gpu"], tuple(document["known"])
                xid_ms = document.get("xid_ms", 0)  # absent in a place saved before it was kept
                self.assembly.restore_gpu(node, gpu, document["last_ms"], document["last_xid"], known, xid_ms)
                self._places[(node, gpu)] = (known, document["last_xid"], xid_ms)
                continue
            self._save(key, document)
            points.extend(
                DcgmPoint(group["node"], group["gpu"], group["pci"], group["ts"], counter, value)
                for group in document
                for counter, value in group["values"].items()
            )
            taken += 1
        self._dispatch(self.assembly.add(points))
        await self.drain()
        return taken

    async def receive(self, body: bytes) -> Answer:
        """One remote_write request (see the module for the order of things)."""
        try:
            request = decode_write_request(body)
        except RemoteWriteError as exc:
            await self._dead_letters([InvalidRecord(str(exc), raw=body, source=SOURCE, location="body")])
            return Answer(400, str(exc))
        points, bad, _skipped = dcgm_points(request, SOURCE)
        if bad:
            await self._dead_letters(bad)
        self._request += 1
        groups: dict[_Where, dict[str, Any]] = {}
        for point in points:
            group = groups.get((point.node, point.gpu, point.ts_ms))
            if group is None:
                group = groups[(point.node, point.gpu, point.ts_ms)] = {
                    "node": point.node, "gpu": point.gpu, "ts": point.ts_ms, "pci": point.pci_bus_id,
                    "values": {},
                }  # fmt: skip
            group["values"][point.counter] = point.value
        if groups:
            key = f"request/{self._run}/{self._request}".encode()
            document = list(groups.values())
            # A failure here leaves nothing gathered: the request is answered 503 and sent again.
            await (await self._send(self.settings.topic_remote_write_parts, key, orjson.dumps(document)))
            self._save(key, document)
        # Saved: answered now, whatever comes of the samples (a restart gathers them again).
        async with self.lock:
            self._dispatch(self.assembly.add(points))
        return Answer(204)

    async def settle(self) -> None:
        """Send out the samples that have gathered long enough (the timer calls this)."""
        async with self.lock:
            self._dispatch(self.assembly.due())

    async def drain(self) -> None:
        """Wait for every delivery under way (a stop)."""
        while self._deliveries:
            await asyncio.gather(*list(self._deliveries), return_exceptions=True)

    def _dispatch(self, records: list[EccSample | XidEvent]) -> None:
        """Send records out (in order: the producer keeps each partition's order); once Kafka has
        them, delete the parts of the gatherings they closed and save the GPUs' changed places
        (every record comes from a gathering that closed)."""
        closed = self.assembly.take_closed()
        if not closed:
            return
        places = []
        for node, gpu in sorted({(node, gpu) for node, gpu, _ in closed}):
            place = self.assembly.gpu_state(node, gpu)
            assert place is not None
            last_ms, last_xid, known, xid_ms = place
            # The gauge's sample time is saved with its value only: a gauge that did not change
            # is not written again at every scrape (a restart takes the last change's time as the
            # previous sample: a wider interval for the next change, never a narrower one).
            saved = self._places.get((node, gpu))
            if saved is None or saved[:2] != (known, last_xid):
                self._places[(node, gpu)] = (known, last_xid, xid_ms)
                value = {
                    "node": node,
                    "gpu": gpu,
                    "last_ms": last_ms,
                    "last_xid": last_xid,
                    "xid_ms": xid_ms,
                    "known": list(known),
                }
                places.append((_gpu_key(node, gpu), orjson.dumps(value)))
        done = []
        for where in closed:
            for key in self._saved_in.pop(where, ()):
                still = self._open.get(key)
                if still is not None:
                    still.discard(where)
                    if not still:
                        del self._open[key]
                        done.append(key)
        task = asyncio.get_running_loop().create_task(self._deliver(records, done, places))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver(
        self, records: list[EccSample | XidEvent], done: list[bytes], places: list[tuple[bytes, bytes]]
    ) -> None:
        try:
            sends = []
            for record in records:
                topic = self.settings.topic_ecc if isinstance(record, EccSample) else self.settings.topic_xid
                sends.append(await self._send(topic, record_key(record), encode_record(record), record.ts_ms))
            await asyncio.gather(*sends)
            parts = self.settings.topic_remote_write_parts
            after = [await self._send(parts, key, None) for key in done]
            after += [await self._send(parts, key, value) for key, value in places]
            await asyncio.gather(*after)
        except Exception as exc:
            # Gathered in memory, not in Kafka: only a restart (from the parts saved) sends them.
            _log.error(
                "samples not delivered to Kafka (%r): stopping so that a restart sends them again", exc
            )
            self.failed.set()

    def _save(self, key: bytes, groups: list[dict[str, Any]]) -> None:
        """Remember a saved request's gatherings (deleted from the topic once all are out)."""
        wheres = {(group["node"], group["gpu"], group["ts"]) for group in groups}
        self._open[key] = wheres
        for where in wheres:
            self._saved_in.setdefault(where, []).append(key)

    async def _send(self, topic: str, key: bytes, value: bytes | None, ts_ms: int | None = None) -> Any:
        """Send one message (the producer's default partitioner places it by its key, as every
        producer keyed by node does); the result awaits the broker's ack."""
        return await self.producer.send(topic, key=key, value=value, timestamp_ms=ts_ms)

    async def _dead_letters(self, letters: list[InvalidRecord]) -> None:
        """Deliver dead letters to the dead-letter topic (cut and headed as every dead letter is)."""
        for error in letters:
            self._letters.produce(to_dead_letter(error, "ecc"))
        await self._letters.deliver(0)
