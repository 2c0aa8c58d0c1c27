"""``faultstream tail``: the SRE's console on the incidents topic.

One line per incident message, newest state last: when it started, severity, kind, node and GPU,
status and its summary, in 120 columns; ``--wide`` adds how many updates the incident has had, the
whole summary and the suggested action. With ``--no-follow`` the lines come in time order. Messages
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

from detectors.incidents import summary_without_action

__all__ = [
    "COMPACT_WIDTH",
    "IncidentFilter",
    "TailError",
    "TailOptions",
    "format_line",
    "parse_since",
    "short_summary",
    "tail",
    "updates",
]

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


#: The default line's width: time, severity, kind, node/GPU, status and as much summary as fits.
COMPACT_WIDTH = 120

_SUMMARY_TAIL = re.compile(r",? \d+ evidence since \S+; \w+\.?$")


def owner_of(incident: dict[str, Any]) -> str:
    """The user an incident is addressed to (``job_app_errors``, ``job_xid_storm``), else ""; the
    evidence may be a dict (the incidents topic) or its JSON text (a store row).

    >>> owner_of({"evidence": {"owner": "dbg"}}), owner_of({"evidence": '{"owner": "dbg"}'}), owner_of({})
    ('dbg', 'dbg', '')
    """
    evidence = incident.get("evidence")
    if isinstance(evidence, str):
        try:
            evidence = orjson.loads(evidence)
        except orjson.JSONDecodeError:
            return ""
    owner = evidence.get("owner") if isinstance(evidence, dict) else None
    return owner if isinstance(owner, str) else ""


def _where(incident: dict[str, Any]) -> str:
    owner = owner_of(incident)
    if owner:  # addressed to a user, not a node: the node is only where it began
        return f"user/{owner}"
    gpu = incident.get("gpu")
    return f"{incident.get('node', '?')}{'' if gpu in (None, '', -1) else f'/{gpu}'}"


def short_summary(incident: dict[str, Any]) -> str:
    """The summary without what the line's other columns say: severity, node and GPU, evidence
    count and status, and the action.

    >>> short_summary({"node": "n7", "gpu": "0000:b7:00", "summary": "[critical] GPU has fallen off the "
    ...     "bus on n7 GPU 0000:b7:00 (XID 79 x1), 1 evidence since 2024-01-12T11:22Z; open. Action: x"})
    'GPU has fallen off the bus (XID 79 x1)'
    """
    text = summary_without_action(str(incident.get("summary", "")))
    text = re.sub(r"^\[\w+\] ", "", text)
    node, gpu = incident.get("node"), incident.get("gpu")
    if gpu not in (None, "", -1):
        text = text.replace(f" on {node} GPU {gpu}", "")
    text = text.replace(f" on {node}", "")
    return _SUMMARY_TAIL.sub("", text).rstrip(".")


def _time(value: object) -> str:
    """An ISO time as ``2024-01-03 10:00:00`` (UTC, to the second)."""
    text = str(value or "?")
    return text[:19].replace("T", " ") if len(text) >= 19 else text


def format_line(incident: dict[str, Any], colour: bool, wide: bool = False) -> str:
    """One console line for an incident message: compact (fits ``COMPACT_WIDTH`` columns) or wide.

    The compact line is when it started, severity, kind, node/GPU, status and the summary cut to fit;
    the wide one adds the number of updates, the whole summary and the suggested action.

    >>> line = {"first_evidence": "2024-01-03T10:00:00.000Z", "severity": "critical",
    ...         "kind": "gpu_bus", "node": "node7", "gpu": "0000:b7:00", "status": "open",
    ...         "version": 6, "summary": "[critical] XID 79 on node7. Action: drain", "action": "drain"}
    >>> format_line(line, colour=False).split()
    ['2024-01-03', '10:00:00', 'CRITICAL', 'gpu_bus', 'node7/0000:b7:00', 'open', 'XID', '79']
    >>> format_line(line, colour=False, wide=True).split("  ")[-1]
    '[critical] XID 79 on node7. -> drain'
    """
    severity = str(incident.get("severity", "?"))
    status = str(incident.get("status", "?"))
    head = (
        f"{_time(incident.get('first_evidence'))} {severity.upper():<8} {incident.get('kind', '?')!s:<15} "
        f"{_where(incident):<19} {status:<8}"
    )
    if wide:
        count = updates(incident)
        text = summary_without_action(str(incident.get("summary", "")))
        if incident.get("action"):
            text += f" -> {incident['action']}"
        fields = f"{head} {count} update{'' if count == 1 else 's'}  {text}"
    else:
        room = max(COMPACT_WIDTH - len(head) - 2, 20)
        text = short_summary(incident)
        fields = f"{head}  {text if len(text) <= room else text[: room - 1] + '…'}"
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
    wide: bool = False
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
    """Print lines as they arrive; without ``follow``, read to the ends first and print them in time
    order (partitions are read side by side, so arrival order is partition by partition)."""
    news = _News()
    held: list[tuple[tuple[str, str, str, int], str]] = []
    printed = 0
    while True:
        if not options.follow and all([await _reached(consumer, tp, end) for tp, end in ends.items()]):
            held.sort(key=lambda item: item[0])
            out.writelines(line + "\n" for _, line in held)
            out.flush()
            return len(held)
        batches = await consumer.getmany(timeout_ms=500, max_records=500)
        for messages in batches.values():
            for message in messages:
                line = _line(message.value, options, news)
                if line is None:
                    continue
                if options.follow:
                    out.write(line + "\n")
                    printed += 1
                else:
                    held.append((_order(message.value), line))
        if batches and options.follow:
            out.flush()


def _order(value: bytes | None) -> tuple[str, str, str, int]:
    """Time order of an incident message: when the incident started, then its id and version (an
    incident's updates stay together, in order); what is not an incident sorts first."""
    try:
        incident = orjson.loads(value or b"")
        return (
            str(incident.get("first_evidence", "")),
            str(incident.get("last_evidence", "")),
            str(incident.get("incident_id", "")),
            int(incident.get("version", 0)),
        )
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return ("", "", "", 0)


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
        return (
            value.decode()
            if options.as_json and value
            else format_line(incident, options.colour, options.wide)
        )
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
