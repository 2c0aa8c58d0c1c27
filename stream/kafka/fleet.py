"""The fleet topics' messages: what input partitions hand the fleet stage, and its baselines.

``fleet`` (one partition) carries, per input partition and commit point, one or more JSON
messages ``{"partition": p, "horizon": ms | null, "idle": bool, "checkpointed": ms | null, "facts": [...],
"jobs": [...]}``
(:class:`detectors.fleet.FleetFact` as arrays, :class:`detectors.fleet.JobPart` as objects).
``fleet-baselines`` (one partition) carries ``{"baselines": {"<period start ms>": value}}``.
Both are internal: only workers write and read them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from detectors.attribution import HardwareEvent
from detectors.fleet import FleetFact, JobPart
from schemas.outputs import IncidentKind
from schemas.records import JobState
from stream.kafka.codec import partition_for_key

__all__ = [
    "FleetMessage",
    "ForeignDeployment",
    "NodeOwner",
    "check_deployment",
    "decode_baselines",
    "decode_fleet_message",
    "decode_references",
    "encode_baselines",
    "encode_fleet_messages",
]

#: Facts a message carries at most (a message stays far below the broker's 1 MiB limit).
_FACTS_PER_MESSAGE = 2000
_PARTS_PER_MESSAGE = 200


@dataclass(frozen=True, slots=True)
class NodeOwner:
    """Whether a node is keyed to input partition ``partition`` of ``partitions`` (picklable: the
    detection core keeps it, and the core goes into checkpoints).

    >>> [NodeOwner(0, 4)(f"node{n:04d}") for n in range(1, 4)]
    [True, False, True]
    """

    partition: int
    partitions: int

    def __call__(self, node: str) -> bool:
        return partition_for_key(node.encode(), self.partitions) == self.partition


@dataclass(slots=True)
class FleetMessage:
    """One input partition's hand-over to the fleet stage."""

    partition: int
    horizon_ms: int | None = None
    idle: bool = False
    facts: list[FleetFact] = field(default_factory=list)
    jobs: list[JobPart] = field(default_factory=list)
    #: The horizon of the partition's newest checkpoint (:data:`~detectors.fleet.FROM_THE_START`:
    #: none yet); None from a worker that does not say it.
    checkpointed_ms: int | None = None
    #: The application id of the deployment that wrote it ("": a version that did not say).
    app: str = ""
    #: With ``idle``: the partition has decisions pending (:meth:`detectors.fleet.FleetCore.idle`).
    pending: bool = False


class ForeignDeployment(Exception):
    """An internal message written by another deployment (another application id): two deployments
    share an internal topic, and reading on would mix their results."""


def check_deployment(found: str, ours: str, where: str | Callable[[], str]) -> None:
    """Raise :class:`ForeignDeployment` when a message names an application id other than ours (a
    message of a version that named none is accepted). ``where`` names the message (or makes its
    name: only a mismatch needs it).

    >>> check_deployment("", "prod", "t"); check_deployment("prod", "prod", "t")
    >>> try:
    ...     check_deployment("canary", "prod", "prod.fleet offset 7")
    ... except ForeignDeployment as exc:
    ...     print(str(exc)[:70])
    prod.fleet offset 7 was written by deployment 'canary', not 'prod': tw
    """
    if found and found != ours:
        where = where if isinstance(where, str) else where()
        raise ForeignDeployment(
            f"{where} was written by deployment {found!r}, not {ours!r}: two deployments share the "
            "topic; give each application id its own internal topics (leave "
            "FAULTSTREAM_TOPIC_JOBS_BY_NODE, _KERNEL_LOG_BY_NODE, _CHECKPOINTS, _FLEET and "
            "_FLEET_BASELINES empty: they are named from the app id)"
        )


def _fact(fact: FleetFact) -> list[Any]:
    return [fact.ts_ms, fact.kind, fact.node, fact.name, fact.key, fact.value, fact.cluster]


def _part(part: JobPart) -> dict[str, Any]:
    return {
        "cluster": part.cluster,
        "job_id": part.job_id,
        "start_ms": part.start_ms,
        "end_ms": part.end_ms,
        "state": part.state.value,
        "nodes": part.nodes,
        "gpus": part.gpus,
        "covered": part.covered,
        "evidence": [[e.ts_ms, e.node, e.gpu, e.kind.value, e.xid] for e in part.evidence],
        "user": part.user,
        "app_xids": part.app_xids,
        "name": part.name,
        "partition": part.partition,
    }


