"""Detector-state checkpoints of the worker, tied to the offsets they cover.

A checkpoint of input partition *p* holds the partition's :class:`~detectors.core.DetectionCore`,
the records its event-time merge still holds back, and for each input topic the offset of the
last message whose effect is inside. The worker writes one at every commit point, after the
ClickHouse flush and the incident sends and *before* it acks the messages, so Kafka's committed
offset of a partition never passes what the newest checkpoint covers. A worker that takes over
the partition (restart, crash, rebalance) loads the checkpoint and skips the messages at or below
its offsets: the detectors continue where they were, they neither relearn from zero nor see any
message twice, and the incidents they emit are the ones the old worker would have emitted.

Fencing: a checkpoint carries the consumer group generation in which its writer took the
partition, and a writer never replaces a checkpoint it has not seen: before each write it checks
that the partition's checkpoint log ends where its own last read or write left it. If it does
not, another worker has taken the partition over and written since (the group moved on without
this one: a session that timed out, a rebalance during a slow commit point), and the write is
refused with :class:`StaleCheckpoint`; the worker then drops the partition's state, commits
nothing for it, and reloads the newer checkpoint if it still owns the partition. Without the check
a stale owner's older checkpoint could land after the newer owner's and be the one the next owner
restored, older than the group's committed offset (a "takeover gap", which the restore would then
read again). The check and the write are two requests, so a takeover in the
milliseconds between them is not caught; the restore then warns of the gap and reads it again.

Storage is a compacted Kafka topic (``topic_checkpoints``) with one partition per input partition:
the checkpoint of *p* is the newest message of partition *p*, keyed ``<app id>/<p>``. A value is a
header naming the format (``faultstream-checkpoint/<FORMAT>``, newline) and an LZ4-compressed
pickle (zlib up to format 4), the held records' lines in columns (:class:`HeldLines`). Pickles name
classes by their module paths, so any move of a pickled class bumps ``FORMAT``: the header is read
before anything is unpickled, and a checkpoint of a format this version cannot read is refused with
what to do instead of failing somewhere inside pickle. Only workers write that topic; it is
internal state, not an interface.
"""

from __future__ import annotations

import array
import logging
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any

import lz4.frame
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from detectors.core import DetectionCore
from detectors.fleet import FleetCore
from schemas.records import EccSample, JobEvent, XidEvent
from stream.kafka.fleet import check_deployment
from stream.kafka.topics import CHECKPOINT_MAX_BYTES

__all__ = [
    "CheckpointError",
    "CheckpointTopic",
    "HeldLines",
    "PartitionCheckpoint",
    "StaleCheckpoint",
    "decode",
    "encode",
]

_log = logging.getLogger("faultstream.checkpoints")

#: Bumped whenever the pickled layout or a pickled class's module changes; an older checkpoint is
#: then refused loudly. 2: the layout by concept (stream.worker.*, detectors split); 3: the fleet
#: stage (detectors.fleet) inside the core; 4: held records as their lines (:data:`HeldRecord`). A
#: format in ``_READABLE`` but older than ``FORMAT`` is still restored. 5: LZ4, not zlib, and the
#: held lines in columns (about a quarter of the time to encode a commit point holding many
#: records).
FORMAT = 5
_READABLE = frozenset({"3", "4", "5"})
#: Formats whose body is zlib-compressed (later ones: LZ4 frames).
_ZLIB_FORMATS = frozenset({"3", "4"})
_HEADER = b"faultstream-checkpoint/"

#: A record the event-time merge holds: (merge source, event time ms, its line on the wire, its
#: record's ``source`` field). The line, not the record: pickling 50,000 held records took ~0.5 s
#: of every commit point while one input ran ahead of another; their lines take a few ms, and
#: decoding them again on a restore is cheap. (Format 3 held the records themselves.)
HeldRecord = tuple[str, int, bytes, str] | tuple[str, int, XidEvent | EccSample | JobEvent]


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or written."""


class StaleCheckpoint(CheckpointError):
    """Another worker wrote the partition's checkpoint since this one read or wrote it: this one is
    no longer the partition's owner, and its checkpoint must not replace the newer one."""


@dataclass(slots=True)
class PartitionCheckpoint:
    """What a worker needs to continue an input partition exactly where another one stopped."""

    partition: int
    #: Input topic -> offset of the last message of this partition whose effect is inside.
    offsets: dict[str, int]
    core: DetectionCore
    #: Records the event-time merge still held back, in release order (a worker writes them in
    #: columns; :func:`decode` always gives a list).
    held: list[HeldRecord] | HeldLines = field(default_factory=list)
    #: Input partition 0 only: the fleet stage, and the next offset of the fleet topic to read.
    fleet: FleetCore | None = None
    fleet_offset: int = 0
    #: Per source partition (a jobs partition's number, ``kernel/<number>``), the highest source
    #: offset of a re-keyed copy applied (:class:`stream.worker.rekeying.CopiesApplied`).
    copies: dict[int | str, int] = field(default_factory=dict)
    #: The consumer group generation in which the writer took the partition (-1: unknown).
    generation: int = -1
    #: Re-keyed job copies the partition skipped as repeats, over its history (absent from a
    #: checkpoint written before they were counted: read it with ``getattr(..., "repeats", 0)``).
    repeats: int = 0


