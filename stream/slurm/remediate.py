"""``faultstream remediate``: critical incidents drain their nodes in Slurm, through a breaker.

A long-running consumer of the incidents topic (its own consumer group, like ``notify``). Each
incident message is decided by :func:`stream.slurm.policy.decide`, carried out with ``scontrol``
(a drain counts only when read back), and audited as one row of the ``remediations`` table —
acted, skipped and why, the breaker tripping or reset — before the message's offset is committed.
The audit is also the service's memory: a start rebuilds from it which incidents were acted on,
which nodes faultstream drained, the last hour's drains and the breaker, so a restart repeats
nothing.

A dry run (the default, without ``--execute``) decides and audits the same way, counts its
would-be drains in the breaker, and changes nothing in Slurm.

When the breaker trips it posts a critical ``remediation_breaker`` notice on the incidents topic
(``notify`` pages it, ``tail`` shows it) and sets ``faultstream_remediation_breaker_open``; it
drains nothing more until a person resets it: ``kill -USR1`` the running service, or start it
with ``--reset-breaker`` (both audited).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from schemas.ddl import INSERT_COLUMNS
from stream.kafka.security import client_options
from stream.settings import Settings
from stream.sinks.store import query_rows
from stream.slurm import nodes
from stream.slurm.commands import SlurmCommandError, SlurmCommands
from stream.slurm.policy import (
    Decision,
    RemediationPolicy,
    RemediationState,
    decide,
    drain_reason,
    needs_node,
)

__all__ = ["RemediationMetrics", "Remediator", "load_state", "policy_of", "run_remediate"]

_log = logging.getLogger("faultstream.remediate")

#: Tries of one scontrol change before its decision is audited as failed.
_TRIES = 3
_HOUR_MS = 3_600_000
#: Outcomes also put on the incidents topic (``tail`` shows them): what was done, or failed to be.
_SHOWN = frozenset({"drained", "would_drain", "resumed", "would_resume", "failed"})


def policy_of(settings: Settings, execute: bool) -> RemediationPolicy:
    """The policy the settings describe (``execute``: the ``--execute`` flag).

    Raises
    ------
    ValueError
        A refused or unknown kind, a limit out of range.
    """
    return RemediationPolicy(
        kinds=frozenset(kind.strip() for kind in settings.remediate_kinds.split(",") if kind.strip()),
        execute=execute or settings.remediate_execute,
        max_nodes=settings.remediate_max_nodes,
        max_fraction=settings.remediate_max_fraction,
        max_per_hour=settings.remediate_max_per_hour,
        resume=settings.remediate_resume,
    )


class RemediationMetrics:
    """The remediator's Prometheus metrics (served on ``remediate_metrics_port``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "faultstream_remediation_decisions",
            "Remediation decisions audited, by outcome (drained, would_drain, resumed, failed, skipped, "
            "tripped, reset, ...).",
            ["outcome"],
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "faultstream_remediation_breaker_open",
            "1 while the breaker is open (nothing is drained until a person resets it).",
            registry=self.registry,
        )
        self.drained = Gauge(
            "faultstream_remediation_drained_nodes",
            "Nodes drained by faultstream now (would-be drains in a dry run).",
            registry=self.registry,
        )


def load_state(client: Any, database: str, now_ms: int) -> RemediationState:
    """What the audit table says earlier runs did (an empty state on a fresh store)."""
    state = RemediationState()
    rows = query_rows(
        client,
        f"SELECT toUnixTimestamp64Milli(decided) AS at, incident_id, node, action, outcome, reason "
        f"FROM {database}.remediations ORDER BY decided, action",
    )
    for row in rows:
        outcome, node, incident_id = row["outcome"], row["node"], row["incident_id"]
        if outcome in ("drained", "would_drain", "already_drained"):
            state.acted.add(incident_id)
        if outcome in ("drained", "would_drain"):
            state.drained[node] = incident_id
            if row["at"] > now_ms - _HOUR_MS:
                state.recent_drains.append(row["at"])
        elif outcome in ("resumed", "would_resume") and state.drained.get(node) == incident_id:
            del state.drained[node]
        elif outcome == "tripped":
            state.breaker_open, state.breaker_reason = True, row["reason"]
        elif outcome == "reset":
            state.breaker_open, state.breaker_reason = False, ""
        elif row["action"] == "skip":
            state.skips_said.add((incident_id, row["reason"]))
    return state


