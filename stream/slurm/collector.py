"""``faultstream slurm-jobs``: a running Slurm's job state changes, published to the jobs topic.

For sites whose Slurm has no ``jobcomp/kafka`` (before 23.02; Debian 12 ships 22.05). It runs on the
controller (or any host whose ``sacct`` reaches slurmdbd) and polls, as Meta's GCM backfill does::

    sacct --allusers --allocations --parsable2 --duplicates --noconvert \\
          --starttime S --endtime E --format JobID,JobIDRaw,State,Submit,Start,End,NodeList,...

over windows that overlap by ``slurm_overlap_seconds``: each row is read by the sacct file parser
(:mod:`stream.inputs.parsers.sacct`: a job that started is a ``RUNNING`` event at its start, one
that ended also an event in its end state at its end), and the events not published yet
(:class:`~stream.slurm.ledger.JobEventLedger`) go to the jobs topic in time order, keyed
``cluster/job id`` with the event time as the Kafka timestamp, exactly as ``replay --to`` sends a
sacct file. Rows sacct cannot give a time or state for go to the dead-letter topic, once.

Restarts: the cursor file holds the end of the last window whose events Kafka acknowledged; the
next window starts there less the overlap (``slurm_backfill_seconds`` back on the first start). The
first poll after a start reads the jobs topic back from the oldest event it returned, so what a
previous run published is not published again, however it ended.

Failures: a ``sacct`` that fails or does not answer within ``slurm_command_timeout_seconds`` is
retried after a pause that doubles up to five minutes; the window keeps its start, so it covers
the outage when sacct answers again. It says so in a line (the first failure, then every few
minutes) and in ``faultstream_slurm_polls_total{outcome="failed"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from schemas.records import InvalidRecord, JobEvent
from stream.inputs.parsers.options import ParseOptions
from stream.inputs.parsers.sacct import parse_sacct
from stream.kafka.codec import encode_record, message_lines, record_key
from stream.kafka.security import client_options
from stream.settings import Settings
from stream.sinks.dead_letters import KafkaDeadLetters, to_dead_letter
from stream.slurm.commands import SlurmCommandError, SlurmCommands
from stream.slurm.ledger import Cursor, JobEventLedger, event_key, ledger_keys_of_line

__all__ = ["SACCT_FORMAT", "CollectorMetrics", "JobCollector", "run_collector", "sacct_arguments"]

_log = logging.getLogger("faultstream.slurm")

#: The columns asked of sacct: what the sacct parser reads.
SACCT_FORMAT = (
    "JobID,JobIDRaw,State,Submit,Start,End,NodeList,NNodes,AllocTRES,ExitCode,JobName,User,Partition,Cluster"
)
#: The longest pause between failed polls, and how often a failing poll is said again.
_LONGEST_PAUSE_S = 300.0
_SAY_EVERY_S = 300.0


def _sacct_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def sacct_arguments(since_ms: int, until_ms: int) -> list[str]:
    """The sacct command line of one window (times in UTC: the collector runs sacct with TZ=UTC).

    >>> sacct_arguments(1741082400000, 1741086000000)[4:9]
    ['--noconvert', '--starttime', '2025-03-04T10:00:00', '--endtime', '2025-03-04T11:00:00']
    """
    return [
        "--allusers",
        "--allocations",
        "--parsable2",
        "--duplicates",
        "--noconvert",
        "--starttime",
        _sacct_time(since_ms),
        "--endtime",
        _sacct_time(until_ms),
        "--format",
        SACCT_FORMAT,
    ]


class CollectorMetrics:
    """The collector's Prometheus metrics (its own registry, served on ``slurm_metrics_port``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.polls = Counter(
            "faultstream_slurm_polls",
            "sacct polls, by outcome (ok, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.published = Counter(
            "faultstream_slurm_job_events_published",
            "Job events published to the jobs topic, by state.",
            ["state"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "faultstream_slurm_dead_letters",
            "sacct rows sent to the dead-letter topic.",
            registry=self.registry,
        )
        self.last_success = Gauge(
            "faultstream_slurm_last_poll_success_timestamp_seconds",
            "Wall-clock time of the last poll whose events Kafka acknowledged.",
            registry=self.registry,
        )
        self.window = Gauge(
            "faultstream_slurm_window_seconds",
            "Length of the last sacct window asked (grows while sacct fails).",
            registry=self.registry,
        )
        self.ledger = Gauge(
            "faultstream_slurm_ledger_events",
            "Published events the collector remembers.",
            registry=self.registry,
        )


