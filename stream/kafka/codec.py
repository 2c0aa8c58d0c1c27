"""The wire format of the input topics: message keys, values and the decoding of a value.

A message of an input topic carries one record as the JSON document of :mod:`schemas.records`
(the form the JSON Schemas under ``schemas/jsonschema/`` describe), keyed by node (XID, ECC,
jobs-by-node) or by ``cluster/job id`` (jobs), with the record's event time as the Kafka
timestamp. Dead-letter messages are made by :mod:`stream.sinks.dead_letters`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from schemas.records import EccSample, InvalidRecord, JobEvent, Record, XidEvent

__all__ = ["decode_record", "encode_record", "record_key"]

_PARSERS: Mapping[str, Callable[[object, str], Record]] = {
    "xid": XidEvent.from_dict,
    "ecc": EccSample.from_dict,
    "job": JobEvent.from_dict,
}


def record_key(record: Record) -> bytes:
    """The Kafka key of a record: its node, or ``cluster/job id`` for job state changes."""
    if isinstance(record, JobEvent):
        return f"{record.cluster}/{record.job_id}".encode()
    return record.node.encode()


def encode_record(record: Record) -> bytes:
    """The message value of one record."""
    return orjson.dumps(record.to_dict())


def decode_record(kind: str, value: bytes, source: str, location: str) -> Record:
    """Decode one message of an input topic carrying ``kind`` (``xid``, ``ecc`` or ``job``) records.

    Raises
    ------
    InvalidRecord
        With the reason, the raw value, ``source`` (topic/partition) and ``location`` (offset).

    Examples
    --------
    >>> decode_record("xid", b'{"ts": 0, "cluster": "c", "node": "n1", "xid": 79}', "xid/0", "offset 3").xid
    79
    >>> decode_record("xid", b"{", "xid/0", "offset 4")
    Traceback (most recent call last):
    ...
    schemas.records.InvalidRecord: not JSON (unexpected end of data: line 1 column 2 (char 1))
    """
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidRecord(f"not JSON ({exc})", value, source, location) from None
    try:
        return _PARSERS[kind](document, f"{source}:{location}")
    except InvalidRecord as exc:
        raise InvalidRecord(exc.reason, value, source, location) from None
