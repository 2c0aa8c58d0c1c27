"""Alertmanager configurations: the stack's (docker/alertmanager/alertmanager.yml) and README's
route example, checked by ``amtool check-config`` (Debian's ``prometheus-alertmanager``; .ci/run
installs it; without it these tests fail, they do not skip)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
STACK_CONFIG = ROOT / "docker" / "alertmanager" / "alertmanager.yml"


def amtool_check(path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is not installed: apt-get install prometheus-alertmanager (.ci/run does)")
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def readme_route() -> str:
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    paging = operations[operations.index("## Paging") :]
    match = re.search(r"```yaml\n(.*?)```", paging, re.S)
    assert match, "docs/operations.md's Paging section has no alertmanager.yml example"
    return match.group(1)


def routes(config: dict[str, Any]) -> dict[str, str]:
    """severity -> receiver of the routes that match on a severity."""
    out = {}
    for route in config["route"]["routes"]:
        for matcher in route["matchers"]:
            if matcher.startswith("severity="):
                out.setdefault(matcher.split("=", 1)[1].strip('"'), route["receiver"])
    return out


def test_the_stack_config_is_valid_and_routes_by_severity() -> None:
    amtool_check(STACK_CONFIG)
    config = yaml.safe_load(STACK_CONFIG.read_text(encoding="utf-8"))
    assert routes(config) == {"critical": "pager", "warn": "chat"}


def test_readme_route_example_is_valid_sending_critical_to_a_pager_and_warn_to_chat(tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(readme_route())
    amtool_check(path)
    config = yaml.safe_load(path.read_text())
    assert routes(config) == {"critical": "pager", "warn": "chat"}
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert "pagerduty_configs" in receivers["pager"] and "slack_configs" in receivers["chat"]