@dataclass
class JobCollector:
    """One collector: its window, its ledger and its counts (one :meth:`poll` a window)."""

    settings: Settings
    commands: SlurmCommands
    cursor: Cursor
    producer: Any
    metrics: CollectorMetrics = field(default_factory=CollectorMetrics)
    clock: Any = time.time
    ledger: JobEventLedger = field(default_factory=JobEventLedger)
    #: Dead letters sent already (sacct returns a bad row at every poll that covers it).
    _letters_sent: set[tuple[str, bytes]] = field(default_factory=set)
    _read_back: bool = False
    since_ms: int = 0

    def start_window(self) -> int:
        """Where the first window starts: the cursor less the overlap, or the backfill."""
        saved = self.cursor.load()
        now_ms = int(self.clock() * 1000)
        if saved is None:
            self.since_ms = now_ms - int(self.settings.slurm_backfill_seconds * 1000)
            _log.info(
                "slurm-jobs: no cursor file at %s: starting %s back", self.cursor.path,
                f"{self.settings.slurm_backfill_seconds:g} s",
            )  # fmt: skip
        else:
            self.since_ms = saved - int(self.settings.slurm_overlap_seconds * 1000)
        return self.since_ms

    async def poll(self) -> int:
        """Ask sacct for one window, publish its new events and dead letters, save the cursor.

        Returns the number of events published. Raises :class:`SlurmCommandError` when sacct fails
        (nothing is published then, and the window keeps its start).
        """
        until_ms = int(self.clock() * 1000)
        self.metrics.window.set(max(0, until_ms - self.since_ms) / 1000)
        output = await self.commands.run("sacct", sacct_arguments(self.since_ms, until_ms))
        options = ParseOptions(cluster=self.settings.cluster, gpus_per_node=self.settings.gpus_per_node)
        events: list[JobEvent] = []
        letters: list[InvalidRecord] = []
        for item in parse_sacct(output.encode().splitlines(), options, "sacct"):
            if isinstance(item, InvalidRecord):
                letters.append(item)
            else:
                events.append(item)
        if events and not self._read_back:
            await self._read_back_from(min(event.ts_ms for event in events))
        self._read_back = True
        fresh = self.ledger.new_events(events)
        sends = [
            await self.producer.send(
                self.settings.topic_jobs,
                value=encode_record(event),
                key=record_key(event),
                timestamp_ms=event.ts_ms,
            )
            for event in fresh
        ]
        new_letters = [letter for letter in letters if (letter.reason, letter.raw) not in self._letters_sent]
        dead_letters = KafkaDeadLetters(self._send_dead_letter)
        for letter in new_letters:
            dead_letters.produce(to_dead_letter(letter))
        await asyncio.gather(*sends)
        await dead_letters.deliver(0)
        for event in fresh:
            self.ledger.remember(event_key(event))
            self.metrics.published.labels(event.state.value).inc()
        for letter in new_letters:
            self._letters_sent.add((letter.reason, letter.raw))
            self.metrics.dead_letters.inc()
        self.cursor.save(until_ms)
        window_start = until_ms - int(self.settings.slurm_overlap_seconds * 1000)
        self.ledger.forget({event_key(event) for event in events}, min(self.since_ms, window_start))
        self.since_ms = window_start
        self.metrics.ledger.set(len(self.ledger))
        self.metrics.last_success.set(self.clock())
        if fresh:
            states = Tally(event.state.value for event in fresh)
            _log.info(
                "slurm-jobs: published %d job event%s (%s)", len(fresh), "" if len(fresh) == 1 else "s",
                ", ".join(f"{count} {state}" for state, count in sorted(states.items())),
            )  # fmt: skip
        if new_letters:
            _log.warning(
                "slurm-jobs: %d sacct row(s) to the dead letters: %s", len(new_letters), new_letters[0].reason
            )
        return len(fresh)

    async def _send_dead_letter(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
        return await self.producer.send(
            self.settings.topic_dead_letters, value=value, key=key, headers=headers
        )

    async def _read_back_from(self, oldest_ms: int) -> None:
        """Remember the job events already on the jobs topic from ``oldest_ms`` on (what an earlier
        run of the collector, or anyone, published): they are not published again."""
        consumer = AIOKafkaConsumer(**client_options(self.settings), enable_auto_commit=False)
        await consumer.start()
        try:
            partitions = await self.producer.partitions_for(self.settings.topic_jobs)
            assigned = [TopicPartition(self.settings.topic_jobs, number) for number in sorted(partitions)]
            if not assigned:
                return
            consumer.assign(assigned)
            ends = await consumer.end_offsets(assigned)
            starts = await consumer.offsets_for_times({tp: oldest_ms for tp in assigned})
            remaining = {}
            for tp in assigned:
                found = starts.get(tp)
                begin = found.offset if found is not None else ends[tp]
                if begin < ends[tp]:
                    consumer.seek(tp, begin)
                    remaining[tp] = ends[tp]
            read = 0
            while remaining:
                batches = await consumer.getmany(*remaining, timeout_ms=1000)
                for tp, messages in batches.items():
                    for message in messages:
                        for _, line in message_lines(message.value, message.offset):
                            key = ledger_keys_of_line(line)
                            if key is not None:
                                self.ledger.remember(key)
                                read += 1
                    if messages and messages[-1].offset + 1 >= remaining[tp]:
                        del remaining[tp]
            _log.info(
                "slurm-jobs: %d job event(s) already on %s since %s: not published again",
                read, self.settings.topic_jobs, _sacct_time(oldest_ms),
            )  # fmt: skip
        finally:
            await consumer.stop()


async def run_collector(
    settings: Settings, commands: SlurmCommands, cursor_path: Path, once: bool = False
) -> int:
    """Poll until SIGTERM or Ctrl-C (``once``: one successful poll); returns the events published."""
    metrics = CollectorMetrics()
    if settings.slurm_metrics_port:
        start_http_server(settings.slurm_metrics_port, addr=settings.metrics_host, registry=metrics.registry)
        _log.info(
            "slurm-jobs: metrics on http://%s:%d/metrics", settings.metrics_host, settings.slurm_metrics_port
        )
    producer = AIOKafkaProducer(**client_options(settings), enable_idempotence=True, linger_ms=0)
    await producer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    collector = JobCollector(settings, commands, Cursor(cursor_path), producer, metrics)
    published = 0
    try:
        since = collector.start_window()
        _log.info(
            "slurm-jobs: polling sacct every %g s from %s UTC into %s (cursor %s)",
            settings.slurm_poll_seconds, _sacct_time(since), settings.topic_jobs, cursor_path,
        )  # fmt: skip
        pause = settings.slurm_poll_seconds
        failing_since: float | None = None
        said_at = 0.0
        while not stop.is_set():
            try:
                published += await collector.poll()
            except SlurmCommandError as exc:
                metrics.polls.labels("failed").inc()
                now = time.monotonic()
                if failing_since is None or now - said_at >= _SAY_EVERY_S:
                    _log.warning(
                        "slurm-jobs: %s; trying again in %g s (the window still starts at %s UTC)",
                        exc, pause, _sacct_time(collector.since_ms),
                    )  # fmt: skip
                    said_at = now
                failing_since = failing_since or now
                wait = pause
                pause = min(pause * 2, _LONGEST_PAUSE_S)
            else:
                metrics.polls.labels("ok").inc()
                if failing_since is not None:
                    _log.info(
                        "slurm-jobs: sacct answers again after %.0f s", time.monotonic() - failing_since
                    )
                failing_since = None
                pause = settings.slurm_poll_seconds
                wait = pause
                if once:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await producer.stop()
    return published
