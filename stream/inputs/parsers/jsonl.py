"""JSON Lines -> records, validated by the records' own ``from_dict``.

One JSON object per line. The kind is the explicit ``"kind"`` (``"xid"``, ``"ecc"`` or
``"job"``) when present, else decided by the keys: ``"xid"`` -> :class:`XidEvent`,
``"counters"`` -> :class:`EccSample`, ``"job_id"`` -> :class:`JobEvent`; Slurm's ``jobcomp/kafka``
records (``"jobid"``: a topic's values saved with ``kcat``) are read by
:mod:`stream.inputs.parsers.jobcomp`. A record without a
``"cluster"`` key gets ``options.cluster`` (an explicit empty or null ``cluster`` is kept, and
rejected by validation). Blank lines are skipped; invalid JSON (including invalid UTF-8), a
non-object, an unknown kind and every validation failure are dead letters carrying the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import orjson

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.inputs.parsers.jobcomp import is_jobcomp_record, parse_jobcomp
from stream.inputs.parsers.options import ParseOptions, invalid, strip_eol

__all__ = ["parse_jsonl"]

_FROM_DICT: Final[dict[str, Callable[[object, str], XidEvent | EccSample | JobEvent]]] = {
    "xid": XidEvent.from_dict,
    "ecc": EccSample.from_dict,
    "job": JobEvent.from_dict,
}


def _kind(data: dict[str, Any]) -> str | None:
    kind = data.get("kind")
    if kind is not None:
        return kind if isinstance(kind, str) and kind in _FROM_DICT else None
    if "xid" in data:
        return "xid"
    if "counters" in data:
        return "ecc"
    if "job_id" in data:
        return "job"
    return None


def parse_jsonl(
    lines: Iterable[bytes], options: ParseOptions, source: str
) -> Iterator[XidEvent | EccSample | JobEvent | InvalidRecord]:
    """Parse JSON Lines into records and dead letters.

    Parameters
    ----------
    lines
        Physical lines, with or without their line terminator.
    options
        ``cluster`` fills a missing ``"cluster"``.
    source
        The file path, for the records' ``source`` (``path:line``) and the dead letters.

    Yields
    ------
    XidEvent | EccSample | JobEvent | InvalidRecord
        One record or dead letter per non-blank line, in file order.

    Examples
    --------
    >>> line = b'{"ts": "2024-01-15T10:23:45Z", "node": "n1", "xid": 79, "pci_bus_id": "00000000:3B:00.0"}'
    >>> event = next(parse_jsonl([line], ParseOptions(cluster="c1"), "x.jsonl"))
    >>> event.cluster, event.xid, event.pci_bus_id, event.source
    ('c1', 79, '0000:3b:00', 'x.jsonl:1')
    """
    cluster = options.cluster
    loads = orjson.loads
    for line_no, physical in enumerate(lines, 1):
        raw = strip_eol(physical)
        if not raw.strip():
            continue
        try:
            data = loads(raw)
        except orjson.JSONDecodeError as exc:
            yield invalid(f"invalid JSON: {exc}", raw, source, line_no)
            continue
        if not isinstance(data, dict):
            yield invalid(f"a record must be a JSON object, got {type(data).__name__}", raw, source, line_no)
            continue
        if is_jobcomp_record(data):
            yield parse_jobcomp(data, cluster, options.gpus_per_node, source, f"line {line_no}", raw)
            continue
        kind = _kind(data)
        if kind is None:
            if "kind" in data:
                reason = f"unknown record kind {data['kind']!r} (known: xid, ecc, job)"
            else:
                reason = "cannot tell the record kind: no 'xid', 'counters' or 'job_id' key and no 'kind'"
            yield invalid(reason, raw, source, line_no)
            continue
        if "cluster" not in data:
            data["cluster"] = cluster
        try:
            record = _FROM_DICT[kind](data, f"{source}:{line_no}")
        except InvalidRecord as exc:
            yield invalid(f"{kind} record: {exc.reason}", raw, source, line_no)
            continue
        except (ValueError, TypeError) as exc:
            yield invalid(f"{kind} record: {exc}", raw, source, line_no)
            continue
        yield record
