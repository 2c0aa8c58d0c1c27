"""The wire format of the input topics: message keys, values, partitions and decoding.

A message value carries one or more records, newline-delimited JSON: each line is the JSON
document of one :mod:`schemas.records` record (the form the JSON Schemas under
``schemas/jsonschema/`` describe; ``wire-message.schema.json`` states the whole contract). A
one-line value is a single record, so producers that send one record a message need nothing
else. Empty lines are ignored. Every line is decoded on its own: a bad line becomes a dead letter
at ``offset O line i`` with that line's bytes, and never spoils its neighbours.

Keys: the node (XID, ECC, jobs-by-node) or ``cluster/job id`` (jobs). A message of several
records holds consecutive records of one partition — records whose keys hash to that partition
(:func:`partition_for_key`, Kafka's default partitioner) — and carries its first record's key and
event time. Dead-letter messages are made by :mod:`stream.sinks.dead_letters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Annotated

import msgspec
import orjson
from aiokafka.partitioner import murmur2

from schemas.records import (
    EccSample,
    EccWireCounters,
    InvalidRecord,
    JobEvent,
    Record,
    XidEvent,
    finish_decoded_ecc_samples,
    normalize_pci_bus_id,
)
from schemas.timeutil import parse_iso_ts

__all__ = [
    "MAX_MESSAGE_BYTES",
    "RECORDS_PER_MESSAGE",
    "decode_message",
    "decode_message_lines",
    "decode_record",
    "encode_record",
    "message_lines",
    "partition_for_key",
    "record_key",
    "redecode_record",
]

#: Records a publisher puts in one message by default: Faust's per-message cost (~200 µs on this
#: machine's class of CPU) shared by a few hundred records is ~1 µs a record.
RECORDS_PER_MESSAGE = 256
#: Bytes of records a publisher puts in one message at most: well under the broker's 1 MiB limit.
MAX_MESSAGE_BYTES = 512 * 1024

_PARSERS: Mapping[str, Callable[[object, str], Record]] = {
    "xid": XidEvent.from_dict,
    "kernel": XidEvent.from_dict,  # the kernel log's XID events, re-keyed by node
    "ecc": EccSample.from_dict,
    "job": JobEvent.from_dict,
}


class _EccWire(msgspec.Struct, gc=False):
    """An ECC sample's line (``ts`` as integer epoch ms, or ISO-8601) decoded into typed fields,
    its counters checked in C: the lines whose times are ISO-8601 strings, which the sample's own
    decoder (integer times) does not read: about half the cost of ``orjson.loads`` + ``from_dict``."""

    ts: int | str
    cluster: str
    node: str
    counters: EccWireCounters
    gpu: int | None = None
    pci_bus_id: str | None = None


_ECC_WIRE = msgspec.json.Decoder(_EccWire)
#: A line as the publishers write it (``ts`` in epoch ms) decoded straight into its sample.
_ECC_SAMPLES = msgspec.json.Decoder(EccSample)


def _iso_times(line: bytes) -> bool:
    """Whether a line spells ``ts`` as a string: a quote after the key can only be that, as a
    quote inside a JSON string is escaped. Only a route: either decoder validates."""
    return b'"ts":"' in line or b'"ts": "' in line


def _decode_ecc_wire(value: bytes, source: str) -> EccSample | None:
    """The sample of a wire-form line, or None if anything about it needs the full validator
    (another form of a field, a value out of range, not JSON): that one decides, and names the
    fault, so every dead letter's reason is the same whichever path read the line. A line of
    integer times decodes straight into its sample; one of ISO-8601 times (the wire form's other
    spelling) into its fields, then the sample (a failed first try cost ~1 µs a line)."""
    if not _iso_times(value):
        try:
            samples, _ = finish_decoded_ecc_samples([_ECC_SAMPLES.decode(value)], source, None)
            return samples[0]
        except (msgspec.DecodeError, ValueError):  # ValueError: bytes that are not UTF-8
            pass
    try:
        wire = _ECC_WIRE.decode(value)
    except (msgspec.DecodeError, ValueError):
        return None
    return _ecc_sample_of(wire, source)


def _ecc_sample_of(wire: _EccWire, source: str) -> EccSample | None:
    """The sample of a decoded wire-form line, or None (as :func:`_decode_ecc_wire`)."""
    try:
        ts_ms = wire.ts if type(wire.ts) is int else parse_iso_ts(wire.ts)
        pci = wire.pci_bus_id
        pci_bus_id = "" if not pci else normalize_pci_bus_id(pci)
    except ValueError:
        return None
    return EccSample.from_fields(
        ts_ms, wire.cluster, wire.node, wire.gpu, pci_bus_id, wire.counters, source, counters_checked=True
    )


#: A 64-bit integer: orjson reads a larger one as a float, which the validator refuses (and msgspec
#: bounds stop at int64: an id up to 2**64 - 1 takes the full validator, which accepts it).
_JsonInt = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _JobWire(msgspec.Struct):
    """A job state change's line (times as integer epoch ms, or ISO-8601), decoded straight into
    typed fields; what the types cannot say :meth:`JobEvent.from_fields` checks, as ``from_dict``
    does: cheaper than ``orjson.loads`` + ``from_dict`` (benchmarks/decode.py)."""

    ts: int | str
    cluster: str
    job_id: str | _JsonInt
    state: str
    nodes: list[str] = msgspec.field(default_factory=list)
    gpus: int | None = None
    start: int | str | None = None
    end: int | str | None = None
    exit_code: str | None = None
    name: str | None = None
    user: str | None = None
    partition: str | None = None


_JOB_WIRE = msgspec.json.Decoder(_JobWire)


def _decode_job_wire(value: bytes, source: str) -> JobEvent | None:
    """The event of a wire-form line, or None if anything about it needs the full validator
    (the same rule as :func:`_decode_ecc_wire`)."""
    try:
        wire = _JOB_WIRE.decode(value)
    except (msgspec.DecodeError, ValueError):  # ValueError: bytes that are not UTF-8
        return None
    return JobEvent.from_fields(
        wire.ts, wire.cluster, wire.job_id, wire.state, wire.nodes, wire.gpus, wire.start, wire.end,
        wire.exit_code, wire.name, wire.user, wire.partition, source,
    )  # fmt: skip


def record_key(record: Record) -> bytes:
    """The Kafka key of a record: its node, or ``cluster/job id`` for job state changes."""
    if isinstance(record, JobEvent):
        return f"{record.cluster}/{record.job_id}".encode()
    return record.node.encode()


@lru_cache(maxsize=1 << 17)
def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as the Java client) gives ``key``.

    Publishers batching several keys into one message, and the worker re-keying jobs, place
    records exactly where a one-record-a-message producer keyed by node would have. Remembered
    (a fleet has a bounded set of nodes): aiokafka's murmur2 is Python, ~2 µs a key, and the
    worker asks it for every node of every job it re-keys and of every record its core judges.

    >>> [partition_for_key(b"node%04d" % n, 4) for n in range(1, 7)]
    [0, 2, 0, 1, 3, 2]
    """
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def encode_record(record: Record) -> bytes:
    """One record's line on the wire: its JSON document with times as integer epoch milliseconds
    (the JSON Schemas allow ISO strings too; integers decode in a third of the time)."""
    return orjson.dumps(record.to_wire())


