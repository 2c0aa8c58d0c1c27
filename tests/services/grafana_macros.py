"""Expand a Grafana ClickHouse panel's SQL the way Grafana and the ClickHouse plugin (v4) do.

What happens to a panel's ``rawSql`` before ClickHouse sees it, in order:

1. the plugin's frontend replaces ``$__conditionalAll(condition, $var)`` by ``1=1`` when ``var``
   selects All (or nothing), else by the condition (``applyConditionalAll`` in the plugin's
   ``CHDatasource.ts``: arguments split at top-level commas, the variable named ``$var``);
2. Grafana's template service replaces dashboard variables (``$var``, ``${var}``,
   ``${var:format}``, ``[[var]]``) and its global ones (``$__interval``, ``$__from`` …);
   the plugin formats a multi-value variable without a format as ``'a','b'``;
3. the plugin's backend (``pkg/macros/macros.go``, through grafana/sqlds) expands its macros:
   ``$__timeFilter(col)``, ``$__timeFilter_ms(col)``, ``$__dateFilter(col)``,
   ``$__dateTimeFilter(d, t)`` / ``$__dt(d, t)``, ``$__timeInterval(col)``,
   ``$__timeInterval_ms(col)``, ``$__interval_s``, ``$__fromTime``, ``$__toTime``,
   ``$__fromTime_ms``, ``$__toTime_ms``.

Anything else that looks like a macro or a variable is an error here (a typo must not pass),
and so is a macro argument with nested parentheses (older sqlds releases cut arguments at the
first closing parenthesis). The panel interval follows Grafana's ``calculateInterval``: the
time range over the panel's ``maxDataPoints`` (else its width in pixels), rounded by
``roundInterval``, never below the panel's minimum ``interval``.

>>> rng = TimeRange(1_704_067_200_000, 1_705_276_800_000)  # 2024-01-01 .. 2024-01-15
>>> v = {"cluster": Variable("cluster", ALL, ("a", "b"))}
>>> expand("SELECT 1 WHERE $__timeFilter(ts) AND $__conditionalAll(c IN (${cluster:singlequote}), $cluster)",
...        rng, 3_600_000, v)
'SELECT 1 WHERE ts >= toDateTime(1704067200) AND ts <= toDateTime(1705276800) AND 1=1'
>>> expand("SELECT $__timeInterval(ts) t", rng, 3_600_000, {})
'SELECT toStartOfInterval(toDateTime(ts), INTERVAL 3600 second) t'
>>> try:
...     expand("SELECT $__timeFiltr(ts)", rng, 1000, {})
... except MacroError as exc:
...     print(exc)
unknown macro $__timeFiltr
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "ALL",
    "BACKEND_MACROS",
    "MacroError",
    "TimeRange",
    "Variable",
    "expand",
    "panel_interval_ms",
    "round_interval_ms",
]

#: The value Grafana stores for a variable set to "All".
ALL = "$__all"

#: The plugin backend's macros and how many arguments each takes (None: used without parentheses).
BACKEND_MACROS: dict[str, int | None] = {
    "timeFilter": 1,
    "timeFilter_ms": 1,
    "dateFilter": 1,
    "dateTimeFilter": 2,
    "dt": 2,
    "timeInterval": 1,
    "timeInterval_ms": 1,
    "interval_s": None,
    "fromTime": None,
    "toTime": None,
    "fromTime_ms": None,
    "toTime_ms": None,
}

#: Grafana's global variables that a SQL panel may use (substituted by the template service).
GRAFANA_GLOBALS = ("__interval", "__interval_ms", "__from", "__to", "__range", "__range_s", "__range_ms")

#: Pixels per grid column assumed for a panel's width (a 1920-px wide dashboard of 24 columns).
PX_PER_GRID_COLUMN = 80


class MacroError(ValueError):
    """The SQL uses a macro, variable or format that Grafana or the plugin would not expand."""


@dataclass(frozen=True, slots=True)
class TimeRange:
    """A dashboard time range, epoch milliseconds."""

    from_ms: int
    to_ms: int


@dataclass(frozen=True, slots=True)
class Variable:
    """A dashboard variable's current value: ``ALL``, one value, or several (multi-value)."""

    name: str
    value: str | tuple[str, ...]
    options: tuple[str, ...] = ()  # every value the variable offers (what All stands for)

    def values(self) -> list[str]:
        if self.value == ALL:
            return list(self.options)
        return [self.value] if isinstance(self.value, str) else list(self.value)

    def is_all(self) -> bool:
        """What ``applyConditionalAll`` tests: the value as a string is ``$__all`` or empty."""
        text = self.value if isinstance(self.value, str) else ",".join(self.value)
        return text in (ALL, "")


