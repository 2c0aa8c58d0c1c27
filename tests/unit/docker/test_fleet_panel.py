"""The reliability dashboard's fleet panels count what ``faultstream report``'s fleet view counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stream.reports.fleet import HARDWARE_FAILURE_KINDS

BOARD = Path(__file__).resolve().parents[3] / "docker" / "grafana" / "dashboards" / "reliability.json"


def test_the_fleet_panels_count_the_reports_hardware_failure_kinds() -> None:
    panels = [panel for panel in json.loads(BOARD.read_text())["panels"] if "per week" in panel["title"]]
    assert len(panels) == 2
    for panel in panels:
        sql = panel["targets"][0]["rawSql"]
        [listed] = re.findall(r"kind IN \(([^)]*)\)", sql)
        assert {kind.strip(" '") for kind in listed.split(",")} == {
            kind.value for kind in HARDWARE_FAILURE_KINDS
        }
        assert "fleet_inventory" in sql and "severity = 'critical'" in sql
