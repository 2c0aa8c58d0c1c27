"""docker/worker.Dockerfile, its build context (.dockerignore) and docker/requirements.py, without Docker.

The Dockerfile is read instruction by instruction: pinned base images, a non-root user, the
``faultstream`` entry point, settings that exist, and COPY sources that exist and are not cut out
of the build context by the repository's .dockerignore (reproduced here with Docker's matching
rules: last matching pattern wins, a pattern that matches a folder matches what is inside it).
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stream.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "docker" / "worker.Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order; comments dropped, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the last instruction ends with a continuation"
    result = []
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
    return result


def _env_pairs(arguments: str) -> dict[str, str]:
    """``ENV A=1 B=2`` -> ``{"A": "1", "B": "2"}`` (the key=value form only)."""
    pairs = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S+)', arguments))
    return {key: value.strip('"') for key, value in pairs.items()}


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return _instructions(DOCKERFILE)


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return project


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def test_base_images_are_pinned_python_of_the_project(
    instructions: list[tuple[str, str]], project: dict[str, Any]
) -> None:
    stages: set[str] = set()
    bases = []
    for keyword, arguments in instructions:
        if keyword != "FROM":
            continue
        words = [w for w in arguments.split() if not w.startswith("--")]
        image = words[0]
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if image in stages:
            continue
        assert "$" not in image, f"FROM {image}: an ARG-dependent base cannot be checked"
        match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-(bookworm|trixie)", image)
        assert match, f"FROM {image}: not a python:X.Y.Z-slim-<debian> tag"
        bases.append(image)
        minimum = re.search(r">=\s*(\d+)\.(\d+)", project["requires-python"])
        assert minimum and (match[1], match[2]) == (minimum[1], minimum[2]), f"{image} vs requires-python"
    assert bases and len(set(bases)) == 1, f"build and runtime stages on one base: {bases}"


def test_runs_as_a_non_root_user(instructions: list[tuple[str, str]]) -> None:
    users = [arguments for keyword, arguments in _final_stage(instructions) if keyword == "USER"]
    assert users, "the runtime stage sets no USER: it would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    assert user.isdigit(), "a numeric uid lets Kubernetes' runAsNonRoot verify it"
    run = " ".join(arguments for keyword, arguments in _final_stage(instructions) if keyword == "RUN")
    assert f"--uid {user}" in run, "the uid is created in the image"


def test_entrypoint_is_the_faultstream_command(
    instructions: list[tuple[str, str]], project: dict[str, Any]
) -> None:
    final = dict(_final_stage(instructions))
    assert "faultstream" in project["scripts"]
    assert final["ENTRYPOINT"] == '["faultstream"]', "exec form, so signals reach the worker"
    assert final["CMD"] == '["worker"]'


def test_environment_sets_real_settings(instructions: list[tuple[str, str]]) -> None:
    env: dict[str, str] = {}
    for keyword, arguments in _final_stage(instructions):
        if keyword == "ENV":
            env.update(_env_pairs(arguments))
    names = {ENV_PREFIX + spec.name.upper() for spec in fields(Settings)}
    faultstream = {key: value for key, value in env.items() if key.startswith(ENV_PREFIX)}
    assert faultstream.keys() <= names
    settings = Settings.from_env(faultstream)
    assert settings.metrics_host == "0.0.0.0", "inside a container the metrics must bind every interface"
    exposed = {arguments for keyword, arguments in _final_stage(instructions) if keyword == "EXPOSE"}
    assert str(settings.metrics_port) in exposed
    assert "/opt/faultstream/bin" in env["PATH"]


# --- build context ------------------------------------------------------------------------------


def _dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                regex, index = regex + "(?:.*/)?", index + 3
            elif pattern.startswith("**", index):
                regex, index = regex + ".*", index + 2
            elif pattern[index] == "*":
                regex, index = regex + "[^/]*", index + 1
            elif pattern[index] == "?":
                regex, index = regex + "[^/]", index + 1
            elif pattern[index] == "[":
                end = pattern.index("]", index)
                regex, index = regex + pattern[index : end + 1], end + 1
            else:
                regex, index = regex + re.escape(pattern[index]), index + 1
        rules.append((negate, re.compile(regex)))
    return rules


def _ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for negate, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_matching_follows_docker() -> None:
    rules = _dockerignore()
    assert not _ignored("stream/worker.py", rules)
    assert _ignored("stream/__pycache__/worker.cpython-311.pyc", rules)
    assert _ignored("__pycache__/x.pyc", rules)
    assert _ignored("docker/compose.yaml", rules)


def test_build_context_holds_the_sources_and_nothing_heavy(instructions: list[tuple[str, str]]) -> None:
    rules = _dockerignore()
    for keyword, arguments in instructions:
        if keyword != "COPY" or "--from=" in arguments:
            continue
        *sources, _destination = [w for w in arguments.split() if not w.startswith("--")]
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: not in the repository"
            files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            kept = [p for p in files if not _ignored(str(p.relative_to(ROOT)), rules)]
            assert kept, f"COPY {source}: .dockerignore leaves nothing of it"
            if path.is_dir():
                for module in path.rglob("*.py"):
                    if "__pycache__" not in module.parts:
                        assert not _ignored(str(module.relative_to(ROOT)), rules), module
    for heavy in (".git/HEAD", ".venv/bin/python", "faultstream-data/x", "tests/conftest.py", "examples/x"):
        assert _ignored(heavy, rules), f"{heavy} would be sent to the Docker daemon"
    assert not _ignored("README.md", rules), "pyproject.toml names README.md as the readme"
    package_data = ROOT / "schemas" / "jsonschema"
    assert all(not _ignored(str(p.relative_to(ROOT)), rules) for p in package_data.glob("*.json"))


# --- docker/requirements.py ---------------------------------------------------------------------


def _requirements_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "docker" / "requirements.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_image_requirements_leave_out_only_the_embedded_store(project: dict[str, Any]) -> None:
    requirements = _requirements_module()
    dependencies = project["dependencies"]
    server = requirements.requirements(PYPROJECT, embedded=False)
    assert requirements.requirements(PYPROJECT, embedded=True) == dependencies
    assert [d for d in dependencies if d not in server] == [d for d in dependencies if d.startswith("chdb")]
    assert any(d.startswith("chdb") for d in dependencies), (
        "chdb is no longer a dependency: update EMBEDDED_ONLY"
    )
    assert requirements.distribution_name("Faust_Streaming[rocksdb]==0.15.3") == "faust-streaming"
    assert requirements.distribution_name("chdb==4.4.0") == "chdb"
    assert requirements.distribution_name("numpy>=2.0,<3") == "numpy"
    assert requirements.distribution_name("x ; python_version<'3.12'") == "x"


def test_the_dockerfile_runs_the_requirements_helper(instructions: list[tuple[str, str]]) -> None:
    runs = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert 'docker/requirements.py --embedded "$EMBEDDED"' in runs
    assert "pip install --no-deps ." in runs
    args = [arguments for keyword, arguments in instructions if keyword == "ARG"]
    assert "EMBEDDED=false" in args
