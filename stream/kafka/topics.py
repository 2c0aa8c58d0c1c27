"""Kafka topics of faultstream, created explicitly with their configs by ``faultstream init-kafka``.

=====================  =========  ===============================================================
topic                  key        config and why
=====================  =========  ===============================================================
xid, ecc               node       delete by size (``topic_retention_bytes`` per partition), never
                                  by age: message timestamps are event times, so age retention
                                  would delete a replay of last month's logs within minutes (it
                                  did, in our tests: the worker found its next offsets gone)
jobs                   job id     the same, ONE partition: job changes are few (thousands a day)
                                  and one partition keeps them in event-time order, so the
                                  re-keyed copies reach each node partition in that order too
jobs-by-node           node       the same: internal, the jobs re-keyed to their nodes (with the
                                  jobs' event times) so a job's end meets its nodes' evidence
kernel-log             any        the same, ONE partition: raw kernel-log lines as log shippers
                                  send them (no key, or their own), in the order they come;
                                  most are other drivers' lines, skipped at once
kernel-log-by-node     node       the same: internal, the XID events of those lines re-keyed to
                                  their nodes
incidents              node       delete, 30 days: every incident of a node and every update of
                                  it lands on one partition in the order it was made, so an SRE
                                  console or pager reading some nodes sees their story in order;
                                  not compacted, since a node key would compact a node's other
                                  incidents away (readers keep the highest ``version`` per
                                  ``incident_id``, which also drops at-least-once repeats)
dead-letters           source     delete, 30 days: to repair and replay by hand
checkpoints            partition  compact: the newest detector-state checkpoint of each input
                                  partition is all a restarting worker needs; messages up to
                                  64 MiB (the state of ~12,000 nodes per partition, compressed)
fleet                  partition  delete by size, ONE partition: each input partition's facts for
                                  the fleet stage (:mod:`detectors.fleet`), read by the owner of
                                  input partition 0, which runs the stage
fleet-baselines        period     delete by size, ONE partition: the stage's storm baselines (a
                                  few a day), read whole by every worker
remote-write-parts     GPU/time   compact, ONE partition: ``faultstream receive``'s DCGM values of
                                  answered requests not yet sent out as whole samples (deleted
                                  once they are), and each GPU's place
=====================  =========  ===============================================================

Message timestamps are the records' event times (``CreateTime``), so a replay of history
carries the time things happened, not the time they were sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.timeutil import DAY_MS
from stream.settings import Settings

__all__ = ["CHECKPOINT_MAX_BYTES", "TopicSpec", "topic_specs"]

CHECKPOINT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic to create."""

    name: str
    partitions: int
    replication: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The topics of this deployment, from the settings."""
    partitions, replication = settings.topic_partitions, settings.topic_replication
    raw = {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": str(settings.topic_retention_bytes),
        "message.timestamp.type": "CreateTime",
    }
    return [
        TopicSpec(settings.topic_xid, partitions, replication, raw),
        TopicSpec(settings.topic_ecc, partitions, replication, raw),
        TopicSpec(settings.topic_jobs, 1, replication, raw),
        TopicSpec(settings.topic_jobs_by_node, partitions, replication, raw),
        TopicSpec(settings.topic_kernel_log, 1, replication, raw),
        TopicSpec(settings.topic_kernel_log_by_node, partitions, replication, raw),
        TopicSpec(
            settings.topic_incidents,
            partitions,
            replication,
            {"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
        ),
        TopicSpec(
            settings.topic_dead_letters,
            1,
            replication,
            {"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)},
        ),
        TopicSpec(settings.topic_fleet, 1, replication, raw),
        TopicSpec(settings.topic_remote_write_parts, 1, replication, {"cleanup.policy": "compact"}),
        TopicSpec(settings.topic_fleet_baselines, 1, replication, raw),
        TopicSpec(
            settings.topic_checkpoints,
            partitions,
            replication,
            {
                "cleanup.policy": "compact",
                "max.message.bytes": str(CHECKPOINT_MAX_BYTES),
                "segment.ms": str(DAY_MS // 24),
            },
        ),
    ]
