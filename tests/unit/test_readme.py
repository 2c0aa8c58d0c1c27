"""docs/configuration.md (README links it) is the configuration reference: it must name every setting,
topic, table and column."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from schemas.ddl import ddl_statements
from stream.kafka.topics import topic_specs
from stream.settings import Settings

REFERENCE = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()


def section(title: str) -> str:
    start = REFERENCE.index(f"\n## {title}")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start : end if end > 0 else None]


def test_every_setting_is_in_the_configuration_table_with_its_default() -> None:
    table = section("Configuration")
    grouped = re.findall(r"`(FAULTSTREAM_\w+)`((?:, `_\w+`)*)", table)
    documented = {name for name, _ in grouped}
    for name, more in grouped:  # `FAULTSTREAM_TOPIC_XID`, `_ECC`, ... stand for FAULTSTREAM_TOPIC_ECC, ...
        prefix = name.rsplit("_", 1)[0]
        documented |= {prefix + suffix for suffix in re.findall(r"`(_\w+)`", more)}
    for env, _default, _doc in Settings.reference():
        assert env in documented, f"{env} is missing from docs/configuration.md's table"
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(FAULTSTREAM_\w+)` \| `([^`]*)` \|", table, re.M)}
    for env, default, _doc in Settings.reference():
        if env in rows:
            assert rows[env] in (str(ast.literal_eval(default)), default), f"{env}: the docs say {rows[env]}"


def test_every_topic_is_listed_with_its_key_and_config() -> None:
    topics = section("Configuration")
    for spec in topic_specs(Settings.from_env()):
        assert f"`{spec.name}`" in topics, f"topic {spec.name} is missing from docs/configuration.md"


def test_every_table_and_column_is_listed() -> None:
    outputs = section("Outputs")
    for statement in ddl_statements():
        match = re.match(r"CREATE TABLE IF NOT EXISTS \w+\.(\w+) \((.*?)\n\) ENGINE", statement, re.S)
        if not match:
            continue
        table, body = match.groups()
        line = next((row for row in outputs.splitlines() if row.startswith(f"- **`{table}`**")), None)
        assert line is not None, f"table {table} has no column list in docs/configuration.md"
        for column in re.findall(r"^\s+(\w+) ", body, re.M):
            assert f"`{column}`" in line, f"{table}.{column} is missing from docs/configuration.md"


def test_the_xid_catalog_table_counts_codes_by_nvidia_action_and_our_severity() -> None:
    from collections import Counter, defaultdict

    from detectors.xid_catalog import CATALOG, DEVIATIONS
    from detectors.xid_nvidia import XIDS

    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for code, info in CATALOG.items():
        rows[XIDS[code].immediate_action or "(none given)"][info.severity.value] += 1
    detection = (Path(__file__).resolve().parents[2] / "docs" / "detection.md").read_text()
    start = detection.index("\n## The XID catalog")
    table = detection[start : detection.find("\n## ", start + 1)]
    for action, counts in rows.items():
        line = f"| `{action}` | {sum(counts.values())} | {counts['info']} | {counts['warn']} | {counts['critical']} |"
        assert line in table, (
            f"docs/detection.md's XID catalog table is out of date for {action}: expected {line}"
        )
    total = Counter(info.severity.value for info in CATALOG.values())
    assert f"| **all** | {len(CATALOG)} | {total['info']} | {total['warn']} | {total['critical']} |" in table
    # Every deviation's codes are in README's deviations table.
    listed = set()
    for first, last in re.findall(r"(\d+)(?:\u2013(\d+))?", table[table.index("**Deviations") :]):
        listed |= set(range(int(first), int(last or first) + 1))
    for deviation in DEVIATIONS:
        assert set(deviation.codes) <= listed, (
            f"deviation {deviation.codes} is missing from docs/detection.md"
        )
