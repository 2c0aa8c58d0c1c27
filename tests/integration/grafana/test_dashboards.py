"""Every Grafana dashboard panel runs green against a replayed store (issue 5).

The session replays the simulated example cluster (plus three kernel-log lines that leave an open
critical incident, a dead letter and a late event, so that every panel has data to show) into an
embedded ClickHouse store through the command line, then starts one SQL runner process on it
(chdb allows one store per process; this pytest process may hold another). Each panel query is
expanded as Grafana and the ClickHouse plugin would expand it (tests/services/grafana_macros.py):
time range = the data's full span, the panel's interval computed as Grafana computes it,
variables at their real values read from the store (All, and then concrete values), one node for
the drill-down. A query that errors, or returns nothing where the store has data, fails with the
dashboard and panel in its test id. Prometheus panels may only use the metrics and labels that
stream/worker/metric_defs.py declares.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from detectors.mttf import ettr, optimal_checkpoint_interval_hours, projected_mttf_hours
from stream.settings import Settings
from stream.worker.metric_defs import exposed_series
from tests.services.chdb_sql import SqlSession
from tests.services.grafana_macros import (
    ALL,
    MacroError,
    TimeRange,
    Variable,
    expand,
    panel_interval_ms,
    round_interval_ms,
)
from tests.services.worker import cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "docker" / "grafana" / "dashboards"
EXAMPLE_LOGS = ROOT / "examples" / "sim-48x14" / "logs"
CLICKHOUSE = "grafana-clickhouse-datasource"

# Appended to the example: an XID 79 that stays open (critical, unresolved at the end of input), a
# truncated XID line (a dead letter) and an XID older than the allowed lateness (a late event).
EXTRA_KERNEL_LOG = """\
2024-01-14T23:50:00.000000+00:00 node0005 kernel: NVRM: Xid (PCI:0000:4e:00): 79, pid=4242, name=python, GPU has fallen off the bus.
2024-01-14T23:51:00.000000+00:00 node0005 kernel: NVRM: Xid (PCI:0000:4e
2024-01-14T22:00:00.000000+00:00 node0006 kernel: NVRM: Xid (PCI:0000:07:00): 48, pid=4243, name=python, An uncorrectable double bit error (DBE) has been detected on GPU.
"""

# Every (table, time column) a panel filters on: the time range spans all of them.
TIME_COLUMNS = (
    ("xid_events", "ts"), ("job_events", "ts"), ("ecc_samples", "ts"), ("incidents", "first_evidence"),
    ("incidents", "last_evidence"), ("job_attributions", "end"), ("mttf_partials", "window_start"),
    ("dead_letters", "recorded_at"),
)  # fmt: skip


# -- the dashboards, read at collection time ---------------------------------------------------


def _load() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


BOARDS = _load()


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def _is_clickhouse(ds: Any) -> bool:
    return isinstance(ds, dict) and ds.get("type") == CLICKHOUSE


def _sql_targets() -> list[Any]:
    params = []
    for name, board in BOARDS.items():
        for panel in _panels(board):
            for target in panel.get("targets", []):
                if _is_clickhouse(target.get("datasource") or panel.get("datasource")):
                    ident = f"{name}/{panel['title']}/{target.get('refId')}"
                    params.append(pytest.param(name, panel, target, id=ident))
    return params


def _prometheus_targets() -> list[Any]:
    params = []
    for name, board in BOARDS.items():
        for panel in _panels(board):
            for target in panel.get("targets", []):
                ds = target.get("datasource") or panel.get("datasource")
                if isinstance(ds, dict) and ds.get("type") == "prometheus":
                    ident = f"{name}/{panel['title']}/{target.get('refId')}"
                    params.append(pytest.param(name, panel, target, id=ident))
    return params


def _query_variables() -> list[Any]:
    return [
        pytest.param(name, var, id=f"{name}/${var['name']}")
        for name, board in BOARDS.items()
        for var in board["templating"]["list"]
        if var["type"] == "query"
    ]


def _variable_sql(var: dict[str, Any]) -> str:
    query = var["query"]
    return query if isinstance(query, str) else query["rawSql"]


# -- the store and the SQL runner ----------------------------------------------------------------


@pytest.fixture(scope="session")
def sql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlSession]:
    """One SQL runner on a store holding the replayed example and the extra kernel lines."""
    work = tmp_path_factory.mktemp("grafana")
    store = work / "store"
    extra = work / "extra"
    extra.mkdir()
    (extra / "kernel-extra.log").write_text(EXTRA_KERNEL_LOG)
    # --cluster: the example's kernel and DCGM lines name no cluster, its sacct rows say "sim".
    for source in (EXAMPLE_LOGS, extra):
        cli({}, "replay", str(source), "--cluster", "sim", "--clickhouse", f"chdb://{store}", "--no-progress")
    session = SqlSession(store)
    try:
        yield session
    finally:
        session.close()


def _rows(sql: SqlSession, query: str) -> list[list[Any]]:
    answer = sql.run(query)
    assert "error" not in answer, f"{answer['error']}\n{query}"
    rows: list[list[Any]] = answer["rows"]
    return rows


@pytest.fixture(scope="session")
def time_range(sql: SqlSession) -> TimeRange:
    """The data's full span over every time column a panel filters on (whole seconds, inclusive)."""
    parts = " UNION ALL ".join(
        f"SELECT toUnixTimestamp64Milli(min(`{col}`)) AS lo, toUnixTimestamp64Milli(max(`{col}`)) AS hi "
        f"FROM faultstream.{table}"
        for table, col in TIME_COLUMNS
    )
    [[lo, hi]] = _rows(sql, f"SELECT min(lo), max(hi) FROM ({parts})")
    return TimeRange(lo // 1000 * 1000, -(-hi // 1000) * 1000)


@pytest.fixture(scope="session")
def data(sql: SqlSession) -> dict[str, int]:
    """What some panels show only when it exists: the test data must have it, so that an empty
    panel means a wrong query, not missing data."""
    [[open_critical, lemons, letters, late, hardware_failures]] = _rows(
        sql,
        """SELECT
            (SELECT countIf(severity = 'critical' AND status != 'resolved') FROM faultstream.incidents FINAL),
            (SELECT countIf(kind = 'lemon_node' AND status != 'resolved') FROM faultstream.incidents FINAL),
            (SELECT count() FROM faultstream.dead_letters FINAL),
            (SELECT countIf(startsWith(reason, 'late event')) FROM faultstream.dead_letters FINAL),
            (SELECT countIf(hardware) FROM faultstream.job_attributions FINAL)""",
    )
    found = {
        "open_critical": open_critical,
        "lemons": lemons,
        "dead_letters": letters,
        "late": late,
        "hardware_failures": hardware_failures,
    }
    assert all(found.values()), f"the test store lacks data some panels show: {found}"
    return found


# -- variables -------------------------------------------------------------------------------------


def _options(
    sql: SqlSession, var: dict[str, Any], time_range: TimeRange, known: dict[str, Variable]
) -> tuple[str, ...]:
    """A query variable's values, its SQL expanded like a full-width panel's."""
    query = expand(_variable_sql(var), time_range, panel_interval_ms({}, time_range), known)
    rows = _rows(sql, query)
    # The plugin's metricFindQuery: one column is the value; with two, the first is the value and
    # the second the text shown.
    return tuple(str(row[0]) for row in rows)


def resolve_variables(
    sql: SqlSession, board: dict[str, Any], time_range: TimeRange, *, concrete: bool
) -> dict[str, Variable]:
    """Every SQL-visible variable of a board in order (later ones may use earlier ones): query
    variables with "include All" at All (or, ``concrete``, at their first two values), others at
    their first value; textboxes at their default."""
    variables: dict[str, Variable] = {}
    for var in board["templating"]["list"]:
        name = var["name"]
        if var["type"] == "query":
            options = _options(sql, var, time_range, variables)
            assert options, f"variable ${name} has no values in the store"
            if var.get("includeAll") and not concrete:
                variables[name] = Variable(name, ALL, options)
            elif var.get("multi"):
                variables[name] = Variable(name, options[:2], options)
            else:
                variables[name] = Variable(name, options[0], options)
        elif var["type"] in ("textbox", "constant", "custom"):
            value = str(var.get("query", "")).split(",")[0].strip()
            variables[name] = Variable(name, value, (value,))
    return variables


@pytest.fixture(scope="session")
def board_variables(
    sql: SqlSession, time_range: TimeRange, data: dict[str, int]
) -> dict[tuple[str, bool], dict[str, Variable]]:
    return {
        (name, concrete): resolve_variables(sql, board, time_range, concrete=concrete)
        for name, board in BOARDS.items()
        for concrete in (False, True)
    }


# -- structure -----------------------------------------------------------------------------------


def test_there_are_the_four_dashboards() -> None:
    titles = sorted(board["title"] for board in BOARDS.values())
    assert titles == [
        "faultstream / Fleet overview",
        "faultstream / Lemon nodes and node drill-down",
        "faultstream / Pipeline health",
        "faultstream / Reliability",
    ]


def test_uids_and_titles_are_unique() -> None:
    uids = [board["uid"] for board in BOARDS.values()]
    titles = [board["title"] for board in BOARDS.values()]
    assert all(uids) and len(set(uids)) == len(uids), uids
    assert len(set(titles)) == len(titles), titles
    assert all(board.get("id") is None for board in BOARDS.values()), "provisioned dashboards carry no id"


def _datasource_refs(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield f"{path}/{key}", value
            yield from _datasource_refs(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _datasource_refs(value, f"{path}[{index}]")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_datasources_come_from_variables(name: str) -> None:
    board = BOARDS[name]
    variables = {var["name"]: var for var in board["templating"]["list"]}
    ds = variables.get("datasource")
    assert ds is not None and ds["type"] == "datasource" and ds["query"] == CLICKHOUSE, ds
    allowed = {CLICKHOUSE: "${datasource}", "prometheus": "${prometheus}"}
    for where, ref in _datasource_refs(board):
        if isinstance(ref, dict) and ref.get("type") == "grafana":
            continue  # Grafana's built-in annotations
        assert isinstance(ref, dict), f"{where}: a datasource must be {{type, uid}}, got {ref!r}"
        assert ref.get("uid") == allowed.get(ref.get("type")), f"{where}: hard-coded datasource {ref}"
        if ref["type"] == "prometheus":
            prom = variables.get("prometheus")
            assert prom is not None and prom["type"] == "datasource" and prom["query"] == "prometheus"
    ids = [panel["id"] for panel in _panels(board)]
    assert len(set(ids)) == len(ids), f"duplicate panel ids in {name}"


@pytest.mark.parametrize(("name", "panel", "target"), _sql_targets())
def test_sql_targets_use_the_plugin_query_model(
    name: str, panel: dict[str, Any], target: dict[str, Any]
) -> None:
    assert target["editorType"] == "sql" and target["rawSql"].strip()
    assert (
        target["format"] in (0, 1) and target["queryType"] == {0: "timeseries", 1: "table"}[target["format"]]
    )
    major = int(str(target["pluginVersion"]).split(".")[0])
    assert major >= 4, "a pluginVersion below 4 makes the plugin migrate the query as a v3 one"
    if panel["type"] in ("timeseries", "status-history"):
        assert target["format"] == 0, "time series panels read the time-series format"


# -- the SQL of every variable and panel -------------------------------------------------------------


@pytest.mark.parametrize(("name", "var"), _query_variables())
def test_variable_query_returns_values(
    name: str, var: dict[str, Any], board_variables: dict[tuple[str, bool], dict[str, Variable]]
) -> None:
    assert _is_clickhouse(var.get("datasource")), f"${var['name']} must query ${{datasource}}"
    assert board_variables[(name, False)][var["name"]].options


def _check(answer: dict[str, Any], query: str, target: dict[str, Any], *, need_rows: bool) -> None:
    assert "error" not in answer, f"ClickHouse refused the panel's SQL: {answer['error']}\n--\n{query}"
    rows = answer["rows"]
    if not need_rows:
        return
    assert rows, f"the panel shows nothing although the store has data\n--\n{query}"
    assert any(v is not None and v != "nan" for row in rows for v in row), f"only NULLs\n--\n{query}"
    if target["format"] == 0:
        times = [i for i, t in enumerate(answer["types"]) if t.startswith(("DateTime", "Nullable(DateTime"))]
        assert times, f"a time series needs a DateTime column, got {answer['types']}\n--\n{query}"
        column = [row[times[0]] for row in rows]
        assert column == sorted(column), f"a time series must be sorted by time\n--\n{query}"


@pytest.mark.parametrize(("name", "panel", "target"), _sql_targets())
def test_panel_sql_runs_and_shows_data(
    name: str,
    panel: dict[str, Any],
    target: dict[str, Any],
    sql: SqlSession,
    time_range: TimeRange,
    board_variables: dict[tuple[str, bool], dict[str, Variable]],
) -> None:
    interval = panel_interval_ms(panel, time_range)
    everything = expand(target["rawSql"], time_range, interval, board_variables[(name, False)])
    _check(sql.run(everything), everything, target, need_rows=True)
    # Concrete values: the conditions $__conditionalAll keeps must be valid SQL too.
    concrete = expand(target["rawSql"], time_range, interval, board_variables[(name, True)])
    _check(sql.run(concrete), concrete, target, need_rows=False)


def test_every_dashboard_has_sql_panels() -> None:
    names = {param.values[0] for param in _sql_targets()}
    assert names == set(BOARDS)


# -- the ETTR guidance is the model of detectors/mttf.py --------------------------------------------


def _panel(board_name: str, title: str) -> dict[str, Any]:
    [panel] = [p for p in _panels(BOARDS[board_name]) if p["title"] == title]
    return panel


def test_ettr_defaults_match_the_settings() -> None:
    settings = Settings()
    variables = {v["name"]: v["query"] for v in BOARDS["reliability.json"]["templating"]["list"]}
    assert float(variables["w_cp_minutes"]) == settings.checkpoint_write_minutes
    assert float(variables["u0_minutes"]) == settings.restart_overhead_minutes
    assert int(variables["gpus_per_node"]) == settings.gpus_per_node


def test_ettr_guidance_matches_detectors_mttf(
    sql: SqlSession, time_range: TimeRange, board_variables: dict[tuple[str, bool], dict[str, Variable]]
) -> None:
    panel = _panel("reliability.json", "ETTR guidance from the measured r_f")
    variables = board_variables[("reliability.json", False)]
    query = expand(panel["targets"][0]["rawSql"], time_range, panel_interval_ms(panel, time_range), variables)
    answer = sql.run(query)
    assert "error" not in answer, answer
    rows = [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]
    assert [r["job GPUs"] for r in rows] == list(Settings().reference_sizes)
    w_cp = float(variables["w_cp_minutes"].values()[0]) / 60
    u0 = float(variables["u0_minutes"].values()[0]) / 60
    per_node = int(variables["gpus_per_node"].values()[0])
    for row in rows:
        rf = row["r_f per 1000 node-days"] / 1000
        gpus = row["job GPUs"]
        interval = optimal_checkpoint_interval_hours(gpus, rf, w_cp, per_node)
        assert math.isclose(row["best checkpoint interval (min)"], interval * 60, rel_tol=1e-9)
        assert math.isclose(row["projected MTTF (h)"], projected_mttf_hours(gpus, rf, per_node), rel_tol=1e-9)
        assert math.isclose(
            row["expected ETTR"], ettr(gpus, rf, interval, w_cp, u0, per_node), rel_tol=1e-9, abs_tol=1e-12
        )


# -- Prometheus panels use the worker's metrics -------------------------------------------------------

_PROM_FUNCTIONS = {
    "abs", "absent", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp_max", "clamp_min",
    "count", "count_over_time", "delta", "deriv", "floor", "group", "histogram_quantile", "idelta",
    "increase", "irate", "label_replace", "last_over_time", "max", "max_over_time", "min",
    "min_over_time", "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "stddev", "sum", "sum_over_time", "time", "topk", "vector",
}  # fmt: skip
_PROM_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
_SCRAPE_LABELS = {"instance", "job"}


def defined_metrics() -> dict[str, set[str]]:
    """Exposed series names of the worker's metrics and their labels (stream/worker/metric_defs.py)."""
    return exposed_series()


def check_promql(expr: str, metrics: dict[str, set[str]]) -> list[str]:
    """Problems of a PromQL expression: unknown metrics, functions or labels (empty: none)."""
    problems: list[str] = []
    text = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables ($__rate_interval …)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    used: set[str] = set()
    grouping_labels: set[str] = set()

    def selector(match: re.Match[str]) -> str:
        metric, matchers = match.group(1), match.group(2)
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            if metric in metrics and label not in metrics[metric] | _SCRAPE_LABELS:
                problems.append(f"{metric} has no label {label!r}")
        return metric

    text = re.sub(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", selector, text)

    def grouping(match: re.Match[str]) -> str:
        grouping_labels.update(label.strip() for label in match.group(2).split(",") if label.strip())
        return " "

    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", grouping, text)
    for match in re.finditer(r"[a-zA-Z_:][\w:]*", text):
        word = match.group(0)
        follows = text[match.end() :].lstrip()[:1]
        if follows == "(":
            if word not in _PROM_FUNCTIONS:
                problems.append(f"unknown function {word}")
        elif word in _PROM_KEYWORDS or re.fullmatch(r"\d+(\.\d+)?|e\d+", word):
            continue
        elif word in metrics:
            used.add(word)
        else:
            problems.append(
                f"unknown metric {word} (stream/worker/metric_defs.py declares {sorted(metrics)})"
            )
    if not used:
        problems.append("the expression reads no faultstream metric")
    known_labels = set().union(*(metrics[m] for m in used)) | _SCRAPE_LABELS if used else set()
    problems += [f"no metric in it has label {label!r}" for label in sorted(grouping_labels - known_labels)]
    return problems


def test_promql_checker_catches_typos() -> None:
    metrics = defined_metrics()
    assert "faultstream_events_in_total" in metrics and "faultstream_sink_flush_seconds_bucket" in metrics
    assert metrics["faultstream_consumer_lag"] == {"topic", "partition"}
    assert check_promql("sum by (topic) (rate(faultstream_events_in_total[$__rate_interval]))", metrics) == []
    assert check_promql("rate(faultstream_events_total[5m])", metrics)
    assert check_promql("sum by (tpoic) (faultstream_consumer_lag)", metrics)
    assert check_promql('faultstream_consumer_lag{topc="x"}', metrics)
    assert check_promql("rte(faultstream_events_in_total[5m])", metrics)


@pytest.mark.parametrize(("name", "panel", "target"), _prometheus_targets())
def test_prometheus_panels_use_defined_metrics(
    name: str, panel: dict[str, Any], target: dict[str, Any]
) -> None:
    assert check_promql(target["expr"], defined_metrics()) == []


def test_pipeline_health_reads_the_worker_metrics() -> None:
    used = {
        word
        for param in _prometheus_targets()
        for word in re.findall(r"faultstream_\w+", param.values[2]["expr"])
    }
    for required in (
        "faultstream_sink_flush_seconds_bucket",
        "faultstream_consumer_lag",
        "faultstream_events_in_total",
        "faultstream_dead_letters_total",
    ):
        assert required in used


# -- the expander itself ------------------------------------------------------------------------------

RANGE = TimeRange(1_704_067_200_000, 1_705_276_800_000)


def test_conditional_all_follows_the_plugin() -> None:
    cond = "$__conditionalAll(node IN (${node:singlequote}), $node)"
    all_nodes = {"node": Variable("node", ALL, ("a", "b"))}
    some = {"node": Variable("node", ("a", "b"), ("a", "b", "c"))}
    assert expand(f"WHERE {cond}", RANGE, 1000, all_nodes) == "WHERE 1=1"
    assert expand(f"WHERE {cond}", RANGE, 1000, some) == "WHERE node IN ('a','b')"
    with pytest.raises(MacroError, match="must be \\$name"):
        expand("WHERE $__conditionalAll(x IN (${node:singlequote}), ${node})", RANGE, 1000, all_nodes)
    with pytest.raises(MacroError, match="takes \\(condition"):
        expand("WHERE $__conditionalAll(a, b, $node)", RANGE, 1000, all_nodes)


def test_variables_and_formats() -> None:
    v = {"n": Variable("n", "it's"), "m": Variable("m", ("x", "y"))}
    assert (
        expand("${n:sqlstring} ${n:singlequote} $m ${m:csv}", RANGE, 1000, v)
        == "'it''s' 'it\\'s' 'x','y' x,y"
    )
    with pytest.raises(MacroError, match="unknown variable"):
        expand("WHERE node = $nod", RANGE, 1000, v)
    with pytest.raises(MacroError, match="unsupported variable format"):
        expand("${n:percentencode}", RANGE, 1000, v)


def test_backend_macros() -> None:
    assert expand("$__fromTime $__toTime_ms $__interval_s", RANGE, 3_600_000, {}) == (
        "toDateTime(1704067200) fromUnixTimestamp64Milli(1705276800000) 3600"
    )
    assert expand("$__timeInterval_ms(ts)", RANGE, 500, {}) == (
        "toStartOfInterval(toDateTime64(ts, 3), INTERVAL 500 millisecond)"
    )
    assert expand("$__dt(d, t)", RANGE, 1000, {}).startswith(
        "(d >= toDate('2024-01-01') AND d <= toDate('2024-01-15'))"
    )
    for bad in (
        "$__timeFilter",
        "$__timeFilter(a, b)",
        "$__timeFilter(toDateTime(ts))",
        "$__timefilter(ts)",
        "$__interval_sec",
    ):
        with pytest.raises(MacroError):
            expand(bad, RANGE, 1000, {})


def test_intervals_follow_grafana() -> None:
    two_weeks = RANGE
    assert panel_interval_ms({"gridPos": {"w": 24}}, two_weeks) == 600_000  # 14 d / 1920 px = 10.5 min
    assert panel_interval_ms({"gridPos": {"w": 12}}, two_weeks) == 1_200_000
    assert panel_interval_ms({"maxDataPoints": 60, "gridPos": {"w": 12}}, two_weeks) == 21_600_000
    assert panel_interval_ms({"gridPos": {"w": 24}, "interval": "1h"}, two_weeks) == 3_600_000
    assert round_interval_ms(5) == 1 and round_interval_ms(86_400_000) == 86_400_000
