"""``faultstream tail``: the SRE's console on the incidents topic.

One line per incident message, newest state last: when it started, severity, kind, node and GPU,
status, how many updates the incident has had, its summary and the suggested action. Messages
that repeat an (incident id, version) already shown — at-least-once delivery after a worker
restart — or that are older than what was shown are dropped, so every line is news.

The topic is keyed by node, so all of one node's incidents arrive in order on one partition; the
console reads every partition without a consumer group (it never commits, so any number of SREs
can watch). ``--json`` prints the messages as they are, one per line, for pipes into other tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError

__all__ = ["IncidentFilter", "TailError", "TailOptions", "format_line", "parse_since", "tail", "updates"]

SEVERITIES = ("critical", "warn", "info")

_COLOURS = {"critical": "\033[1;31m", "warn": "\033[33m", "info": "\033[36m", "resolved": "\033[32m"}
_DIM, _RESET = "\033[2m", "\033[0m"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class TailError(Exception):
    """The console cannot run: no broker, no topic, bad arguments."""


def parse_since(value: str, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch for ``--since``: a duration back from now (``15m``, ``2h``,
    ``1d``) or an ISO time.

    >>> parse_since("2h", now_ms=10_000_000)
    2800000
    >>> parse_since("2024-01-03T10:00:00Z")
    1704276000000
    """
    from schemas.timeutil import parse_ts

    match = _DURATION.match(value.strip())
    if match:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return now - int(float(match.group(1)) * _UNIT_S[match.group(2)] * 1000)
    try:
        return parse_ts(value)
    except ValueError:
        raise TailError(f"--since takes a duration like 15m, 2h, 1d or an ISO time, got {value!r}") from None


def updates(incident: dict[str, Any]) -> int:
    """How many times the incident changed after it opened: each new piece of evidence and its
    resolution bump ``version`` (``2 * evidence + resolved``)."""
    version = int(incident.get("version", 2))
    return max(version // 2 - 1, 0) + version % 2


@dataclass(frozen=True)
class IncidentFilter:
    """Which incidents to show: each list is OR-ed, the lists AND-ed; empty means any.

    Kinds and nodes are shell patterns (``xid_*``, ``node01?``).
    """

    severities: frozenset[str] = frozenset()
    kinds: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @staticmethod
    def parse(severity: str | None, kind: str | None, node: str | None) -> IncidentFilter:
        def split(value: str | None) -> tuple[str, ...]:
            return tuple(part.strip() for part in (value or "").split(",") if part.strip())

        severities = frozenset(s.lower() for s in split(severity))
        unknown = severities - set(SEVERITIES)
        if unknown:
            raise TailError(f"unknown severity {', '.join(sorted(unknown))}; use {', '.join(SEVERITIES)}")
        return IncidentFilter(severities, split(kind), split(node))

    def __call__(self, incident: dict[str, Any]) -> bool:
        if self.severities and incident.get("severity") not in self.severities:
            return False
        if self.kinds and not any(fnmatchcase(str(incident.get("kind")), k) for k in self.kinds):
            return False
        return not self.nodes or any(fnmatchcase(str(incident.get("node")), n) for n in self.nodes)


def format_line(incident: dict[str, Any], colour: bool) -> str:
    """One console line for an incident message.

    >>> format_line({"first_evidence": "2024-01-03T10:00:00Z", "severity": "critical",
    ...              "kind": "gpu_bus", "node": "node7", "gpu": "0000:b7:00", "status": "open",
    ...              "version": 6, "summary": "XID 79", "action": "drain"}, colour=False).split()[:7]
    ['2024-01-03T10:00:00Z', 'CRITICAL', 'gpu_bus', 'node7/0000:b7:00', 'open', '2', 'updates']
    """
    severity = str(incident.get("severity", "?"))
    status = str(incident.get("status", "?"))
    gpu = incident.get("gpu")
    where = f"{incident.get('node', '?')}{'' if gpu in (None, '', -1) else f'/{gpu}'}"
    count = updates(incident)
    text = str(incident.get("summary", ""))
    if incident.get("action"):
        text += f" -> {incident['action']}"
    fields = (
        f"{incident.get('first_evidence', '?')} {severity.upper():<8} {incident.get('kind', '?')!s:<16} "
        f"{where:<22} {status:<9} {count} update{'' if count == 1 else 's'}  {text}"
    )
    if not colour:
        return fields
    tint = _COLOURS["resolved"] if status == "resolved" else _COLOURS.get(severity, "")
    return (
        f"{tint}{fields}{_RESET}" if severity != "info" or status == "resolved" else f"{_DIM}{fields}{_RESET}"
    )


@dataclass(frozen=True)
class TailOptions:
    """What ``faultstream tail`` reads and how it prints."""

    bootstrap: str
    topic: str
    #: aiokafka's security arguments (:func:`stream.kafka.security.client_options` without the servers).
    security: Mapping[str, Any] = field(default_factory=dict)
    since_ms: int | None = None  # None: from the beginning of the topic
    follow: bool = True
    as_json: bool = False
    colour: bool = False
    only: IncidentFilter = IncidentFilter()
    connect_timeout_s: float = 15.0


class _News:
    """Remembers the highest version shown per incident, to drop repeats."""

    def __init__(self) -> None:
        self._shown: dict[str, int] = {}

    def __call__(self, incident: dict[str, Any]) -> bool:
        key, version = str(incident.get("incident_id")), int(incident.get("version", 0))
        if self._shown.get(key, -1) >= version:
            return False
        self._shown[key] = version
        return True


async def tail(options: TailOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print incidents until interrupted (or, without ``follow``, until the topic's end as it was
    at the start); return how many lines were printed."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=options.bootstrap,
        **options.security,
        enable_auto_commit=False,
        group_id=None,
        request_timeout_ms=int(options.connect_timeout_s * 1000),
    )
    try:
        await asyncio.wait_for(consumer.start(), options.connect_timeout_s)
    except (TimeoutError, KafkaConnectionError, KafkaError) as exc:
        await consumer.stop()
        raise TailError(f"cannot reach Kafka at {options.bootstrap} ({exc or type(exc).__name__})") from None
    try:
        partitions = await _partitions(consumer, options)
        ends = await consumer.end_offsets(partitions)
        await _seek(consumer, partitions, options.since_ms)
        since = "the beginning" if options.since_ms is None else _iso(options.since_ms)
        plural = "" if len(partitions) == 1 else "s"
        err.write(
            f"faultstream tail: {options.topic} on {options.bootstrap}, {len(partitions)} partition{plural}, "
            f"since {since}{'; Ctrl-C to stop' if options.follow else ''}\n"
        )
        err.flush()
        return await _print_messages(consumer, options, ends, out)
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, options: TailOptions) -> list[TopicPartition]:
    numbers = consumer.partitions_for_topic(options.topic)
    if not numbers:
        await consumer._client.force_metadata_update()  # first metadata may predate the topic
        numbers = consumer.partitions_for_topic(options.topic)
    if not numbers:
        raise TailError(
            f"topic {options.topic} does not exist on {options.bootstrap}; "
            "create it with `faultstream init-kafka` (or set FAULTSTREAM_TOPIC_INCIDENTS)"
        )
    partitions = [TopicPartition(options.topic, p) for p in sorted(numbers)]
    consumer.assign(partitions)
    return partitions


