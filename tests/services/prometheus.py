"""A real Prometheus and a real Alertmanager (Debian's packages), started by tests on 127.0.0.1.

Each runs from a temporary folder (config, storage, log) on a free port and is stopped by its PID.
A missing binary fails the test with the package to install: .ci/run installs both.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.services.worker import free_port


def binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: apt-get install {package} (.ci/run does)", pytrace=False)
    return path


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Service:
    """One server process with its folder, port and log; stopped by PID."""

    def __init__(self, name: str, argv: list[str], folder: Path, port: int) -> None:
        self.name = name
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited at start:\n{self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"{self.name} was not ready in {timeout:.0f} s:\n{self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_prometheus(folder: Path, config: dict[str, Any], rules: dict[str, Any] | None = None) -> Service:
    """Prometheus with ``config`` (and ``rules`` as its one rule file), storage under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if rules is not None:
        (folder / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {**config, "rule_files": [str(folder / "rules.yml")]}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    argv = [
        binary("prometheus", "prometheus"),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return Service("prometheus", argv, folder, port)


def start_alertmanager(folder: Path) -> Service:
    """Alertmanager with one do-nothing receiver, clustering off (it would bind 0.0.0.0:9094)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {"receiver": "null", "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "null"}],
    }
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary("prometheus-alertmanager", "prometheus-alertmanager"),
        f"--config.file={folder / 'alertmanager.yml'}",
        f"--storage.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    return Service("alertmanager", argv, folder, port)
