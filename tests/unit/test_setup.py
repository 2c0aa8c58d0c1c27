"""tests/setup, the set-up part of README's test command: it names what the machine lacks and how to
install it, and with --check changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tests" / "setup"
# What tests/setup itself runs, besides the tools it checks.
BASICS = ("bash", "env", "dirname", "sed", "head", "cut")


def machine(
    tmp_path: Path, *, java: str | None = "17.0.15", mvn: bool = True, cc: bool = True
) -> dict[str, str]:
    """An environment whose PATH has the basics, this Python, the given Java and Maven, and a C
    compiler unless ``cc`` is false."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in BASICS:
        found = shutil.which(name)
        assert found, name
        (bin_dir / name).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    if java is not None:
        (bin_dir / "java").write_text(f"#!/bin/sh\necho 'openjdk version \"{java}\" 2025-04-15' >&2\n")
        (bin_dir / "java").chmod(0o755)
    if mvn:
        (bin_dir / "mvn").write_text("#!/bin/sh\necho 'Apache Maven 3.8.7'\n")
        (bin_dir / "mvn").chmod(0o755)
    modules = tmp_path / "rsyslog-modules"
    modules.mkdir()
    (modules / "omkafka.so").write_text("")
    slurm_plugins = tmp_path / "slurm-plugins"
    slurm_plugins.mkdir()
    (slurm_plugins / "accounting_storage_mysql.so").write_text("")
    for tool in (
        "rsyslogd",
        "chromium",
        "promtool",
        "prometheus-alertmanager",
        "openssl",
        "keytool",
        "systemd-journal-remote",
        *("munged", "munge", "slurmctld", "slurmd", "sbatch", "sacct", "slurmdbd"),
        *("mariadbd", "mariadb-install-db", "mariadb"),
        *(["cc"] if cc else []),
    ):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return {
        **env, "PATH": str(bin_dir), "VIRTUAL_ENV": sys.prefix, "RSYSLOG_MODULES": str(modules),
        "SLURM_PLUGINS": str(slurm_plugins),
    }  # fmt: skip


def setup(env: dict[str, str], *args: str, script: Path = SETUP) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_a_ready_machine_passes_the_check(tmp_path: Path) -> None:
    result = setup(machine(tmp_path), "--check")
    assert result.returncode == 0, result.stderr
    assert "setup: ready:" in result.stderr and f"virtualenv {sys.prefix}" in result.stderr


@pytest.mark.parametrize(
    ("machine_kwargs", "named", "how"),
    [
        ({"java": None}, "Java 17 (no java on PATH", "apt-get install -y openjdk-17-jre-headless"),
        ({"java": "11.0.2"}, 'Java 17 or newer (found: openjdk version "11.0.2"', "openjdk-17-jre-headless"),
        ({"mvn": False}, "Maven (no mvn on PATH", "apt-get install -y maven"),
        ({"cc": False}, "a C compiler (benchmarks/compiled_core.py", "apt-get install -y gcc"),
    ],
)
def test_a_missing_tool_is_named_with_how_to_install_it(
    tmp_path: Path, machine_kwargs: dict[str, object], named: str, how: str
) -> None:
    result = setup(machine(tmp_path, **machine_kwargs))  # type: ignore[arg-type]
    assert result.returncode == 1
    assert "this machine lacks what the test suite needs" in result.stderr
    assert named in result.stderr and how in result.stderr


def test_without_a_virtualenv_the_check_says_what_it_would_install(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "tests").mkdir(parents=True)
    shutil.copy(SETUP, clone / "tests" / "setup")
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    env = machine(tmp_path)
    del env["VIRTUAL_ENV"]
    result = setup(env, "--check", script=clone / "tests" / "setup")
    assert result.returncode == 0, result.stderr
    assert f"would set up {clone / '.venv'}: python -m venv (if missing), then pip install -e '.[dev]'" in (
        result.stderr
    )
    assert not (clone / ".venv").exists()  # --check changes nothing


def test_as_root_on_debian_what_is_missing_is_installed_with_apt_get(tmp_path: Path) -> None:
    """A fresh machine of CI's kind: tests/setup (hence tests/run) installs the packages it lacks,
    saying which, then checks again. apt-get here records its arguments and "installs" the tools."""
    env = machine(tmp_path)
    bin_dir = Path(env["PATH"])
    for tool in ("promtool", "prometheus-alertmanager"):
        (bin_dir / tool).unlink()
    log = tmp_path / "apt.log"
    chmod = shutil.which("chmod")
    script = [f'echo "$@" >> {log}', 'case "$*" in *install*)']
    for tool in ("promtool", "prometheus-alertmanager"):
        script += [f"    echo '#!/bin/sh' > {bin_dir}/{tool}", f"    {chmod} +x {bin_dir}/{tool}"]
    script += ["    ;;", "esac"]
    (bin_dir / "apt-get").write_text("#!/bin/sh\n" + "\n".join(script) + "\n")
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    for tool in ("apt-get", "id"):
        (bin_dir / tool).chmod(0o755)
    result = setup(env)
    assert result.returncode == 0, result.stderr
    said = "setup: installing what this machine lacks with apt-get: prometheus prometheus-alertmanager"
    assert said in result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "update -q"
    assert calls[1].endswith("--no-install-recommends prometheus prometheus-alertmanager")


def test_without_root_the_one_command_to_run_is_named(tmp_path: Path) -> None:
    env = machine(tmp_path, mvn=False)
    (Path(env["PATH"]) / "promtool").unlink()
    result = setup(env)
    assert result.returncode == 1
    assert "sudo apt-get install -y --no-install-recommends maven prometheus" in result.stderr