@dataclass
class Remediator:
    """Decides, carries out and audits one incident message at a time."""

    settings: Settings
    policy: RemediationPolicy
    commands: SlurmCommands
    client: Any
    producer: Any
    state: RemediationState
    metrics: RemediationMetrics = field(default_factory=RemediationMetrics)
    actor: str = field(default_factory=lambda: f"faultstream-remediate@{socket.gethostname()}")
    clock: Any = time.time
    _fleet: tuple[float, int] = (0.0, 0)

    async def handle(self, incident: dict[str, Any]) -> Decision:
        """Decide on one incident message, carry the decision out and audit it."""
        node_view = None
        fleet = 0
        if needs_node(incident, self.policy, self.state):
            name = str(incident.get("node") or "")
            node_view = await self._retried(lambda: nodes.node_view(self.commands, name), f"read node {name}")
            if node_view is None:  # not acted on: a later version of the incident tries again
                unanswered = Decision(
                    "skip", "Slurm did not answer about the node", str(incident.get("incident_id", "")),
                    kind=str(incident.get("kind", "")), node=name,
                )  # fmt: skip
                return await self._audit(unanswered, "failed")
            if self.policy.execute:
                await self._forget_drains_undone()
            fleet = await self._fleet_size()
        decision = decide(incident, node_view, fleet, self._now(), self.policy, self.state)
        return await self._carry_out(decision)

    async def _carry_out(self, decision: Decision) -> Decision:
        if decision.action == "skip":
            if decision.reason.startswith("already drained"):
                self.state.acted.add(decision.incident_id)
                return await self._audit(decision, "already_drained")
            if decision.audit:
                self.state.skips_said.add((decision.incident_id, decision.reason))
                return await self._audit(decision, "skipped")
            return decision
        if decision.action == "trip":
            self.state.breaker_open, self.state.breaker_reason = True, decision.reason
            self.metrics.breaker_open.set(1)
            _log.error(
                "remediate: breaker tripped: %s; nothing more is drained until a person resets it",
                decision.reason,
            )
            await self._breaker_notice(decision, resolved=False)
            return await self._audit(decision, "tripped")
        reason = drain_reason(decision.incident_id, decision.kind)
        if decision.action == "drain":
            if self.policy.execute:
                view = await self._retried(
                    lambda: nodes.drain(self.commands, decision.node, reason), f"drain {decision.node}"
                )
                if view is None:
                    return await self._audit(decision, "failed", reason)
            self.state.acted.add(decision.incident_id)
            self.state.drained[decision.node] = decision.incident_id
            self.state.recent_drains.append(self._now())
            self.metrics.drained.set(len(self.state.drained))
            outcome = "drained" if self.policy.execute else "would_drain"
            _log.warning("remediate: %s %s (%s)", outcome.replace("_", " "), decision.node, reason)
            return await self._audit(decision, outcome, reason)
        # resume
        if self.policy.execute:
            view = await self._retried(
                lambda: nodes.resume(self.commands, decision.node), f"resume {decision.node}"
            )
            if view is None:
                return await self._audit(decision, "failed")
        self.state.drained.pop(decision.node, None)
        self.metrics.drained.set(len(self.state.drained))
        return await self._audit(decision, "resumed" if self.policy.execute else "would_resume")

    async def reset_breaker(self, who: str) -> None:
        """A person resets the breaker: audited, and the notice on the topic resolved."""
        was = self.state.breaker_reason
        self.state.breaker_open, self.state.breaker_reason = False, ""
        self.metrics.breaker_open.set(0)
        decision = Decision("reset", f"reset by {who}" + (f" (it had tripped: {was})" if was else ""))
        _log.warning("remediate: breaker %s", decision.reason)
        await self._breaker_notice(decision, resolved=True)
        await self._audit(decision, "reset")

    async def _forget_drains_undone(self) -> None:
        """Drop from the count the nodes faultstream drained that are no longer drained by it (a
        person resumed or re-labelled them): the breaker counts what Slurm shows."""
        for node, incident_id in list(self.state.drained.items()):
            view = await self._retried(
                lambda node=node: nodes.node_view(self.commands, node), f"read node {node}"
            )
            if view is not None and not (
                view.drained_by_faultstream and view.reason.startswith(f"faultstream {incident_id}:")
            ):
                del self.state.drained[node]
        self.metrics.drained.set(len(self.state.drained))

    async def _fleet_size(self) -> int:
        at, size = self._fleet
        if time.monotonic() - at > 60 or not size:
            answer = await self._retried(lambda: nodes.fleet_size(self.commands), "count the nodes (sinfo)")
            if answer is not None:
                self._fleet = (time.monotonic(), answer)
                size = answer
        return size

    async def _retried(self, action: Any, what: str) -> Any:
        """``action()`` with up to three tries (pauses of 1 and 2 s); None after the last failure."""
        pause = 1.0
        for attempt in range(1, _TRIES + 1):
            try:
                return await action()
            except SlurmCommandError as exc:
                _log.warning("remediate: %s failed (try %d of %d): %s", what, attempt, _TRIES, exc)
                if attempt == _TRIES:
                    return None
                await asyncio.sleep(pause)
                pause *= 2
        return None

    async def _breaker_notice(self, decision: Decision, *, resolved: bool) -> None:
        action = (
            ""
            if resolved
            else "look at the drains in `faultstream report` (remediations); then reset the breaker: kill "
            "-USR1 the remediate process, or restart it with --reset-breaker"
        )
        await self._notice(
            f"remediation-breaker-{self.settings.remediate_group}", "remediation_breaker",
            "info" if resolved else "critical", "resolved" if resolved else "open", "",
            f"Remediation breaker {'reset' if resolved else 'tripped'}: {decision.reason}", action,
        )  # fmt: skip

    async def _notice(
        self, notice_id: str, kind: str, severity: str, status: str, node: str, summary: str, action: str
    ) -> None:
        """A message on the incidents topic, shaped as an incident, for what remediation did: the
        SRE console (``tail``) shows it among the incidents, ``notify`` forwards it."""
        now = (
            datetime.fromtimestamp(self.clock(), tz=UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z")
        )
        notice = {
            "incident_id": notice_id, "version": self._now(), "kind": kind, "severity": severity,
            "status": status, "cluster": self.settings.cluster, "node": node, "gpu": "",
            "first_evidence": now, "last_evidence": now, "detected": now, "detector": "remediate",
            "score": 0.0, "action": action, "summary": summary, "evidence": {}, "evidence_count": 0,
        }  # fmt: skip
        # Keyed by node, as every incident.
        await self.producer.send_and_wait(
            self.settings.topic_incidents, orjson.dumps(notice), key=node.encode()
        )

    async def _audit(self, decision: Decision, outcome: str, slurm_reason: str = "") -> Decision:
        """One row of the ``remediations`` table; what was done (not a skip) also on the topic."""
        row = {
            "decided": datetime.fromtimestamp(self.clock(), tz=UTC),
            "incident_id": decision.incident_id,
            "version": decision.version,
            "cluster": decision.cluster,
            "node": decision.node,
            "kind": decision.kind,
            "severity": decision.severity,
            "action": decision.action,
            "outcome": outcome,
            "reason": decision.reason,
            "slurm_reason": slurm_reason,
            "executed": self.policy.execute,
            "actor": self.actor,
        }
        columns = INSERT_COLUMNS["remediations"]
        self.client.insert(
            f"{self.settings.database}.remediations",
            [[row[name] for name in columns]],
            column_names=list(columns),
        )
        self.metrics.decisions.labels(outcome).inc()
        if outcome in _SHOWN and decision.node:
            await self._notice(
                f"remediation-{decision.incident_id}-{decision.action}", "remediation",
                "warn" if outcome == "failed" else "info", "resolved", decision.node,
                f"faultstream remediate: {outcome.replace('_', ' ')} {decision.node} for "
                f"{decision.incident_id} ({decision.reason}{'; ' + slurm_reason if slurm_reason else ''})",
                "",
            )  # fmt: skip
        return decision

    def _now(self) -> int:
        return int(self.clock() * 1000)


async def run_remediate(
    settings: Settings, policy: RemediationPolicy, commands: SlurmCommands, client: Any, reset_breaker: bool
) -> None:
    """Remediate until SIGTERM or Ctrl-C; SIGUSR1 resets the breaker."""
    metrics = RemediationMetrics()
    if settings.remediate_metrics_port:
        start_http_server(
            settings.remediate_metrics_port, addr=settings.metrics_host, registry=metrics.registry
        )
    state = load_state(client, settings.database, int(time.time() * 1000))
    producer = AIOKafkaProducer(**client_options(settings), enable_idempotence=True)
    consumer = AIOKafkaConsumer(
        settings.topic_incidents,
        **client_options(settings),
        group_id=settings.remediate_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await producer.start()
    await consumer.start()
    remediator = Remediator(settings, policy, commands, client, producer, state, metrics)
    metrics.breaker_open.set(1 if state.breaker_open else 0)
    metrics.drained.set(len(state.drained))
    stop = asyncio.Event()
    resets: deque[str] = deque()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: resets.append("SIGUSR1"))
    try:
        if reset_breaker:
            await remediator.reset_breaker(f"{getpass.getuser()} (--reset-breaker)")
        _log.info(
            "remediate: %s; kinds %s; breaker at %d nodes, %.1f%% of the fleet, %d drains an hour%s; "
            "%d incident(s) acted on before, %d node(s) drained by faultstream%s",
            "EXECUTING drains" if policy.execute else "dry run (nothing is changed in Slurm; --execute acts)",
            ",".join(sorted(policy.kinds)), policy.max_nodes, policy.max_fraction * 100, policy.max_per_hour,
            "; resumes on" if policy.resume else "", len(state.acted), len(state.drained),
            "; THE BREAKER IS OPEN" if state.breaker_open else "",
        )  # fmt: skip
        while not stop.is_set():
            while resets:
                await remediator.reset_breaker(f"{resets.popleft()} from a person")
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for message in messages:
                    try:
                        incident = orjson.loads(message.value or b"")
                    except orjson.JSONDecodeError:
                        continue  # not an incident message: the worker writes JSON only
                    if isinstance(incident, dict):
                        await remediator.handle(incident)
            if batches:
                await consumer.commit()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
        with contextlib.suppress(Exception):
            await consumer.stop()
        await producer.stop()
