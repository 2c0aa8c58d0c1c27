"""A real rsyslog (Debian's ``rsyslog`` + ``rsyslog-kafka``) shipping syslog to Kafka with omkafka.

It runs as a site's log relay does: the nodes forward their kernel messages to it over TCP
(``*.* @@relay`` with ``RSYSLOG_ForwardFormat``: ``<PRI>`` then an RFC 3339 time, the node's
host name, ``kernel:`` and the message), and it ships each message to a Kafka topic with omkafka
and the template given: its default ``RSYSLOG_FileFormat`` or the RFC 5424
``RSYSLOG_SyslogProtocol23Format``. (``imfile`` reads a file as the local host's lines: it keeps
no host name of the file's, so a fleet's lines in one file reach Kafka through the relay.)

Started on 127.0.0.1 from a temporary folder (config, work directory, log), stopped by its PID.
A missing rsyslog or omkafka fails the test with the packages to install: ``tests/run`` installs
them.
"""

from __future__ import annotations

import glob
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.services.worker import free_port, stop_process

#: Kernel messages forwarded as priority 4 (kern.warning), as the NVIDIA driver logs them.
_PRIORITY = b"<4>"


def _binary() -> str:
    path = shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if Path("/usr/sbin/rsyslogd").exists() else None)
    if path is None or not glob.glob("/usr/lib/*/rsyslog/omkafka.so"):
        pytest.fail(
            "rsyslog with omkafka is not installed: apt-get install rsyslog rsyslog-kafka (tests/run does)",
            pytrace=False,
        )
    return path


class RsyslogRelay:
    """rsyslogd in the foreground: imtcp on a free port, one omkafka action to ``topic``."""

    def __init__(self, folder: Path, bootstrap: str, topic: str, template: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.log_path = folder / "rsyslogd.log"
        config = folder / "rsyslog.conf"
        config.write_text(
            f"""
global(workDirectory="{folder}" maxMessageSize="2m")
module(load="imtcp")
module(load="omkafka")
input(type="imtcp" address="127.0.0.1" port="{self.port}" ruleset="ship")
ruleset(name="ship") {{
  action(type="omkafka" broker=["{bootstrap}"] topic="{topic}" template="{template}"
         confParam=["queue.buffering.max.ms=5"] resubmitOnFailure="on" keepFailedMessages="on"
         failedMsgFile="{folder}/failed.data")
}}
"""
        )
        binary = _binary()
        check = subprocess.run(
            [binary, "-N1", "-f", str(config)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, f"rsyslog refused its configuration:\n{check.stdout}{check.stderr}"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, "-n", "-f", str(config), "-i", str(folder / "rsyslogd.pid")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_listening()

    def _wait_listening(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"rsyslogd exited at start:\n{self.log()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"rsyslogd did not listen in {timeout:.0f} s:\n{self.log()[-2000:]}")

    def forward(self, lines: Iterable[bytes]) -> int:
        """Send kernel-log lines (``<RFC 3339 time> <host> kernel: <message>``) as nodes forward
        them; return how many."""
        count = 0
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as connection:
            batch = []
            for line in lines:
                batch.append(_PRIORITY + line.rstrip(b"\r\n") + b"\n")
                count += 1
                if len(batch) >= 1000:
                    connection.sendall(b"".join(batch))
                    batch = []
            connection.sendall(b"".join(batch))
        return count

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        stop_process(self.process, 10)