async def _seek(consumer: AIOKafkaConsumer, partitions: list[TopicPartition], since_ms: int | None) -> None:
    if since_ms is None:
        await consumer.seek_to_beginning(*partitions)
        return
    found = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
    ends = await consumer.end_offsets(partitions)
    for tp in partitions:
        hit = found.get(tp)
        consumer.seek(tp, hit.offset if hit is not None else ends[tp])


async def _print_messages(
    consumer: AIOKafkaConsumer,
    options: TailOptions,
    ends: dict[TopicPartition, int],
    out: TextIO,
) -> int:
    news = _News()
    printed = 0
    while True:
        if not options.follow and all([await _reached(consumer, tp, end) for tp, end in ends.items()]):
            return printed
        batches = await consumer.getmany(timeout_ms=500, max_records=500)
        for messages in batches.values():
            for message in messages:
                line = _line(message.value, options, news)
                if line is not None:
                    out.write(line + "\n")
                    printed += 1
        if batches:
            out.flush()


async def _reached(consumer: AIOKafkaConsumer, tp: TopicPartition, end: int) -> bool:
    return bool(await consumer.position(tp) >= end)


def _line(value: bytes | None, options: TailOptions, news: Callable[[dict[str, Any]], bool]) -> str | None:
    try:
        incident = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None if options.as_json else f"(not an incident: {(value or b'')[:80]!r})"
    if not isinstance(incident, dict):
        return None if options.as_json else f"(not an incident: {(value or b'')[:80]!r})"
    try:
        if not options.only(incident) or not news(incident):
            return None
        return value.decode() if options.as_json and value else format_line(incident, options.colour)
    except (TypeError, ValueError):  # a field of the wrong type: show it rather than stop the console
        return None if options.as_json else f"(malformed incident: {(value or b'')[:80]!r})"


def _iso(ms: int) -> str:
    from schemas.timeutil import format_ts

    return format_ts(ms)


def want_colour(choice: str, stream: TextIO, environ: Iterable[str] | None = None) -> bool:
    """``--color auto`` colours a terminal unless ``NO_COLOR`` is set."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    names = os.environ if environ is None else set(environ)
    return "NO_COLOR" not in names and stream.isatty()


def run(options: TailOptions) -> int:
    """Run the console; Ctrl-C ends it quietly."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(tail(options))
    return 0
