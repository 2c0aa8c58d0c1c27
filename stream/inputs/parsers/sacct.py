"""Slurm ``sacct -P`` output -> :class:`~schemas.records.JobEvent`.

The header line names the columns, in any order and any case. The job id column is ``JobID``,
or ``JobIDRaw`` when there is no ``JobID`` (array jobs then appear by their raw ids); it, ``State``,
``Start`` and ``End`` are required. A header without ``Start`` or ``End`` (``sacct -P`` with its
default ``--format``) is ONE dead letter, at the header, naming the columns to add and the command
line to run; the rows of that table are not read (every job would lack its times). The others are
used when present: ``Submit``, ``NodeList``, ``NNodes``,
``AllocTRES``, ``ReqTRES``, ``AllocGRES``, ``ReqGRES``, ``ExitCode``, ``JobName``, ``User``,
``Partition`` (absent, the events have none), ``Cluster``. The delimiter is ``|`` or ``|#``
(``sacct -P --delimiter='|#'``), read from the header.
A column named twice uses its first occurrence. A line equal in shape to a header (every field a
column name, with JobID and State) starts a new table, so concatenated ``sacct`` runs are read.

A field may contain a line break: a record then continues on the next physical line until it
has as many fields as the header. A record that cannot be completed that way (the next line
would overshoot the field count, or the file ends) is a dead letter, and the line that
overshot is read afresh.

Events per job row:

* ``PENDING``: one PENDING event at ``Submit`` (none when Submit is unknown).
* ``RUNNING`` (and ``SUSPENDED``, ``RESIZING``): one RUNNING event at ``Start``.
* a terminal state: RUNNING at ``Start`` when the job started, then the terminal state at ``End``.
  ``CANCELLED by 123`` is CANCELLED; ``BOOT_FAIL`` maps to NODE_FAIL, ``DEADLINE`` to TIMEOUT,
  ``REVOKED`` to CANCELLED, ``REQUEUE_FED``/``REQUEUE_HOLD``/``SPECIAL_EXIT`` to REQUEUED.

Steps (``123.batch``, ``123.extern``, ``123.0``, ``8012944_24093.0``: a JobID with a dot) are
skipped: their job's own row describes the allocation. Each ``(job_id, state, ts)`` is emitted
once per file, because sacct repeats rows (``-D`` duplicates, overlapping queries).

Times are naive local times in ``options.timezone`` (an explicit offset is honoured, all digits
are read as epoch seconds); ``Unknown``, ``None`` and empty mean "no time".

``gpus`` is read from ``gres/gpu=N`` in AllocTRES, else ``gpu:N`` in AllocGRES, else ReqTRES,
else ReqGRES (``PER_NODE:gpu:8`` is multiplied by NNodes), else ``NNodes x gpus_per_node``.
Invalid UTF-8 is replaced with U+FFFD: a sacct row stays usable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Final
from zoneinfo import ZoneInfo

from schemas.records import InvalidRecord, JobEvent, JobState
from stream.inputs.parsers.hostlist import expand_hostlist
from stream.inputs.parsers.options import ParseOptions, invalid, strip_eol

__all__ = ["SACCT_COMMAND", "gpus_of_tres", "parse_sacct", "parse_sacct_state", "read_sacct_header"]

_STATES: Final[dict[str, JobState]] = {
    **{state.value: state for state in JobState},
    "BOOT_FAIL": JobState.NODE_FAIL,
    "DEADLINE": JobState.TIMEOUT,
    "REVOKED": JobState.CANCELLED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.REQUEUED,
    "SUSPENDED": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
}
_NO_TIME: Final = frozenset({"", "unknown", "none", "n/a"})
_HEADER_NAME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_HEADER_HINT_RE: Final = re.compile(rb"(?i)(?:^|\|)#?jobid(?:raw)?(?:\||$)")
_TRES_GPU_RE: Final = re.compile(r"(?:^|,)gres/gpu=(\d+)(?=,|$)")
_TRES_GPU_TYPED_RE: Final = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)(?=,|$)")
_GRES_GPU_RE: Final = re.compile(r"(?:^|,)(PER_NODE:)?gpu(?::[^:,(]+)?:(\d+)")

_COLUMNS: Final = (
    "jobid",
    "jobidraw",
    "state",
    "start",
    "end",
    "submit",
    "nodelist",
    "nnodes",
    "alloctres",
    "reqtres",
    "allocgres",
    "reqgres",
    "exitcode",
    "jobname",
    "user",
    "partition",
    "cluster",
)


def parse_sacct_state(text: str) -> JobState:
    """Return the :class:`JobState` of a sacct ``State`` value.

    Raises
    ------
    ValueError
        For a state faultstream does not know.

    >>> parse_sacct_state("CANCELLED by 1185200069")
    <JobState.CANCELLED: 'CANCELLED'>
    """
    name = text.strip().split(" ", 1)[0].rstrip("+").upper()
    state = _STATES.get(name)
    if state is None:
        raise ValueError(f"unknown job state {text.strip()!r}")
    return state


class _Header:
    """Column positions of one sacct table."""

    __slots__ = ("delim", "delim_bytes", "index", "width")

    def __init__(self, delim: str, names: list[str]) -> None:
        self.delim = delim
        self.delim_bytes = delim.encode()
        self.width = len(names)
        index: dict[str, int] = {}
        for position, name in enumerate(names):
            index.setdefault(name.strip().lower(), position)
        self.index = {name: index.get(name, -1) for name in _COLUMNS}
        if self.index["jobid"] < 0:  # ``--format=JobIDRaw,...``: the raw id is the job's id
            self.index["jobid"] = self.index["jobidraw"]

    def missing(self) -> list[str]:
        """The required columns this table lacks (the job id and State are there by construction)."""
        return [name for name, key in (("Start", "start"), ("End", "end")) if self.index[key] < 0]


#: The command line README recommends; named in the dead letter of a table that lacks a column.
SACCT_COMMAND: Final = (
    "sacct --allusers --allocations --parsable2 --duplicates --starttime YYYY-MM-DD --endtime now "
    "--format=JobID,State,Submit,Start,End,NodeList,NNodes,AllocTRES,ExitCode,JobName,User,Partition,Cluster"
)


def read_sacct_header(line: bytes) -> _Header | None:
    """Return the column layout if ``line`` is a sacct header (names JobID or JobIDRaw, and State).

    None when it is not one.
    """
    try:
        text = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    delim = "|#" if "|#" in text else "|"
    names = [name.strip() for name in text.split(delim)]
    if not all(_HEADER_NAME_RE.match(name) for name in names):
        return None
    lowered = {name.lower() for name in names}
    if ("jobid" not in lowered and "jobidraw" not in lowered) or "state" not in lowered:
        return None
    return _Header(delim, names)


class _Converter:
    """Field conversions with the per-file caches."""

    __slots__ = ("gpus_per_node", "times", "zone")

    def __init__(self, options: ParseOptions) -> None:
        self.zone: ZoneInfo = options.zone()
        self.gpus_per_node = options.gpus_per_node
        self.times: dict[str, int | None] = {}

    def time(self, text: str, column: str) -> int | None:
        """Epoch ms of a sacct time, None for Unknown/None/empty. Raises ValueError."""
        cached = self.times.get(text, -1)
        if cached != -1:
            return cached
        value = text.strip()
        result: int | None
        if value.lower() in _NO_TIME:
            result = None
        elif value.isdigit():
            result = int(value) * 1000
        else:
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"bad {column} time {value!r}") from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=self.zone)
            result = round(moment.timestamp() * 1000)
        if len(self.times) > 100_000:
            self.times.clear()
        self.times[text] = result
        return result

    def gpus(self, fields: list[str], index: dict[str, int], nnodes: int) -> int:
        for column, kind in (("alloctres", 0), ("allocgres", 1), ("reqtres", 0), ("reqgres", 1)):
            position = index[column]
            if position < 0:
                continue
            value = fields[position]
            if not value or "gpu" not in value:
                continue
            if kind == 0:
                gpus = gpus_of_tres(value)
                if gpus is not None:
                    return gpus
            else:
                total = 0
                found = False
                for per_node, count in _GRES_GPU_RE.findall(value):
                    found = True
                    total += int(count) * (max(nnodes, 1) if per_node else 1)
                if found:
                    return total
        return nnodes * self.gpus_per_node


def gpus_of_tres(tres: str) -> int | None:
    """The GPU count a TRES string names (``gres/gpu=8``, or the sum of ``gres/gpu:a100=4,...``),
    None when it names none.

    >>> gpus_of_tres("cpu=64,mem=500G,node=2,gres/gpu=16"), gpus_of_tres("gres/gpu:a100=4,gres/gpu:h100=2")
    (16, 6)
    """
    match = _TRES_GPU_RE.search(tres)
    if match is not None:
        return int(match.group(1))
    typed = _TRES_GPU_TYPED_RE.findall(tres)
    if typed:
        return sum(int(count) for count in typed)
    return None


def _field(fields: list[str], index: dict[str, int], column: str) -> str:
    position = index[column]
    return fields[position].strip() if position >= 0 else ""


def _row_events(
    text: str, header: _Header, convert: _Converter, default_cluster: str, where: str
) -> list[JobEvent] | str:
    """Return the events of one complete record, ``[]`` for a step, or the reason it is invalid."""
    fields = text.split(header.delim)
    index = header.index
    job_id = fields[index["jobid"]].strip()
    if not job_id:
        return "empty JobID"
    if "." in job_id:
        return []
    try:
        state = parse_sacct_state(fields[index["state"]])
        start = convert.time(fields[index["start"]], "Start") if index["start"] >= 0 else None
        end = convert.time(fields[index["end"]], "End") if index["end"] >= 0 else None
        submit = convert.time(fields[index["submit"]], "Submit") if index["submit"] >= 0 else None
        nodes = tuple(expand_hostlist(fields[index["nodelist"]])) if index["nodelist"] >= 0 else ()
    except ValueError as exc:
        return f"job {job_id}: {exc}"
    nnodes_text = _field(fields, index, "nnodes")
    nnodes = int(nnodes_text) if nnodes_text.isdigit() else len(nodes)
    terminal = state.is_terminal
    if terminal and end is None:
        return f"job {job_id}: state {state.value} without an End time"
    if terminal and start is not None and end is not None and end < start:
        return f"job {job_id}: End is before Start"
    cluster = _field(fields, index, "cluster") or default_cluster
    gpus = convert.gpus(fields, index, nnodes)
    exit_code = _field(fields, index, "exitcode")
    name = _field(fields, index, "jobname")
    user = _field(fields, index, "user")
    partition = _field(fields, index, "partition")

    def event(ts_ms: int, event_state: JobState, start_ms: int | None, end_ms: int | None) -> JobEvent:
        return JobEvent(
            ts_ms=ts_ms,
            cluster=cluster,
            job_id=job_id,
            state=event_state,
            nodes=nodes,
            gpus=gpus,
            start_ms=start_ms,
            end_ms=end_ms,
            exit_code=exit_code,
            name=name,
            user=user,
            source=where,
            partition=partition,
        )

    if state is JobState.PENDING:
        return [event(submit, state, None, None)] if submit is not None else []
    if state is JobState.RUNNING:
        if start is None:
            return f"job {job_id}: state RUNNING without a Start time"
        return [event(start, state, start, None)]
    events = []
    if start is not None:
        events.append(event(start, JobState.RUNNING, start, end))
    assert end is not None
    events.append(event(end, state, start, end))
    return events


def _joined(parts: list[bytes]) -> bytes:
    """The raw bytes of an incomplete record, without the blank lines that followed it."""
    return b"\n".join(parts).rstrip(b"\n")


def parse_sacct(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[JobEvent | InvalidRecord]:
    """Parse ``sacct -P`` output into job events and dead letters.

    Parameters
    ----------
    lines
        Physical lines, with or without their line terminator.
    options
        ``timezone``, ``gpus_per_node`` and ``cluster`` are used.
    source
        The file path, for the records' ``source`` (``path:line`` of the record's first line).

    Yields
    ------
    JobEvent | InvalidRecord
        Events in file order (RUNNING before the terminal state of the same row), or dead
        letters for rows with the wrong field count, a bad time, state or node list.

    Examples
    --------
    >>> rows = [b"JobID|State|Start|End|NodeList|NNodes"]
    >>> rows += [b"7|FAILED|2024-01-15T10:00:00|2024-01-15T11:00:00|n[1-2]|2"]
    >>> [(e.state.value, e.nodes, e.gpus) for e in parse_sacct(rows, ParseOptions(), "sacct.txt")]
    [('RUNNING', ('n1', 'n2'), 16), ('FAILED', ('n1', 'n2'), 16)]
    """
    convert = _Converter(options)
    header: _Header | None = None
    skipping = False  # the current table lacks a required column: its rows are not read
    seen: set[tuple[str, str, int]] = set()
    pending: list[bytes] = []
    pending_fields = 0
    pending_line = 0

    def finish(parts: list[bytes], first_line: int) -> Iterator[JobEvent | InvalidRecord]:
        assert header is not None
        raw = b"\n".join(parts)
        result = _row_events(
            raw.decode("utf-8", "replace"), header, convert, options.cluster, f"{source}:{first_line}"
        )
        if isinstance(result, str):
            yield invalid(result, raw, source, first_line)
            return
        for job_event in result:
            key = (job_event.job_id, job_event.state.value, job_event.ts_ms)
            if key not in seen:
                seen.add(key)
                yield job_event

    for line_no, physical in enumerate(lines, 1):
        line = strip_eol(physical)
        if pending:
            assert header is not None
            count = pending_fields + line.count(header.delim_bytes)
            if count <= header.width:
                pending.append(line)
                pending_fields = count
                if count == header.width:
                    yield from finish(pending, pending_line)
                    pending = []
                continue
            yield invalid(
                f"record ends early: {pending_fields} fields, the header has {header.width}",
                _joined(pending),
                source,
                pending_line,
            )
            pending = []
        if not line.strip():
            continue
        if header is None or _HEADER_HINT_RE.search(line) is not None:
            new_header = read_sacct_header(line)
            if new_header is not None:
                header = new_header
                missing = header.missing()
                skipping = bool(missing)
                if skipping:
                    yield invalid(
                        f"sacct output has no {' and no '.join(missing)} column (the default --format?): "
                        f"its jobs cannot be placed in time, so the rows below this header are not read; "
                        f"add {', '.join(missing)} to --format, e.g. {SACCT_COMMAND}",
                        line,
                        source,
                        line_no,
                    )
                continue
            if header is None:
                yield invalid(
                    "no sacct header (a '|'-separated line naming JobID or JobIDRaw, and State) "
                    "before this line",
                    line,
                    source,
                    line_no,
                )
                continue
        if skipping:
            continue
        count = line.count(header.delim_bytes) + 1
        if count == header.width:
            yield from finish([line], line_no)
        elif count < header.width:
            pending = [line]
            pending_fields = count
            pending_line = line_no
        else:
            yield invalid(
                f"row has {count} fields, the header has {header.width}"
                f" (a '{header.delim}' inside a field? use sacct --delimiter='|#')",
                line,
                source,
                line_no,
            )
    if pending:
        assert header is not None
        yield invalid(
            f"record ends early: {pending_fields} fields, the header has {header.width} (file truncated?)",
            _joined(pending),
            source,
            pending_line,
        )