def decode_record(kind: str, value: bytes, source: str, location: str) -> Record:
    """Decode one message of an input topic carrying ``kind`` (``xid``, ``ecc`` or ``job``) records.

    Raises
    ------
    InvalidRecord
        With the reason, the raw value, ``source`` (topic/partition) and ``location`` (offset).

    Examples
    --------
    >>> line = b'{"ts": 1704067200000, "cluster": "c", "node": "n1", "xid": 79}'
    >>> decode_record("xid", line, "xid/0", "offset 3").xid
    79
    >>> decode_record("xid", b"{", "xid/0", "offset 4")
    Traceback (most recent call last):
    ...
    schemas.records.InvalidRecord: not JSON (unexpected end of data: line 1 column 2 (char 1))
    """
    if kind == "ecc":
        sample = _decode_ecc_wire(value, f"{source}:{location}")
        if sample is not None:
            return sample
    elif kind == "job":
        event = _decode_job_wire(value, f"{source}:{location}")
        if event is not None:
            return event
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidRecord(f"not JSON ({exc})", value, source, location) from None
    try:
        return _PARSERS[kind](document, f"{source}:{location}")
    except InvalidRecord as exc:
        raise InvalidRecord(exc.reason, value, source, location) from None


def message_lines(
    value: bytes | None, offset: int, joined_from: int | None = None
) -> Iterator[tuple[str, bytes]]:
    """``(location, line)`` of each record line of a message value (empty lines skipped).

    A message without a value (a tombstone, which no producer of ours sends) is one empty line:
    one dead letter, not a worker stopped by a ``TypeError``. ``joined_from``: the value joins
    one-line messages from that offset on (:mod:`stream.worker.joining`); each line is then located
    at its own offset, empty or not, as it would be had it come alone.

    >>> list(message_lines(b"a", 7)), list(message_lines(b"a\\n\\nb\\n", 8))
    ([('offset 7', b'a')], [('offset 8 line 1', b'a'), ('offset 8 line 3', b'b')])
    >>> list(message_lines(None, 9))
    [('offset 9', b'')]
    >>> list(message_lines(b"a\\n\\nb", 12, joined_from=10))
    [('offset 10', b'a'), ('offset 11', b''), ('offset 12', b'b')]
    """
    if value is None:
        value = b""
    if joined_from is not None:
        for number, line in enumerate(value.split(b"\n"), joined_from):
            yield f"offset {number}", line
        return
    if b"\n" not in value:
        yield f"offset {offset}", value
        return
    for number, line in enumerate(value.split(b"\n"), 1):
        if line.strip():
            yield f"offset {offset} line {number}", line