@dataclass(frozen=True, slots=True)
class HeldLines:
    """Held records of the wire form (:data:`HeldRecord` with a line) in columns, as a checkpoint
    pickles them: four objects, not a tuple of four per record (tens of thousands of them while
    one input runs ahead of another). A line holds no newline (it is one), nor does a topic name.

    >>> from types import SimpleNamespace as Record
    >>> merge = [("ecc", 5, (Record(source="t/0:offset 1 line 1"), b'{"ts":5}')),
    ...          ("xid", 7, (Record(source="x/0:offset 2"), b"{}"))]
    >>> HeldLines.of_merge(merge).records()
    [('ecc', 5, b'{"ts":5}', 't/0:offset 1 line 1'), ('xid', 7, b'{}', 'x/0:offset 2')]
    """

    sources: list[str]
    times_ms: array.array[int]
    lines: bytes
    record_sources: str

    @classmethod
    def of_merge(cls, held: list[tuple[str, int, tuple[Any, bytes]]]) -> HeldLines:
        """The columns of what a worker's merge holds: (source, event time, (record, its line)),
        in release order (:meth:`stream.worker.merge.EventTimeMerger.held`)."""
        return cls(
            [entry[0] for entry in held],
            array.array("q", [entry[1] for entry in held]),
            b"\n".join([entry[2][1] for entry in held]),
            "\n".join([entry[2][0].source for entry in held]),
        )

    def records(self) -> list[HeldRecord]:
        """The held records again, in their order."""
        if not self.sources:
            return []
        return list(
            zip(
                self.sources,
                self.times_ms,
                self.lines.split(b"\n"),
                self.record_sources.split("\n"),
                strict=True,
            )
        )


def encode(checkpoint: PartitionCheckpoint) -> bytes:
    """Serialize a checkpoint: the format header, then the pickle in an LZ4 frame (a worker's held
    records are already in columns: :meth:`HeldLines.of_merge`; a list is pickled as it is).

    Examples
    --------
    >>> from detectors.core import CoreConfig
    >>> blob = encode(PartitionCheckpoint(3, {"xid": 41}, DetectionCore(CoreConfig())))
    >>> blob.split(b"\\n", 1)[0]
    b'faultstream-checkpoint/5'
    >>> decode(blob).offsets
    {'xid': 41}
    """
    body = lz4.frame.compress(pickle.dumps(checkpoint, protocol=pickle.HIGHEST_PROTOCOL))
    return _HEADER + str(FORMAT).encode() + b"\n" + body


def decode(blob: bytes) -> PartitionCheckpoint:
    """Deserialize what :func:`encode` wrote; :class:`CheckpointError` for anything else."""
    header, _, body = blob.partition(b"\n")
    if not header.startswith(_HEADER):
        raise CheckpointError(
            "unreadable checkpoint (no faultstream-checkpoint header: written by faultstream before "
            "checkpoint format 2, or not a checkpoint); delete the checkpoint topic to start the "
            "detectors afresh"
        )
    version = header.removeprefix(_HEADER).decode("ascii", "replace")
    if version not in _READABLE:
        raise CheckpointError(
            f"checkpoint format {version} is not {FORMAT} (readable: {', '.join(sorted(_READABLE))}): "
            "written by another faultstream version; "
            "delete the checkpoint topic to start the detectors afresh"
        )
    try:
        checkpoint = pickle.loads(
            zlib.decompress(body) if version in _ZLIB_FORMATS else lz4.frame.decompress(body)
        )
        if isinstance(checkpoint, PartitionCheckpoint) and isinstance(checkpoint.held, HeldLines):
            checkpoint.held = checkpoint.held.records()
    except Exception as exc:
        raise CheckpointError(f"unreadable checkpoint ({exc})") from exc
    if not isinstance(checkpoint, PartitionCheckpoint):
        raise CheckpointError(f"unreadable checkpoint (a {type(checkpoint).__name__}, not a checkpoint)")
    return checkpoint


