"""Running ``faultstream agent`` processes in tests, and reading what they published.

Each agent gets its own state folder, log file and metrics port; it is stopped by its PID
(SIGTERM, or SIGKILL for a crash).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from stream.worker.caught_up import metric_sum
from tests.services.kafka import consume
from tests.services.worker import ROOT, free_port, stop_process


class AgentProcess:
    """One ``faultstream agent`` with its state folder under ``folder``."""

    def __init__(self, env: dict[str, str], folder: Path, kernel_log: str, *extra: str) -> None:
        """Start it; with ``--once`` among ``extra``, do not wait for its metrics (it may be done first)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.log_path = folder / "agent.log"
        self.metrics_port = free_port()
        self._env = {**os.environ, **env, "FAULTSTREAM_AGENT_METRICS_PORT": str(self.metrics_port)}
        self._args = ["--kernel-log", kernel_log, "--state-dir", str(folder / "state"), "--node", "agent-node",
                      *extra]  # fmt: skip
        self.start(wait="--once" not in extra)

    def start(self, *, wait: bool = True) -> None:
        self._log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "agent", *self._args],
            env=self._env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while wait and self.metrics_page() is None:
            assert self.process.poll() is None, f"the agent exited at start:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"the agent's metrics did not answer:\n{self.log()[-3000:]}"
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics_page(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
                return answer.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None

    def metric(self, name: str, label: str = "") -> float:
        page = self.metrics_page()
        assert page is not None, f"the agent's metrics do not answer:\n{self.log()[-3000:]}"
        return metric_sum(page, name, label)

    def assert_alive(self) -> None:
        assert self.process.poll() is None, f"the agent exited:\n{self.log()[-3000:]}"

    def wait_published(self, count: int, timeout: float = 60) -> None:
        """Until Kafka acknowledged ``count`` records of this process (its metric)."""
        deadline = time.monotonic() + timeout
        while self.metric("faultstream_agent_records_published_total") < count:
            self.assert_alive()
            assert time.monotonic() < deadline, (
                f"published {self.metric('faultstream_agent_records_published_total')} of {count} "
                f"in {timeout:.0f} s:\n{self.log()[-3000:]}"
            )
            time.sleep(0.3)

    def stop(self) -> None:
        stop_process(self.process, 30)
        self._log.close()

    def kill(self) -> None:
        """kill -9: no shutdown."""
        self.process.kill()
        self.process.wait()
        self._log.close()


def topic_values(bootstrap: str, topic: str, at_least: int, timeout: float = 60) -> list[bytes]:
    """Every value of a one-partition topic (waiting until it holds ``at_least``)."""
    records, _ends = asyncio.run(consume(bootstrap, topic, 1, at_least, timeout))
    deadline = time.monotonic() + 5
    # What came after ``at_least``: read to the end offset once more.
    while time.monotonic() < deadline:
        more, ends = asyncio.run(consume(bootstrap, topic, 1, 10**9, 3))
        if len(more) >= ends[0]:
            return [record.value for record in more]
    return [record.value for record in records]