def decode_message(
    kind: str, value: bytes | None, source: str, offset: int
) -> Iterator[Record | InvalidRecord]:
    """The records of one message of an input topic, in order; a bad line comes as its
    :class:`InvalidRecord` (location ``offset O line i``), the others are unaffected.

    Examples
    --------
    >>> xid = b'{"ts": 1704067200000, "cluster": "c", "node": "n1", "xid": 79}'
    >>> [r.xid for r in decode_message("xid", xid, "xid/0", 5)]
    [79]
    >>> items = list(decode_message("xid", xid + b"\\n{oops\\n" + xid + b"\\n", "xid/0", 6))
    >>> [getattr(i, "xid", None) or i.location for i in items]
    [79, 'offset 6 line 2', 79]
    """
    return (item for item, _line in decode_message_lines(kind, value, source, offset))


def decode_message_lines(
    kind: str, value: bytes | None, source: str, offset: int, joined_from: int | None = None
) -> list[tuple[Record | InvalidRecord, bytes]]:
    """:func:`decode_message`, each record with the line it came from (the worker keeps a held
    record's line: its checkpoint stores lines, which pickle at a fraction of a record's cost),
    as a list (the worker takes a message's records at once). ``joined_from``: as for
    :func:`message_lines`.

    >>> xid = b'{"ts": 1704067200000, "cluster": "c", "node": "n1", "xid": 79}'
    >>> [(r.xid, line == xid) for r, line in decode_message_lines("xid", xid, "xid/0", 5)]
    [(79, True)]
    """
    if kind == "ecc" and value and b"\n" in value:
        decoded = _decode_ecc_message(value, source, offset, joined_from)
        if decoded is not None:
            return decoded
    decoded = []
    for location, line in message_lines(value, offset, joined_from):
        try:
            decoded.append((decode_record(kind, line, source, location), line))
        except InvalidRecord as error:
            decoded.append((error, line))
    return decoded


def _decode_ecc_message(
    value: bytes, source: str, offset: int, joined_from: int | None
) -> list[tuple[Record | InvalidRecord, bytes]] | None:
    """A message of ECC lines decoded in one call of the typed decoder (most of a cluster's
    messages: nine records in ten are ECC samples), or None when any line needs the line-by-line
    path (an empty line, a line the typed decoder refuses): that path then decides every line, so
    locations and dead letters are the same whichever path read the message. A line the typed
    fields accept but the sample's checks refuse goes through :func:`decode_record` alone."""
    lines = value.split(b"\n")
    if not lines[-1] and joined_from is None:
        lines.pop()  # a final newline ends the last line (a joined message's last line is a record)
    # A line's location, as message_lines names it: "offset O line i", or a joined line's own offset.
    where, first = (f"offset {offset} line ", 1) if joined_from is None else ("offset ", joined_from)
    # A producer's messages spell their times one way: ISO-8601 ones decode into fields, then
    # each sample; integer ones straight into samples.
    iso = _iso_times(lines[0])
    try:
        parsed = (_ECC_WIRE if iso else _ECC_SAMPLES).decode_lines(value)
    except (msgspec.DecodeError, ValueError):  # ValueError: bytes that are not UTF-8
        return None  # a line the decoder's types refuse: line by line, each line decided alone
    if len(parsed) != len(lines):
        return None  # blank lines: their numbers count, and the line-by-line path keeps them
    samples: list[EccSample | None]
    if iso:
        samples = [_ecc_sample_of(wire, f"{source}:{where}{first + i}") for i, wire in enumerate(parsed)]
        refused = samples.count(None)
    else:
        samples, refused = finish_decoded_ecc_samples(parsed, f"{source}:{where}", first)
    decoded: list[tuple[Record | InvalidRecord, bytes]] = list(zip(samples, lines, strict=True))
    if refused:
        for index, (sample, line) in enumerate(decoded):
            if sample is None:
                try:
                    decoded[index] = (decode_record("ecc", line, source, f"{where}{first + index}"), line)
                except InvalidRecord as error:
                    decoded[index] = (error, line)
    return decoded


def redecode_record(kind: str, line: bytes, record_source: str) -> Record:
    """Decode a line again, given the ``source`` field of the record it once became (a record's
    source is ``topic/partition:location``, and topic names cannot hold a colon).

    >>> line = b'{"ts": 1704067200000, "cluster": "c", "node": "n1", "xid": 79}'
    >>> first = decode_record("xid", line, "t/0", "offset 3 line 2")
    >>> redecode_record("xid", line, first.source) == first
    True
    """
    source, _, location = record_source.partition(":")
    return decode_record(kind, line, source, location)
