"""Input topics the worker copies to a topic keyed by node before it applies them.

Two inputs are not keyed by node: job state changes (keyed by job, ONE partition so that they
stay in event-time order) and raw kernel-log lines as shippers send them (no key, or a key of the
shipper's own). The owner of such a topic's partition copies each record to the partitions of its
nodes in an internal ``*-by-node`` topic, which the detection partitions read beside ``xid`` and
``ecc``; it commits the source offset once every copy was delivered (a copy sent again after a
crash is recognised by its header: :mod:`stream.worker.rekeying`).

What a record becomes is the input's :data:`CopyMaker`:

* a job line is copied as it is, once to each partition holding one of its nodes; a Slurm
  ``jobcomp/kafka`` record is copied as the job event it means (:func:`job_copies`);
* a kernel-log value is read by the file parser (:mod:`stream.inputs.parsers.shipped`) and each
  XID or SXid event it gives is copied, as an ``xid`` record, to its node's partition
  (:func:`kernel_copies`); the lines of other drivers (most of a kernel log) give none.

:class:`RekeyedInput` keeps, per source partition owned here, what was delivered and committed,
and whether the group has re-keyed the whole topic: until it has, the merge of a detection
partition cannot treat the copies' source as idle (more may be on their way).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas.records import InvalidRecord, XidEvent
from stream.inputs.parsers.jobcomp import is_jobcomp_record, parse_jobcomp
from stream.inputs.parsers.shipped import names_the_driver, parse_shipped_kernel_line
from stream.kafka.codec import decode_record, encode_record

__all__ = ["CopyMaker", "RekeyedInput", "job_copies", "kernel_copies"]

#: One source record -> ``(node, event time ms, line to copy)`` for each copy (a line named for
#: several nodes is copied once a partition), and the source record's dead letters.
CopyMaker = Callable[[bytes, int | None, str, str], tuple[list[tuple[str, int, bytes]], list[InvalidRecord]]]


def job_copies(cluster: str, gpus_per_node: int) -> CopyMaker:
    """The copy maker of job state changes: the line itself for each of the job's nodes; a Slurm
    ``jobcomp/kafka`` record (:mod:`stream.inputs.parsers.jobcomp`) as the job event it means.

    >>> make = job_copies("c", 8)
    >>> line = b'{"ts": 1704067200000, "cluster": "c", "job_id": "7", "state": "RUNNING", '
    >>> line += b'"nodes": ["b", "a"]}'
    >>> [(node, ts) for node, ts, _ in make(line, None, "jobs/0", "offset 3")[0]]
    [('a', 1704067200000), ('b', 1704067200000)]
    >>> line = b'{"jobid":9,"@start":"2024-01-01T00:00:00","@end":"2024-01-01T01:00:00",'
    >>> line += b'"state":"FAILED","nodes":"n[1-2]"}'
    >>> copies = make(line, None, "jobs/0", "offset 4")[0]
    >>> [(node, ts, b'"state":"FAILED"' in copy) for node, ts, copy in copies]
    [('n1', 1704070800000, True), ('n2', 1704070800000, True)]
    """

    def copies(
        line: bytes, record_ms: int | None, source: str, location: str
    ) -> tuple[list[tuple[str, int, bytes]], list[InvalidRecord]]:
        if b'"jobid"' in line:  # perhaps Slurm's own record: read it as one, copy our event
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError:
                data = None
            if isinstance(data, dict) and is_jobcomp_record(data):
                event = parse_jobcomp(data, cluster, gpus_per_node, source, location, line)
                if isinstance(event, InvalidRecord):
                    return [], [event]
                copy = encode_record(event)
                return [(node, event.ts_ms, copy) for node in sorted(set(event.nodes))], []
        try:
            job = decode_record("job", line, source, location)
        except InvalidRecord as error:
            return [], [error]
        return [(node, job.ts_ms, line) for node in sorted(set(job.nodes))], []  # type: ignore[attr-defined]

    return copies


def kernel_copies(cluster: str) -> CopyMaker:
    """The copy maker of shipped kernel-log values: each XID or SXid event the value gives, as the
    ``xid`` record of its node; nothing for another driver's line.

    >>> make = kernel_copies("c")
    >>> line = b"2025-03-04T17:22:31+00:00 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 79, fallen off"
    >>> copies, bad = make(line, None, "kernel-log/0", "offset 5")
    >>> [(node, ts) for node, ts, _ in copies], bad
    ([('gpu-node-17', 1741108951000)], [])
    >>> make(b"2025-03-04T17:22:31+00:00 gpu-node-17 kernel: eth0: link up", None, "kernel-log/0", "offset 6")
    ([], [])
    """

    def copies(
        value: bytes, record_ms: int | None, source: str, location: str
    ) -> tuple[list[tuple[str, int, bytes]], list[InvalidRecord]]:
        if not names_the_driver(value):
            return [], []
        good: list[tuple[str, int, bytes]] = []
        bad: list[InvalidRecord] = []
        for item in parse_shipped_kernel_line(value, record_ms, cluster, source, location):
            if isinstance(item, XidEvent):
                try:  # what the parser read, checked as any xid record is (an XID code past 65535)
                    XidEvent.from_dict(item.to_wire(), f"{source}:{location}")
                except InvalidRecord as error:
                    bad.append(InvalidRecord(error.reason, value, source, location))
                    continue
                good.append((item.node, item.ts_ms, encode_record(item)))
            else:
                bad.append(item)
        return good, bad

    return copies


@dataclass
class RekeyedInput:
    """One re-keyed input topic and its progress in this worker."""

    #: The source topic.
    topic: str
    #: The merge source (kind) its copies feed: ``job`` or ``kernel``.
    kind: str
    #: The by-node topic (Faust's) and its name.
    target: Any
    target_name: str
    make_copies: CopyMaker
    #: Whether the source's values are whole records (a kernel-log value is one message, newlines
    #: and all) rather than lines of records (a jobs message may hold many).
    whole_values: bool = False
    #: Per source partition, the last offset whose copies were all delivered.
    delivered: dict[int, int] = field(default_factory=dict)
    #: Messages whose copies are on their way: (partition, offset, delivery), oldest first.
    pending: deque[tuple[int, int, asyncio.Future[Any]]] = field(default_factory=deque)
    #: Per source partition, the last offset committed.
    committed: dict[int, int] = field(default_factory=dict)
    #: Source partitions re-keyed here since their assignment (the first message is committed at once).
    started: set[int] = field(default_factory=set)
    #: Whether the group has committed every message of the topic (re-keyed everywhere).
    all_rekeyed: bool = False

    def settle(self) -> None:
        """Mark the messages whose copies have all been delivered, oldest first, as re-keyed
        (committed by the timer). A failed delivery stops the worker here: nothing after it is
        committed, and the next owner re-keys from the last commit."""
        pending = self.pending
        while pending and pending[0][2].done():
            partition, offset, delivered = pending.popleft()
            delivered.result()
            self.delivered[partition] = offset

    def forget(self, partition: int) -> None:
        """A source partition revoked: its progress is the next owner's."""
        self.delivered.pop(partition, None)
        self.committed.pop(partition, None)
        self.started.discard(partition)
        self.pending = deque(p for p in self.pending if p[0] != partition)
