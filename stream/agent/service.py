"""``faultstream agent``: wiring the kernel-log source, the GPU counters, the spool and the sender.

Data path: the source (a followed file or journalctl) gives batches of values and the position
after them -> the spool (records and the position, flushed to disk) -> the cursor file (the same
position, written atomically) -> the sender (Kafka, with the settings' security) -> acknowledged.
Kernel-log values go to ``topic_kernel_log`` as the shippers' shapes the worker already reads (a
file's lines as they are, e.g. rsyslog's ``RSYSLOG_FileFormat``; journal entries as
``journalctl -o json`` objects), keyed by this node; ECC samples go to ``topic_ecc`` as
``replay --to`` sends them.

Where reading resumes: the newest position marker in the spool, else the cursor file (the spool
keeps its newest segment, so the marker is there unless the spool folder was removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from stream.agent.file_follower import FileFollower, FilePosition, Rotation
from stream.agent.journal import JournalSource
from stream.agent.metrics import AgentMetrics
from stream.agent.scrape import (
    ecc_records_of_dcgm,
    ecc_records_of_nvidia_smi,
    now_ms,
    run_nvidia_smi,
    scrape_url,
)
from stream.agent.sender import SpoolSender
from stream.agent.spool import Spool
from stream.agent.state_file import read_state, write_state
from stream.settings import Settings

__all__ = ["AgentPlan", "KernelLogSpec", "plan_agent", "run_agent"]

_log = logging.getLogger("faultstream.agent")


@dataclass(frozen=True, slots=True)
class KernelLogSpec:
    """What ``agent_kernel_log`` names: the live journal, a journal on disk, or a file."""

    kind: str  # "journal" or "file"
    path: Path | None = None

    @staticmethod
    def parse(text: str) -> KernelLogSpec:
        """
        >>> KernelLogSpec.parse("journal"), KernelLogSpec.parse("journal:/tmp/j").path
        (KernelLogSpec(kind='journal', path=None), PosixPath('/tmp/j'))
        >>> KernelLogSpec.parse("/var/log/kern.log")
        KernelLogSpec(kind='file', path=PosixPath('/var/log/kern.log'))
        """
        text = text.strip()
        if text == "journal":
            return KernelLogSpec("journal")
        if text.startswith("journal:"):
            return KernelLogSpec("journal", Path(text.removeprefix("journal:")))
        if not text:
            raise ValueError("FAULTSTREAM_AGENT_KERNEL_LOG is empty: `journal`, a file or `journal:PATH`")
        return KernelLogSpec("file", Path(text))


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """Everything the agent runs with, resolved from the settings."""

    settings: Settings
    kernel_log: KernelLogSpec
    node: str
    state_dir: Path
    once: bool = False

    @property
    def key(self) -> bytes:
        return self.node.encode()


def plan_agent(settings: Settings, once: bool = False) -> AgentPlan:
    """Resolve the node name and the state folder; ValueError for settings that cannot work."""
    if settings.agent_spool_max_bytes < 64 * 1024:
        raise ValueError(f"FAULTSTREAM_AGENT_SPOOL_MAX_BYTES={settings.agent_spool_max_bytes}: under 64 KiB")
    if settings.agent_max_line_bytes < 256:
        raise ValueError(f"FAULTSTREAM_AGENT_MAX_LINE_BYTES={settings.agent_max_line_bytes}: at least 256")
    state_dir = Path(settings.agent_state_dir or Path(settings.data_dir) / "agent")
    return AgentPlan(
        settings=settings,
        kernel_log=KernelLogSpec.parse(settings.agent_kernel_log),
        node=settings.agent_node or socket.gethostname(),
        state_dir=state_dir,
        once=once,
    )


class Agent:
    """The running agent: its spool, sender, metrics and tasks."""

    def __init__(self, plan: AgentPlan) -> None:
        self.plan = plan
        self.settings = plan.settings
        self.metrics = AgentMetrics()
        plan.state_dir.mkdir(parents=True, exist_ok=True)
        self.spool = Spool(plan.state_dir / "spool", self.settings.agent_spool_max_bytes)
        self.cursor_path = plan.state_dir / "cursor.json"
        self.sender = SpoolSender(self.settings, self.spool, self.metrics)
        self._saved_position: dict[str, Any] | None = None
        self._follower: FileFollower | None = None

    def start_position(self) -> dict[str, Any] | None:
        return self.spool.last_position() or read_state(self.cursor_path)

    # --- into the spool

    def spool_values(self, topic: str, values: list[bytes], position: dict[str, Any] | None) -> None:
        records = [(topic, self.plan.key, value) for value in values]
        if position == self._saved_position:
            position = None  # nothing new to remember
        dropped = self.spool.append(records, position)
        if position is not None:
            write_state(self.cursor_path, position)
            self._saved_position = position
        if dropped.records:
            self.metrics.dropped.inc(dropped.records)
            _log.error(
                "SPOOL FULL: DROPPED %d record(s) (%d bytes) Kafka never received, the oldest: the spool "
                "reached FAULTSTREAM_AGENT_SPOOL_MAX_BYTES=%d while Kafka was away",
                dropped.records, dropped.bytes, self.spool.max_bytes,
            )  # fmt: skip
        self.sender.wake.set()

    # --- sources

    async def follow_file(self, path: Path) -> None:
        position = self.start_position()
        self._saved_position = position
        follower = self._follower = FileFollower(
            path,
            FilePosition.from_state(position),
            from_start=self.settings.agent_from_start,
            max_line_bytes=self.settings.agent_max_line_bytes,
        )
        read = self.metrics.lines_read.labels("file")
        truncated = 0
        try:
            while True:
                rotation = Rotation()
                try:
                    lines = follower.poll(rotation)
                except OSError as exc:  # unreadable for now (permissions, a disk error): say it, go on
                    _log.warning("cannot read %s: %s", path, exc)
                    lines = []
                for note in rotation.notes:
                    _log.info("%s", note)
                self.metrics.rotations.labels("renamed").inc(rotation.renamed)
                self.metrics.rotations.labels("truncated").inc(rotation.truncated)
                self.metrics.lines_truncated.inc(follower.truncated - truncated)
                truncated = follower.truncated
                read.inc(len(lines))
                where = follower.position
                if lines or (where is not None and where.to_state(path) != self._saved_position):
                    self.spool_values(
                        self.settings.topic_kernel_log, lines, where.to_state(path) if where else None
                    )
                if self.plan.once and not lines:
                    return
                await asyncio.sleep(self.settings.agent_poll_seconds)
        finally:
            follower.close()

    async def follow_journal(self, journal_path: Path | None) -> None:
        position = self.start_position()
        self._saved_position = position
        source = JournalSource(
            journal_path, position, max_bytes=self.settings.agent_max_line_bytes, follow=not self.plan.once
        )
        read = self.metrics.lines_read.labels("journal")
        try:
            async for values, where in source.batches():
                read.inc(len(values))
                self.spool_values(self.settings.topic_kernel_log, values, where)
                self.metrics.lines_truncated.inc(source.truncated)
                self.metrics.unreadable.labels("journal").inc(source.unreadable)
                source.truncated = source.unreadable = 0
        finally:
            source.close()

    async def scrape_dcgm(self, url: str) -> None:
        while True:
            try:
                body = await scrape_url(url)
            except (OSError, ValueError) as exc:
                self.metrics.scrapes.labels("dcgm", "failed").inc()
                _log.warning("cannot scrape %s: %s", url, exc)
            else:
                self.metrics.scrapes.labels("dcgm", "ok").inc()
                records, unreadable = ecc_records_of_dcgm(
                    body, self.plan.node, self.settings.cluster, self.settings.topic_ecc, now_ms()
                )
                self.metrics.unreadable.labels("dcgm").inc(unreadable)
                if records:
                    self.spool_values_records(records)
            if self.plan.once:
                return
            await asyncio.sleep(self.settings.agent_dcgm_seconds)

    async def run_smi(self) -> None:
        while True:
            try:
                out = await run_nvidia_smi(self.settings.agent_nvidia_smi_command)
            except OSError as exc:
                self.metrics.scrapes.labels("nvidia-smi", "failed").inc()
                _log.warning("nvidia-smi: %s", exc)
            else:
                self.metrics.scrapes.labels("nvidia-smi", "ok").inc()
                records, unreadable = ecc_records_of_nvidia_smi(
                    out, self.plan.node, self.settings.cluster, self.settings.topic_ecc
                )
                self.metrics.unreadable.labels("nvidia-smi").inc(unreadable)
                if records:
                    self.spool_values_records(records)
            if self.plan.once:
                return
            await asyncio.sleep(self.settings.agent_nvidia_smi_seconds)

    def spool_values_records(self, records: list[tuple[str, bytes, bytes]]) -> None:
        """Spool ready-made (topic, key, value) records (ECC samples: keyed by their own node)."""
        dropped = self.spool.append(records, None)
        if dropped.records:
            self.metrics.dropped.inc(dropped.records)
            _log.error("SPOOL FULL: DROPPED %d record(s) Kafka never received", dropped.records)
        self.sender.wake.set()

    # --- gauges

    async def keep_gauges(self) -> None:
        while True:
            self.update_gauges()
            await asyncio.sleep(2.0)

    def update_gauges(self) -> None:
        self.metrics.spool_bytes.set(self.spool.bytes)
        self.metrics.spool_records.set(self.spool.undelivered)
        oldest = self.spool.oldest_pending_ms() if self.spool.undelivered else None
        self.metrics.lag.set(0 if oldest is None else max(0.0, time.time() - oldest / 1000))
        if self._follower is not None:
            self.metrics.behind_bytes.set(self._follower.behind_bytes())


async def run_agent(plan: AgentPlan) -> int:
    """Run until SIGTERM or Ctrl-C (``plan.once``: until what is there now is read and in Kafka)."""
    settings = plan.settings
    agent = Agent(plan)
    if settings.agent_metrics_port:
        port, registry = settings.agent_metrics_port, agent.metrics.registry
        start_http_server(port, addr=settings.metrics_host, registry=registry)
    spec = plan.kernel_log
    _log.info(
        "agent on %s: %s -> %s (spool %s, up to %d bytes)%s",
        plan.node,
        spec.path if spec.kind == "file" else f"journal {spec.path or '(live)'}",
        settings.topic_kernel_log,
        agent.spool.folder,
        agent.spool.max_bytes,
        f"; metrics on http://{settings.metrics_host}:{settings.agent_metrics_port}/metrics"
        if settings.agent_metrics_port
        else "",
    )
    if spec.kind == "file" and spec.path is not None:
        sources = [agent.follow_file(spec.path)]
    else:
        sources = [agent.follow_journal(spec.path)]
    if settings.agent_dcgm_url:
        sources.append(agent.scrape_dcgm(settings.agent_dcgm_url))
    if settings.agent_nvidia_smi_seconds > 0:
        sources.append(agent.run_smi())
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks = [asyncio.create_task(source) for source in sources]
    helpers = [asyncio.create_task(agent.sender.run()), asyncio.create_task(agent.keep_gauges())]
    try:
        if plan.once:
            await asyncio.gather(*tasks)
            while agent.spool.undelivered and not stop.is_set():
                agent.sender.wake.set()
                await asyncio.sleep(0.2)
        else:
            stopped = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopped and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            stopped.cancel()
    finally:
        for task in [*tasks, *helpers]:
            task.cancel()
        for task in [*tasks, *helpers]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        agent.update_gauges()
        agent.spool.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0