def encode_fleet_messages(
    partition: int,
    horizon_ms: int | None,
    facts: Sequence[FleetFact],
    jobs: Sequence[JobPart],
    *,
    idle: bool = False,
    checkpointed_ms: int | None = None,
    app: str = "",
    pending: bool = False,
) -> Iterator[bytes]:
    """The messages of one hand-over; the horizon rides on the last one (the stage must have
    every fact before it moves the partition's horizon), and so does ``checkpointed_ms``, the
    horizon of the partition's newest checkpoint (what a restart may hand over again follows it)."""
    chunks = max((len(facts) + _FACTS_PER_MESSAGE - 1) // _FACTS_PER_MESSAGE,
                 (len(jobs) + _PARTS_PER_MESSAGE - 1) // _PARTS_PER_MESSAGE, 1)  # fmt: skip
    for chunk in range(chunks):
        last = chunk == chunks - 1
        yield orjson.dumps(
            {
                "app": app,
                "partition": partition,
                "horizon": horizon_ms if last else None,
                "idle": idle and last,
                "pending": pending and idle and last,
                "checkpointed": checkpointed_ms if last else None,
                "facts": [_fact(f) for f in facts[chunk * _FACTS_PER_MESSAGE :][:_FACTS_PER_MESSAGE]],
                "jobs": [_part(p) for p in jobs[chunk * _PARTS_PER_MESSAGE :][:_PARTS_PER_MESSAGE]],
            }
        )


def decode_fleet_message(value: bytes) -> FleetMessage:
    """Read one ``fleet`` message (raises ValueError/KeyError/TypeError on anything else)."""
    doc = orjson.loads(value)
    facts = [
        FleetFact(int(ts), str(kind), str(node), str(name), str(key), int(value), str(cluster))
        for ts, kind, node, name, key, value, cluster in doc["facts"]
    ]
    jobs = [
        JobPart(
            cluster=j["cluster"],
            job_id=j["job_id"],
            start_ms=int(j["start_ms"]),
            end_ms=int(j["end_ms"]),
            state=JobState(j["state"]),
            nodes=tuple(j["nodes"]),
            gpus=int(j["gpus"]),
            covered=tuple(j["covered"]),
            evidence=tuple(
                HardwareEvent(int(ts), node, gpu, IncidentKind(kind), None if xid is None else int(xid))
                for ts, node, gpu, kind, xid in j["evidence"]
            ),
            # Absent from a worker from before job-aware verdicts: no owner, no application XIDs.
            user=str(j.get("user", "")),
            app_xids=int(j.get("app_xids", 0)),
            name=str(j.get("name", "")),
            partition=str(j.get("partition", "")),  # absent from a worker from before partitions
        )
        for j in doc["jobs"]
    ]
    horizon, checkpointed = doc.get("horizon"), doc.get("checkpointed")
    return FleetMessage(
        int(doc["partition"]),
        None if horizon is None else int(horizon),
        bool(doc.get("idle")),
        facts,
        jobs,
        None if checkpointed is None else int(checkpointed),
        str(doc.get("app", "")),
        bool(doc.get("pending")),
    )


def encode_baselines(
    baselines: dict[int, float], ecc_references: dict[int, float] | None = None, app: str = ""
) -> bytes:
    """A ``fleet-baselines`` message of deployment ``app``: storm baselines and ECC references, by
    period start."""
    doc: dict[str, Any] = {
        "app": app,
        "baselines": {str(start): value for start, value in sorted(baselines.items())},
    }
    if ecc_references:
        doc["ecc"] = {str(start): value for start, value in sorted(ecc_references.items())}
    return orjson.dumps(doc)


def decode_baselines(values: Iterable[bytes]) -> dict[int, float]:
    """The storm baselines of ``fleet-baselines`` messages, later ones winning."""
    return decode_references(values)[0]


def decode_references(
    values: Iterable[bytes], app: str = "", where: str = "fleet-baselines"
) -> tuple[dict[int, float], dict[int, float]]:
    """The storm baselines and the ECC references of ``fleet-baselines`` messages, later ones
    winning (a message from a stage before the ECC reference has none); with ``app``, a message
    of another deployment raises :class:`ForeignDeployment`."""
    storms: dict[int, float] = {}
    ecc: dict[int, float] = {}
    for value in values:
        doc = orjson.loads(value)
        if app:
            check_deployment(str(doc.get("app", "")), app, where)
        storms.update({int(start): float(v) for start, v in doc["baselines"].items()})
        ecc.update({int(start): float(v) for start, v in doc.get("ecc", {}).items()})
    return storms, ecc
