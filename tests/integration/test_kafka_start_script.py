"""tests/services/kafka/start.sh says what is wrong with the machine instead of "did not start"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "tests" / "services" / "kafka" / "start.sh"
WAIT = ROOT / "tests" / "services" / "kafka.py"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python without aiokafka: a virtualenv with nothing installed (not even pip)."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import aiokafka"], capture_output=True, text=True)
    assert probe.returncode != 0, "the bare virtualenv sees aiokafka"
    return python


def test_start_sh_names_the_missing_module(bare_python: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{bare_python.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    started = time.monotonic()
    result = subprocess.run(
        [str(START), str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env
    )
    took = time.monotonic() - started
    assert result.returncode != 0
    assert "No module named 'aiokafka'" in result.stderr, result.stderr
    assert str(bare_python) in result.stderr and "activate the virtualenv" in result.stderr
    assert "did not start" not in result.stderr
    assert not (tmp_path / "run" / "kafka.pid").exists(), "no broker was launched"
    assert took < 30, f"{took:.0f} s: it should fail before starting anything"


def test_the_readiness_check_names_the_missing_module(bare_python: Path) -> None:
    result = subprocess.run(
        [str(bare_python), str(WAIT), "wait", "127.0.0.1:9", "--timeout", "60"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot check the broker: No module named 'aiokafka'" in result.stderr, result.stderr
