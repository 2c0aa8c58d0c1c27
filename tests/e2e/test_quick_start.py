"""README's two commands, as a newcomer runs them, in a clean clone of this repository.

The quick start (`pip install -e . && faultstream replay ...`) runs its replay in the clone with the
Python environment already installed (installing again would take minutes); its output must fit
one terminal page. The test command's set-up part (`tests/setup`, which `tests/run` calls first)
is run with `--check` in the clone: it must find this machine ready.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGE = 50  # lines: one terminal page


def first_block(title: str) -> str:
    """The first ```bash block of README's section ``title``."""
    start = README.index(f"\n## {title}")
    return re.search(r"```bash\n(.*?)```", README[start:], re.S).group(1).strip()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean clone of the committed tree (what CI and a newcomer start from)."""
    target = tmp_path_factory.mktemp("clone") / "faultstream"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True, timeout=120)
    return target


def run(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTSTREAM_")}
    return subprocess.run(
        [*args], cwd=clone, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_quick_start_runs_in_a_clean_clone_and_fits_one_page(clone: Path) -> None:
    install, _, replay = first_block("Quick start").partition(" && ")
    assert install == "pip install -e .", "README's quick start installs the package, then replays"
    words = shlex.split(replay)
    assert words[:2] == ["faultstream", "replay"]
    which = run(clone, sys.executable, "-c", "import stream; print(stream.__file__)")
    assert which.stdout.strip() == str(clone / "stream" / "__init__.py"), "the clone's code must run"
    result = run(clone, sys.executable, "-m", "stream.cli", *words[1:], "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) <= PAGE, f"the quick start printed {len(lines)} lines:\n{result.stdout}"
    text = result.stdout
    assert text.startswith("Replayed 3 files in ")
    assert "Failure rate r_f = " in text  # is my cluster healthy
    assert "Incidents (" in text and "Critical incidents by node: " in text  # what broke
    assert "Open incidents: what to do" in text or "Nothing to do" in text  # what do I do
    assert text.count("MTTF by job size") == 1 and "ETTR guidance" in text
    assert (clone / "faultstream-data").is_dir(), "the embedded store is made where the user stands"


def test_the_test_command_sets_up_before_it_tests(clone: Path) -> None:
    assert first_block("Running the tests") == "tests/run"
    assert re.search(r"^tests/setup$", (clone / "tests" / "run").read_text(), re.M), (
        "tests/run calls tests/setup"
    )
    assert re.search(r"^exec tests/run$", (clone / ".ci" / "run").read_text(), re.M), ".ci/run calls it too"
    result = run(clone, "tests/setup", "--check")
    assert result.returncode == 0, result.stderr
    assert "setup: ready:" in result.stderr or "would set up" in result.stderr
