"""Slurm's ``jobcomp/kafka`` records -> :class:`~schemas.records.JobEvent`.

Slurm 23.02+ publishes one compact JSON object a job to Kafka when it ends (and, from 25.05 with
``JobCompParams=enable_job_start``, one when it starts), with no key, to a topic named after the
cluster by default. The fields read here (Slurm's ``jobcomp_common`` serializer; the others are
passed over):

* ``jobid`` (integer), with ``array_job_id``/``array_task_id`` for an array task: the job id is
  then ``<array_job_id>_<array_task_id>``, as ``sacct`` shows it;
* ``@start``, ``@end``: UTC, ``%FT%T`` without a zone (a zone is honoured if present);
  ``"Unknown"`` means no time;
* ``state``: Slurm's job state name (``COMPLETED``, ``FAILED``, ``NODE_FAIL``, ...), mapped as
  the sacct parser maps it; ``null`` or absent in a start record;
* ``nodes`` (a host list such as ``gpu-node-[17-18]``), ``total_nodes``, ``partition``,
  ``username``, ``job_name``, ``exit_code`` (``"1:0"``), ``cluster``;
* ``tres_alloc`` (or ``tres_fmt_alloc_str``, then ``tres_req``): ``gres/gpu=N`` is the job's GPU
  count, else ``total_nodes x gpus_per_node``.

A record with an ``@end`` and a terminal state is the job's end: one event in that state at
``@end``, carrying ``@start`` as the run's start (the tracker opens the run from it). A start
record (no ``@end``, no state) is one ``RUNNING`` event at ``@start``. What cannot be placed or
read is a dead letter naming the field: no ``jobid``, an end without ``@end``, a start without
``@start``, an unknown state (a state a newer Slurm adds is refused with the known ones listed,
never guessed), a host list that does not parse, a field of the wrong type.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from schemas.records import InvalidRecord, JobEvent, JobState
from stream.inputs.parsers.hostlist import expand_hostlist
from stream.inputs.parsers.sacct import gpus_of_tres, parse_sacct_state

__all__ = ["is_jobcomp_record", "parse_jobcomp"]

#: Values Slurm writes for a time it does not know.
_NO_TIME: Final = frozenset({"", "unknown", "none"})
#: Slurm's ``NO_VAL`` and ``NO_VAL - 1``: an array field that is not set.
_NOT_SET: Final = frozenset({0xFFFFFFFE, 0xFFFFFFFF})


def is_jobcomp_record(data: dict[str, Any]) -> bool:
    """Whether a decoded JSON object is a ``jobcomp`` record (``jobid``, not faultstream's ``job_id``).

    >>> is_jobcomp_record({"jobid": 7, "@end": "2025-03-04T10:00:00"}), is_jobcomp_record({"job_id": "7"})
    (True, False)
    """
    return "jobid" in data and "job_id" not in data


def _time(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecord(f"field {name!r} must be a time string like 2025-03-04T10:00:00, got {value!r}")
    if value.strip().lower() in _NO_TIME:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRecord(f"field {name!r}: not a time: {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # jobcomp writes UTC without a zone
    return round(moment.timestamp() * 1000)


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise InvalidRecord(f"field {name!r} must be a string, got {type(value).__name__}")


def _count(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecord(f"field {name!r} must be a non-negative integer, got {value!r}")
    return value


def _job_id(data: dict[str, Any]) -> str:
    job_id = data.get("jobid")
    if isinstance(job_id, str) and job_id.strip().isdigit():
        job_id = int(job_id)
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise InvalidRecord(f"field 'jobid' must be a positive integer, got {job_id!r}")
    array_job = data.get("array_job_id")
    array_task = data.get("array_task_id")
    if (
        isinstance(array_job, int)
        and isinstance(array_task, int)
        and array_job > 0
        and array_task not in _NOT_SET
        and array_job not in _NOT_SET
    ):
        return f"{array_job}_{array_task}"
    return str(job_id)


def _event(data: dict[str, Any], cluster: str, gpus_per_node: int, source: str) -> JobEvent:
    job_id = _job_id(data)
    start_ms = _time(data, "@start")
    end_ms = _time(data, "@end")
    state_name = data.get("state")
    if state_name is not None and not isinstance(state_name, str):
        raise InvalidRecord(f"field 'state' must be a string or null, got {state_name!r}")
    nodes_text = _text(data, "nodes")
    try:
        nodes = tuple(expand_hostlist(nodes_text))
    except ValueError as error:
        raise InvalidRecord(f"field 'nodes': {error}") from None
    total_nodes = _count(data, "total_nodes")
    gpus = None
    for name in ("tres_alloc", "tres_fmt_alloc_str", "tres_req"):
        gpus = gpus_of_tres(_text(data, name))
        if gpus is not None:
            break
    if gpus is None:
        gpus = (total_nodes if total_nodes is not None else len(nodes)) * gpus_per_node
    common = {
        "cluster": _text(data, "cluster") or cluster,
        "job_id": job_id,
        "nodes": nodes,
        "gpus": gpus,
        "exit_code": _text(data, "exit_code"),
        "name": _text(data, "job_name"),
        "user": _text(data, "username"),
        "partition": _text(data, "partition"),
        "source": source,
    }
    if state_name is None or not state_name.strip():
        if end_ms is not None:
            raise InvalidRecord(f"job {job_id}: an end record (with '@end') must name its 'state'")
        if start_ms is None:
            raise InvalidRecord(f"job {job_id}: a start record needs an '@start' time")
        return JobEvent(ts_ms=start_ms, state=JobState.RUNNING, start_ms=start_ms, **common)
    try:
        state = parse_sacct_state(state_name)
    except ValueError:
        known = ", ".join(state.value for state in JobState)
        raise InvalidRecord(
            f"job {job_id}: unknown job state {state_name!r} (faultstream knows {known} and Slurm's "
            "aliases of them)"
        ) from None
    if not state.is_terminal:
        if start_ms is None:
            raise InvalidRecord(f"job {job_id}: state {state.value} needs an '@start' time")
        return JobEvent(ts_ms=start_ms, state=JobState.RUNNING, start_ms=start_ms, **common)
    if end_ms is None:
        raise InvalidRecord(f"job {job_id}: state {state.value} without an '@end' time")
    if start_ms is not None and end_ms < start_ms:
        raise InvalidRecord(f"job {job_id}: '@end' is before '@start'")
    return JobEvent(ts_ms=end_ms, state=state, start_ms=start_ms, end_ms=end_ms, **common)


def parse_jobcomp(
    data: dict[str, Any], cluster: str, gpus_per_node: int, source: str, location: str, raw: bytes = b""
) -> JobEvent | InvalidRecord:
    """The job event of one decoded ``jobcomp`` record, or its dead letter.

    Parameters
    ----------
    data
        The decoded JSON object.
    cluster
        The cluster of a record without ``cluster`` (Slurm sets it only with accounting).
    gpus_per_node
        GPUs a node when the record's TRES name no ``gres/gpu``.
    source, location, raw
        Where the record came from, and its bytes, for the event's ``source`` and the dead letter.

    Examples
    --------
    >>> record = {"jobid": 4242, "username": "ana", "@start": "2025-03-04T10:00:00",
    ...           "@end": "2025-03-04T11:00:00", "partition": "gpu", "nodes": "gpu-node-[17-18]",
    ...           "total_nodes": 2, "exit_code": "1:0", "state": "FAILED", "job_name": "train",
    ...           "tres_alloc": "cpu=64,mem=500G,node=2,billing=64,gres/gpu=16"}
    >>> event = parse_jobcomp(record, "c1", 8, "jobs/0", "offset 3")
    >>> event.state.value, event.job_id, event.nodes, event.gpus, event.ts_ms == event.end_ms
    ('FAILED', '4242', ('gpu-node-17', 'gpu-node-18'), 16, True)
    >>> parse_jobcomp({"jobid": 4243, "@start": "2025-03-04T10:00:00", "state": None, "nodes": "n1"},
    ...               "c1", 8, "jobs/0", "offset 4").state.value
    'RUNNING'
    >>> parse_jobcomp({"jobid": 4244, "@end": "2025-03-04T10:00:00", "state": "LAUNCH_FAILED",
    ...                "nodes": "n1"}, "c1", 8, "jobs/0", "offset 5").reason[:59]
    "jobcomp record: job 4244: unknown job state 'LAUNCH_FAILED'"
    """
    try:
        return _event(data, cluster, gpus_per_node, f"{source}:{location}")
    except InvalidRecord as error:
        return InvalidRecord(f"jobcomp record: {error.reason}", raw, source, location)