class CheckpointTopic:
    """Reads and writes the checkpoints of one application on its compacted topic."""

    def __init__(self, kafka: dict[str, Any], topic: str, app_id: str) -> None:
        #: aiokafka keyword arguments: bootstrap servers and security
        #: (:func:`stream.kafka.security.client_options`).
        self.kafka = kafka
        self.topic = topic
        self.app_id = app_id
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: set[int] = set()
        #: Partition -> where its checkpoint log ended when this worker last read or wrote it.
        self._seen_end: dict[int, int] = {}

    async def start(self, partitions: int) -> None:
        """Connect (aiokafka clients must be made inside the running event loop) and check the topic
        has a partition for each of the ``partitions`` input partitions."""
        self._producer = AIOKafkaProducer(
            **self.kafka,
            acks="all",
            enable_idempotence=True,
            max_request_size=CHECKPOINT_MAX_BYTES,
        )
        self._consumer = AIOKafkaConsumer(
            **self.kafka,
            enable_auto_commit=False,
            fetch_max_bytes=CHECKPOINT_MAX_BYTES,
            max_partition_fetch_bytes=CHECKPOINT_MAX_BYTES,
        )
        await self._producer.start()
        await self._consumer.start()
        if self.topic not in await self._consumer.topics():
            raise CheckpointError(
                f"checkpoint topic {self.topic!r} does not exist: run `faultstream init-kafka` first"
            )
        self._partitions = set(await self._producer.partitions_for(self.topic))
        have = len(self._partitions)
        if have < partitions:
            raise CheckpointError(
                f"checkpoint topic {self.topic!r} has {have} partitions, the inputs have {partitions}: "
                "give it as many (kafka-topics --alter --partitions) or name another with "
                "FAULTSTREAM_TOPIC_CHECKPOINTS and run `faultstream init-kafka`"
            )
        # The consumer's own metadata learns the topic now: a partition's first load would
        # otherwise find no leader for it and ask again after aiokafka's retry backoff (0.1 s of
        # every start, measured). (The client's call; aiokafka is pinned in pyproject.toml.)
        await self._consumer._client.add_topic(self.topic)

    async def stop(self) -> None:
        """Disconnect."""
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    def _clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        if self._producer is None or self._consumer is None:
            raise CheckpointError("CheckpointTopic.start() was not called")
        return self._producer, self._consumer

    def _key(self, partition: int) -> bytes:
        return f"{self.app_id}/{partition}".encode()

    def forget(self, partition: int) -> None:
        """The partition is no longer this worker's: a later owner's load starts afresh."""
        self._seen_end.pop(partition, None)

    async def save(self, checkpoint: PartitionCheckpoint) -> int:
        """Write ``checkpoint`` and wait until the broker has it; return its size in bytes.

        Raises
        ------
        StaleCheckpoint
            Another worker wrote a checkpoint of the partition since this one loaded or wrote it.
        """
        producer, consumer = self._clients()
        number = checkpoint.partition
        tp = TopicPartition(self.topic, number)
        seen = self._seen_end.get(number)
        if seen is not None:
            end = (await consumer.end_offsets([tp]))[tp]
            if end != seen:
                self._seen_end.pop(number, None)
                raise StaleCheckpoint(
                    f"{self.topic}/{number}: {end - seen} checkpoint(s) written by another worker since "
                    f"this one took the partition (generation {checkpoint.generation}): not replaced"
                )
        blob = encode(checkpoint)
        sent = await producer.send_and_wait(self.topic, blob, key=self._key(number), partition=number)
        self._seen_end[number] = sent.offset + 1
        return len(blob)

    async def load(self, partition: int, timeout_s: float = 30.0) -> tuple[PartitionCheckpoint, int] | None:
        """The newest checkpoint of ``partition`` and its size, or None if it has none yet."""
        _, consumer = self._clients()
        if partition not in self._partitions:
            raise CheckpointError(
                f"checkpoint topic {self.topic!r} has no partition {partition}: it needs as many "
                "partitions as the input topics (kafka-topics --alter --partitions)"
            )
        tp = TopicPartition(self.topic, partition)
        end = (await consumer.end_offsets([tp]))[tp]
        self._seen_end[partition] = end
        if end == 0:
            return None
        consumer.assign([tp])
        consumer.seek(tp, end - 1)
        batches: dict[Any, Any] = await consumer.getmany(tp, timeout_ms=int(timeout_s * 1000), max_records=1)
        messages = batches.get(tp, [])
        if not messages:
            raise CheckpointError(f"{self.topic}/{partition}: offset {end - 1} unread after {timeout_s} s")
        message = messages[-1]
        if message.key != self._key(partition):
            app = (message.key or b"").decode("utf-8", "replace").rpartition("/")[0]
            check_deployment(app, self.app_id, f"{self.topic}/{partition} offset {end - 1}")
            raise CheckpointError(
                f"{self.topic}/{partition} ends with a checkpoint of {message.key!r}, not "
                f"{self._key(partition)!r}: give each application id its own checkpoint topic"
            )
        checkpoint = decode(message.value)
        if checkpoint.partition != partition:
            raise CheckpointError(f"{self.topic}/{partition} holds the state of {checkpoint.partition}")
        return checkpoint, len(message.value)