def round_interval_ms(interval: float) -> int:
    """Grafana's ``roundInterval`` (``rangeutil.ts``)."""
    steps = (
        (10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
        (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000),
        (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000),
        (1500000, 1200000), (2700000, 1800000), (5400000, 3600000), (9000000, 7200000),
        (16200000, 10800000), (32400000, 21600000), (86400000, 43200000), (604800000, 86400000),
        (1814400000, 604800000), (3628800000, 2592000000),
    )  # fmt: skip
    for bound, rounded in steps:
        if interval < bound:
            return rounded
    return 31536000000


_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}


def _interval_to_ms(text: str) -> int:
    match = re.fullmatch(r"\s*>?\s*(\d+)\s*(ms|s|m|h|d|w|y)\s*", text)
    if not match:
        raise MacroError(f"cannot read the panel interval {text!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def panel_interval_ms(panel: Mapping[str, object], time_range: TimeRange) -> int:
    """The interval Grafana gives a panel's queries (``calculateInterval``)."""
    resolution = panel.get("maxDataPoints")
    if not resolution:
        grid = panel.get("gridPos") or {}
        width = grid.get("w", 24) if isinstance(grid, Mapping) else 24
        resolution = int(width) * PX_PER_GRID_COLUMN
    interval = round_interval_ms((time_range.to_ms - time_range.from_ms) / float(resolution))  # type: ignore[arg-type]
    low = panel.get("interval")
    if isinstance(low, str) and low:
        interval = max(interval, _interval_to_ms(low))
    return interval


# -- 1. $__conditionalAll (plugin frontend) ---------------------------------------------------

_CONDITIONAL_ALL = "$__conditionalAll("


def _macro_args(sql: str, open_paren: int) -> tuple[list[str], int]:
    """The plugin's ``getMacroArgs``: split at commas at bracket depth 1; also the end index."""
    depth = 0
    args: list[str] = []
    start = open_paren + 1
    for index in range(open_paren, len(sql)):
        char = sql[index]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 1:
            args.append(sql[start:index])
            start = index + 1
        if depth == 0:
            args.append(sql[start:index])
            return args, index + 1
    raise MacroError(f"unbalanced parentheses after {sql[open_paren - 17 : open_paren + 1]!r}")


def _apply_conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    index = sql.rfind(_CONDITIONAL_ALL)
    while index != -1:
        args, end = _macro_args(sql, index + len(_CONDITIONAL_ALL) - 1)
        if len(args) != 2:
            raise MacroError(f"$__conditionalAll takes (condition, $variable), got {len(args)} arguments")
        name = args[1].strip()
        # The plugin looks the variable up by the text after '$': `${var}` would never match and
        # the condition would silently apply even for All.
        if not re.fullmatch(r"\$\w+", name):
            raise MacroError(f"$__conditionalAll's second argument must be $name, got {name!r}")
        variable = variables.get(name[1:])
        if variable is None:
            raise MacroError(f"$__conditionalAll names an unknown variable {name}")
        phrase = "1=1" if variable.is_all() else args[0]
        sql = sql[:index] + phrase + sql[end:]
        index = sql.rfind(_CONDITIONAL_ALL)
    return sql


# -- 2. template variables (Grafana) -----------------------------------------------------------

# Grafana's variable regex (templateSrv): $var, [[var:fmt]], ${var.path:fmt}
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")


def _quote(value: str, escaped: str) -> str:
    return "'" + value.replace("'", escaped) + "'"


def _format(values: Sequence[str], multi: bool, fmt: str | None) -> str:
    if fmt is None:  # the plugin's own formatter
        return ",".join(_quote(v, "'") for v in values) if multi else values[0]
    if fmt == "singlequote":
        return ",".join(_quote(v, "\\'") for v in values)
    if fmt == "sqlstring":
        return ",".join(_quote(v, "''") for v in values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    if fmt in ("csv", "raw", "text"):
        return ",".join(values)
    raise MacroError(f"unsupported variable format {fmt!r}")


def _globals(time_range: TimeRange, interval_ms: int) -> dict[str, str]:
    span = time_range.to_ms - time_range.from_ms
    interval = f"{interval_ms}ms"
    for unit in ("y", "w", "d", "h", "m", "s"):
        if interval_ms % _UNITS_MS[unit] == 0:
            interval = f"{interval_ms // _UNITS_MS[unit]}{unit}"
            break
    return {
        "__interval": interval,
        "__interval_ms": str(interval_ms),
        "__from": str(time_range.from_ms),
        "__to": str(time_range.to_ms),
        "__range": f"{span // 1000}s",
        "__range_s": str(span // 1000),
        "__range_ms": str(span),
    }


def _apply_variables(
    sql: str, time_range: TimeRange, interval_ms: int, variables: Mapping[str, Variable]
) -> str:
    grafana = _globals(time_range, interval_ms)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(4)
        fmt = match.group(3) or match.group(6)
        if match.group(5):
            raise MacroError(f"variable field paths are not supported: {match.group(0)}")
        if name in grafana:
            return grafana[name]
        if name.startswith("__"):
            if match.group(1) is None:
                raise MacroError(f"unknown Grafana variable {match.group(0)}")
            return match.group(0)  # a plugin macro: expanded by the backend, next
        variable = variables.get(name)
        if variable is None:
            raise MacroError(f"unknown variable {match.group(0)}")
        values = variable.values()
        if not values:
            raise MacroError(f"variable {name} has no value")
        return _format(values, not isinstance(variable.value, str) or variable.value == ALL, fmt)

    return _VARIABLE.sub(replace, sql)


# -- 3. backend macros (plugin, through sqlds) ------------------------------------------------

_MACRO = re.compile(r"\$__(\w+)")


def _backend_macro(name: str, args: list[str], time_range: TimeRange, interval_ms: int) -> str:
    from_s, to_s = time_range.from_ms // 1000, time_range.to_ms // 1000
    seconds = max(interval_ms // 1000, 1)

    def date(ms: int) -> str:
        return "toDate('" + datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d") + "')"

    if name == "timeFilter":
        return f"{args[0]} >= toDateTime({from_s}) AND {args[0]} <= toDateTime({to_s})"
    if name == "timeFilter_ms":
        return (
            f"{args[0]} >= fromUnixTimestamp64Milli({time_range.from_ms}) AND "
            f"{args[0]} <= fromUnixTimestamp64Milli({time_range.to_ms})"
        )
    if name == "dateFilter":
        return f"{args[0]} >= {date(time_range.from_ms)} AND {args[0]} <= {date(time_range.to_ms)}"
    if name in ("dateTimeFilter", "dt"):
        return (
            f"({args[0]} >= {date(time_range.from_ms)} AND {args[0]} <= {date(time_range.to_ms)}) AND "
            f"({args[1]} >= toDateTime({from_s}) AND {args[1]} <= toDateTime({to_s}))"
        )
    if name == "timeInterval":
        return f"toStartOfInterval(toDateTime({args[0]}), INTERVAL {seconds} second)"
    if name == "timeInterval_ms":
        return f"toStartOfInterval(toDateTime64({args[0]}, 3), INTERVAL {max(interval_ms, 1)} millisecond)"
    if name == "interval_s":
        return str(seconds)
    if name == "fromTime":
        return f"toDateTime({from_s})"
    if name == "toTime":
        return f"toDateTime({to_s})"
    if name == "fromTime_ms":
        return f"fromUnixTimestamp64Milli({time_range.from_ms})"
    if name == "toTime_ms":
        return f"fromUnixTimestamp64Milli({time_range.to_ms})"
    raise AssertionError(name)


def _apply_backend_macros(sql: str, time_range: TimeRange, interval_ms: int) -> str:
    out: list[str] = []
    position = 0
    for match in _MACRO.finditer(sql):
        if match.start() < position:
            continue
        name = match.group(1)
        if name not in BACKEND_MACROS:
            raise MacroError(f"unknown macro $__{name}")
        arity = BACKEND_MACROS[name]
        end = match.end()
        args: list[str] = []
        if arity is not None:
            if end >= len(sql) or sql[end] != "(":
                raise MacroError(f"$__{name} needs {arity} argument(s) in parentheses")
            close = sql.find(")", end)
            if close == -1:
                raise MacroError(f"$__{name}( is not closed")
            inner = sql[end + 1 : close]
            if "(" in inner:
                raise MacroError(
                    f"$__{name}: nested parentheses in macro arguments are not portable: {inner!r}"
                )
            args = [arg.strip() for arg in inner.split(",")]
            if len(args) != arity or not all(args):
                raise MacroError(f"$__{name} takes {arity} argument(s), got {inner!r}")
            end = close + 1
        out.append(sql[position : match.start()])
        out.append(_backend_macro(name, args, time_range, interval_ms))
        position = end
    out.append(sql[position:])
    return "".join(out)


def expand(sql: str, time_range: TimeRange, interval_ms: int, variables: Mapping[str, Variable]) -> str:
    """The SQL ClickHouse receives for a panel query, or :class:`MacroError`."""
    sql = _apply_conditional_all(sql, variables)
    sql = _apply_variables(sql, time_range, interval_ms, variables)
    sql = _apply_backend_macros(sql, time_range, interval_ms)
    leftover = re.search(r"\$\{?\w*|\[\[", sql)
    if leftover:
        raise MacroError(f"unexpanded {leftover.group(0)!r} left in the SQL")
    return sql
