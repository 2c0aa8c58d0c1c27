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


def test_stop_keep_then_restart_brings_the_same_broker_back_with_its_data(tmp_path: Path) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    from tests.services import kafka

    stop = START.with_name("stop.sh")
    run_dir = tmp_path / "run"
    first = subprocess.run([str(START), str(run_dir)], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    bootstrap = first.stdout.strip().splitlines()[-1].split("=", 1)[1]
    try:
        kafka.create_topic("kept", 2, bootstrap=bootstrap)

        async def produce() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await producer.start()
            try:
                for n in range(6):
                    await producer.send_and_wait("kept", b"%d" % n, partition=n % 2)
            finally:
                await producer.stop()

        asyncio.run(produce())
        kept = subprocess.run(
            [str(stop), "--keep", str(run_dir)], capture_output=True, text=True, timeout=120
        )
        assert kept.returncode == 0, kept.stderr
        assert (run_dir / "data").is_dir() and not (run_dir / "kafka.pid").exists()
        again = subprocess.run(
            [str(START), "--restart", str(run_dir)], capture_output=True, text=True, timeout=300
        )
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.strip().splitlines()[-1] == f"KAFKA_BOOTSTRAP={bootstrap}", "not the same port"
        assert (run_dir / "kafka.log.1").is_file(), "the first run's log is kept beside the new one"
        records, ends = asyncio.run(kafka.consume(bootstrap, "kept", 2, 6, timeout=30))
        assert sorted(record.value for record in records) == [b"%d" % n for n in range(6)]
        assert ends == {0: 3, 1: 3}
        twice = subprocess.run(
            [str(START), "--restart", str(run_dir)], capture_output=True, text=True, timeout=60
        )
        assert twice.returncode != 0 and "already runs" in twice.stderr
    finally:
        subprocess.run([str(stop), str(run_dir)], timeout=120, check=False)
    assert not run_dir.exists()
