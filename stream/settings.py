"""The one settings object of faultstream, read from ``FAULTSTREAM_*`` environment variables.

Every field names its environment variable; command-line flags override the environment.
The configuration reference (docs/configuration.md) is generated from this file's docstrings
(``faultstream config``), so what is documented is what is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detectors.mttf import SizeBuckets

if TYPE_CHECKING:
    from detectors.core import CoreConfig

__all__ = [
    "CONFIG_FILE_VARIABLE",
    "DETECTOR_SETTINGS",
    "ENV_PREFIX",
    "INTERNAL_TOPICS",
    "Settings",
    "SettingsError",
]

ENV_PREFIX = "FAULTSTREAM_"
#: The variable naming the configuration file (``faultstream --config FILE`` sets it for a command).
CONFIG_FILE_VARIABLE = ENV_PREFIX + "CONFIG_FILE"
#: The internal topics, named ``<app id>.<suffix>`` unless set (:class:`Settings`).
INTERNAL_TOPICS = {
    "topic_jobs_by_node": "jobs-by-node",
    "topic_kernel_log_by_node": "kernel-log-by-node",
    "topic_remote_write_parts": "remote-write-parts",
    "topic_checkpoints": "checkpoints",
    "topic_fleet": "fleet",
    "topic_fleet_baselines": "fleet-baselines",
}


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


def quiet_periods_by_kind(text: str) -> tuple[tuple[Any, int], ...]:
    """``kind=seconds,...`` as the core's ``(IncidentKind, ms)`` pairs.

    >>> quiet_periods_by_kind("xid_storm=7200, lemon_node=259200")
    ((<IncidentKind.XID_STORM: 'xid_storm'>, 7200000), (<IncidentKind.LEMON_NODE: 'lemon_node'>, 259200000))

    Raises
    ------
    ValueError
        For a part that is not ``kind=seconds``, a kind that is not an incident kind, or seconds
        that are not a positive integer.
    """
    from schemas.outputs import IncidentKind

    pairs = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        kind, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is not kind=seconds")
        try:
            incident_kind = IncidentKind(kind)
        except ValueError:
            raise ValueError(
                f"{kind!r} is not an incident kind ({', '.join(k.value for k in IncidentKind)})"
            ) from None
        if not value.isdigit() or int(value) <= 0:
            raise ValueError(f"{kind}: {value!r} is not a positive number of seconds")
        pairs.append((incident_kind, int(value) * 1000))
    return tuple(pairs)


def _at_least(low: float) -> tuple[Callable[[float], bool], str]:
    return (lambda value: value >= low), f"must be >= {low:g}"


def _above(low: float) -> tuple[Callable[[float], bool], str]:
    return (lambda value: value > low), f"must be > {low:g}"


def _share() -> tuple[Callable[[float], bool], str]:
    return (lambda value: 0 <= value < 1), "must be >= 0 and < 1"


#: The detector settings' ranges (checked by :meth:`Settings.detector_problems`).
_DETECTOR_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "allowed_lateness_seconds": _at_least(0),
    "quiet_period_seconds": _above(0),
    "attribution_before_seconds": _at_least(0),
    "attribution_after_seconds": _at_least(0),
    "gpus_per_node": _at_least(1),
    "ecc_keep_interval_seconds": _above(0),
    "storm_window_hours": _above(0),
    "storm_min_events": _at_least(1),
    "storm_owner_window_hours": _at_least(0),
    "storm_baseline_period_seconds": _above(0),
    "storm_baseline_min_gpus": _at_least(1),
    "spread_window_hours": _above(0),
    "spread_min_events": _at_least(1),
    "spread_min_gpus": _at_least(1),
    "spread_min_bursts": _at_least(1),
    "ecc_trend_window": _at_least(1),
    "ecc_trend_floor_per_day": _above(0),
    "ecc_trend_threshold": _above(0),
    "ecc_reference_period_seconds": _above(0),
    "ecc_reference_window_seconds": _above(0),
    "ecc_reference_min_gpus": _at_least(1),
    "lemon_window_seconds": _above(0),
    "lemon_evaluate_every_seconds": _above(0),
    "lemon_threshold": _above(0),
    "lemon_min_signal_surprise": _at_least(0),
    "lemon_min_history_seconds": _at_least(0),
    "lemon_episode_gap_seconds": _at_least(0),
    "lemon_prior_fault_rate": _at_least(0),
    "lemon_min_confidence": _share(),
    "lemon_trim_share": _share(),
}
#: The settings that change what the detectors decide (the rest say where data goes and how the
#: pipeline runs): what ``faultstream diff --set`` takes and the detector fingerprint covers.
DETECTOR_SETTINGS: tuple[str, ...] = (
    *_DETECTOR_RANGES, "windows_seconds", "size_buckets", "quiet_period_by_kind", "xid_catalog_file",
)  # fmt: skip


def setting(default: Any, doc: str, *, secret: bool = False) -> Any:
    """A settings field with its documentation (shown by ``faultstream config`` and docs/configuration.md).

    A ``secret`` field (a password) is left out of the settings' ``repr``, so no log or traceback
    that prints the settings shows it.
    """
    return field(default=default, repr=not secret, metadata={"doc": doc, "secret": secret})


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.replace(" ", "").split(",") if part)


@dataclass(frozen=True, slots=True)
class Settings:
    """All configuration, with defaults that work on a laptop (embedded ClickHouse, no Kafka)."""

    clickhouse_dsn: str = setting(
        "",
        "ClickHouse to write to: `chdb:///abs/path` (embedded, in-process) or "
        "`http(s)://user:pass@host:8123`. Empty: embedded store in `data_dir`. Never printed whole: "
        "messages show it without the password.",
        secret=True,
    )
    clickhouse_ca_file: str = setting(
        "",
        "PEM file of the CA that signed the ClickHouse server's certificate, for `https://` DSNs "
        "(the server's certificate and host name are always verified; empty: the system's CAs).",
    )
    data_dir: str = setting(
        "./faultstream-data", "Folder of the embedded store and of the embedded dead-letter file."
    )
    database: str = setting("faultstream", "ClickHouse database holding the tables.")
    cluster: str = setting("default", "Cluster name stamped on records whose source does not name one.")
    windows_seconds: str = setting("3600,86400", "Tumbling MTTF window lengths, seconds, comma-separated.")
    size_buckets: str = setting("1,8,64,512,1024,4096", "Lower GPU-count bounds of the job-size buckets.")
    reference_job_sizes: str = setting(
        "8,1024,16384,131072", "Job sizes (GPUs) for projected MTTF and ETTR guidance."
    )
    gpus_per_node: int = setting(8, "GPUs per node; turns job sizes into node counts.")
    allowed_lateness_seconds: int = setting(
        300,
        "How late (event time) a record may arrive and still be used; later ones are dead-lettered as late.",
    )
    quiet_period_seconds: int = setting(
        3600,
        "An incident without new evidence for this long is resolved; evidence after that opens a new one.",
    )
    attribution_before_seconds: int = setting(
        600, "Attribution window start, before a failed job's end (paper: 10 min)."
    )
    attribution_after_seconds: int = setting(
        300, "Attribution window end, after a failed job's end (paper: 5 min)."
    )
    ecc_keep_interval_seconds: int = setting(
        86400,
        "ECC samples that change nothing are stored at most this often per GPU (every change is stored).",
    )
    xid_catalog_file: str = setting(
        "",
        "XID catalog overrides: a TOML file of `[xid.CODE]` tables (severity, category, action, reason) "
        "that change NVIDIA's entries or add codes (docs/detection.md); empty: NVIDIA's catalog as is.",
    )
    # -- detector tunables (docs/detection.md says what each detector does with them)
    storm_window_hours: float = setting(1.0, "XID storm detector: the window a GPU's burst is counted in.")
    storm_min_events: int = setting(
        10, "XID storm detector: the fewest XIDs from one GPU in the window that can make a storm."
    )
    storm_owner_window_hours: float = setting(
        168.0,
        "Job-aware storms: a storm of application XIDs from the one job on its node is the job owner's; "
        "it is the GPU's when the same GPU stormed under another user's job within this many hours.",
    )
    storm_baseline_period_seconds: int = setting(
        86400,
        "Fleet stage: the period of the fleet's storm baseline (a period's events are judged against the "
        "bursts the fleet finished before the previous period began); longer than lateness + the "
        "attribution window after a job.",
    )
    storm_baseline_min_gpus: int = setting(
        10, "Fleet stage: the usual burst is never above what at least this many distinct GPUs reached."
    )
    spread_window_hours: float = setting(24.0, "NVLink flapping detector: the window errors are counted in.")
    spread_min_events: int = setting(
        6, "NVLink flapping detector: the fewest errors on a node in the window."
    )
    spread_min_gpus: int = setting(
        1, "NVLink flapping detector: the fewest distinct GPUs those errors come from."
    )
    spread_min_bursts: int = setting(
        2,
        "NVLink flapping detector: the separate bursts (more than 10 minutes apart) the errors must come "
        "in; one burst is the links going down once.",
    )
    ecc_trend_window: int = setting(4, "ECC trend detector: the samples tested together.")
    ecc_trend_floor_per_day: float = setting(
        1.0, "ECC trend detector: the lowest baseline rate of correctable errors per GPU-day."
    )
    ecc_trend_threshold: float = setting(
        6.0, "ECC trend detector: the surprise (-log10 Poisson probability) that makes an anomaly."
    )
    ecc_reference_period_seconds: int = setting(
        3600,
        "Fleet stage: how often the fleet's healthy ceiling of correctable rates (what a GPU without a "
        "past of its own is compared with) is decided.",
    )
    ecc_reference_window_seconds: int = setting(
        7 * 86400, "Fleet stage: the event time that ceiling is taken over."
    )
    ecc_reference_min_gpus: int = setting(10, "Fleet stage: the fewest GPUs whose rates make that ceiling.")
    quiet_period_by_kind: str = setting(
        "ecc_trend=172800,nvlink_flapping=86400,xid_storm=7200,job_xid_storm=7200,lemon_node=259200",
        "Quiet periods (seconds) of the slow detectors, `kind=seconds` comma-separated, longer than "
        "`quiet_period_seconds` on purpose (a degradation is seen once per ECC scrape, a lemon verdict "
        "once a day); a kind not named uses `quiet_period_seconds`.",
    )
    lemon_window_seconds: int = setting(
        28 * 86400, "Lemon nodes: the sliding window of event time (the paper: 28 days)."
    )
    lemon_evaluate_every_seconds: int = setting(6 * 3600, "Lemon nodes: how often verdicts are recomputed.")
    lemon_threshold: float = setting(
        8.0, "Lemon nodes: the summed surprise (-log10 probability) that makes a lemon."
    )
    lemon_min_signal_surprise: float = setting(
        3.0, "Lemon nodes: the surprise at least one signal must reach on its own."
    )
    lemon_min_history_seconds: int = setting(
        2 * 86400, "Lemon nodes: event time watched before the first verdict."
    )
    lemon_episode_gap_seconds: int = setting(
        6 * 3600, "Lemon nodes: critical incidents on a node closer than this are one fault episode."
    )
    lemon_prior_fault_rate: float = setting(
        6.5,
        "Lemon nodes: critical faults per 1000 node-days a healthy node is expected to have at the least "
        "(RSC-1's 6.5): a hardware signal never expects less than this rate times the node's exposure.",
    )
    lemon_min_confidence: float = setting(
        0.9,
        "Lemon nodes: the confidence a verdict needs, 1 - fleet x P(strongest signal) (the chance that no "
        "healthy node of a fleet this size shows it by luck).",
    )
    lemon_trim_share: float = setting(
        0.02,
        "Lemon nodes: the share of the fleet's top nodes of a signal left out of the reference a node is "
        "compared with (at least one, besides the node itself).",
    )
    dead_letter_max_ratio: float = setting(
        0.5, "Stop loudly when more than this fraction of a source's records are dead letters."
    )
    dead_letter_min_records: int = setting(
        200, "Records of a source seen before the dead-letter ratio is enforced."
    )
    dead_letter_max_consecutive: int = setting(
        1000,
        "Stop loudly when this many records in a row from one source are dead letters, however many "
        "good ones came before (0: no limit).",
    )
    sink_batch_rows: int = setting(50_000, "Rows buffered per table before a ClickHouse insert.")
    parse_ahead_min_bytes: int = setting(
        8 * 1024 * 1024,
        "replay and replay --to: input files at least this large are parsed in a helper process, on "
        "another CPU, while the replay runs what it parsed (the same records; skipped on one CPU). "
        "0: parse every file in process.",
    )
    parse_helpers: int = setting(
        0,
        "replay and replay --to: helper processes that parse one large uncompressed DCGM file in parts, "
        "merged into the same records (0: one per CPU but the replay's own; 1: one helper, no parts).",
    )
    kafka_bootstrap: str = setting(
        "127.0.0.1:9092",
        "Kafka bootstrap servers (host:port, comma-separated) for init-kafka, replay --to, worker, tail.",
    )
    kafka_wait_seconds: float = setting(
        0.0,
        "How long worker, notify, tail, replay --to and init-kafka wait for a Kafka broker that does not "
        "answer (down, starting), trying again with backoff and saying so every 30 s; 0: as long as it "
        "takes. A broker that refuses the login or certificate, or an unknown host name, fails at once.",
    )
    kafka_security_protocol: str = setting(
        "PLAINTEXT",
        "How every Kafka client connects: `PLAINTEXT`, `SSL` (TLS; with a client certificate if "
        "`kafka_ssl_certfile` is set), `SASL_SSL` (TLS and a SASL login) or `SASL_PLAINTEXT`.",
    )
    kafka_sasl_mechanism: str = setting(
        "SCRAM-SHA-512", "SASL mechanism of `SASL_*` protocols: `SCRAM-SHA-512`, `SCRAM-SHA-256` or `PLAIN`."
    )
    kafka_sasl_username: str = setting("", "SASL user of `SASL_*` protocols.")
    kafka_sasl_password: str = setting(
        "", "SASL password (never printed); prefer `kafka_sasl_password_file`.", secret=True
    )
    kafka_sasl_password_file: str = setting(
        "",
        "File holding the SASL password (a mounted secret; one trailing newline is ignored), read "
        "when `kafka_sasl_password` is empty.",
    )
    kafka_ssl_cafile: str = setting(
        "", "PEM file of the CA(s) that signed the brokers' certificates; empty: the system's trusted CAs."
    )
    kafka_ssl_certfile: str = setting(
        "", "PEM client certificate (chain) presented to brokers that authenticate clients by certificate."
    )
    kafka_ssl_keyfile: str = setting(
        "", "PEM private key of `kafka_ssl_certfile` (empty: the key is in the certificate file)."
    )
    kafka_ssl_key_password: str = setting(
        "", "Password of an encrypted `kafka_ssl_keyfile` (never printed).", secret=True
    )
    topic_xid: str = setting("faultstream.xid", "Input topic of XID events (key: node).")
    topic_ecc: str = setting("faultstream.ecc", "Input topic of ECC samples (key: node).")
    topic_jobs: str = setting("faultstream.jobs", "Input topic of job state changes (key: job id).")
    topic_jobs_by_node: str = setting(
        "",
        "Internal topic: job state changes re-keyed by each node of the job (empty: "
        "`<FAULTSTREAM_WORKER_APP_ID>.jobs-by-node`).",
    )
    topic_kernel_log: str = setting(
        "faultstream.kernel-log",
        "Input topic of raw kernel-log lines as log shippers send them (rsyslog omkafka, journald "
        "JSON, Vector, Fluent Bit; any key or none; one partition): the worker reads its GPU and "
        "NVSwitch driver lines (docs/collecting.md).",
    )
    topic_kernel_log_by_node: str = setting(
        "",
        "Internal topic: the XID events of the kernel-log topic, re-keyed by node (empty: "
        "`<FAULTSTREAM_WORKER_APP_ID>.kernel-log-by-node`).",
    )
    topic_remote_write_parts: str = setting(
        "",
        "Internal compacted topic of `faultstream receive`: the DCGM values of remote_write requests "
        "answered but not yet sent out as whole samples (empty: "
        "`<FAULTSTREAM_WORKER_APP_ID>.remote-write-parts`).",
    )
    topic_incidents: str = setting(
        "faultstream.incidents", "Output topic of incidents for SREs (key: incident id)."
    )
    topic_dead_letters: str = setting("faultstream.dead-letters", "Topic of records that could not be used.")
    topic_checkpoints: str = setting(
        "",
        "Internal compacted topic of the workers' detector-state checkpoints, one per input partition "
        "(empty: `<FAULTSTREAM_WORKER_APP_ID>.checkpoints`).",
    )
    topic_fleet: str = setting(
        "",
        "Internal topic (one partition): what each input partition hands the fleet stage (facts for "
        "the lemon statistics and the storm baseline, failed jobs, its event-time horizon; empty: "
        "`<FAULTSTREAM_WORKER_APP_ID>.fleet`).",
    )
    topic_fleet_baselines: str = setting(
        "",
        "Internal topic (one partition): the fleet stage's storm baselines and ECC references, read by "
        "every worker (empty: `<FAULTSTREAM_WORKER_APP_ID>.fleet-baselines`).",
    )
    topic_partitions: int = setting(
        8,
        "Partitions of the xid, ecc, jobs-by-node, kernel-log-by-node, incident and checkpoint topics "
        "(the most workers that can share the load); the jobs and kernel-log topics have one.",
    )
    topic_replication: int = setting(1, "Replication factor of the topics faultstream creates.")
    topic_retention_bytes: int = setting(
        10 * 1024**3,
        "Size kept per partition of the input topics (xid, ecc, jobs, jobs-by-node). They are "
        "retained by size, not age: their message timestamps are event times, and age retention "
        "would delete replayed history as soon as the broker looks.",
    )
    worker_app_id: str = setting("faultstream", "Faust application id: the consumer group of the workers.")
    worker_flush_seconds: float = setting(
        2.0,
        "Worker commit interval: flush ClickHouse, publish incidents, write the state checkpoint and "
        "commit offsets at least this often (and whenever a batch holds `sink_batch_rows`).",
    )
    worker_publish_seconds: float = setting(
        0.1,
        "Worker: incident updates waiting for the commit point are published sooner, at most this long "
        "after they were decided (ClickHouse flush, then the incidents topic; no checkpoint, no offset "
        "commit). 0: only at commit points.",
    )
    worker_fetch_partition_bytes: int = setting(
        16 * 1024**2,
        "Worker: the most the broker returns of one input partition in one fetch. The consumer asks "
        "for a partition's next records only once it has handed on the last fetch's, so each "
        "emptied buffer costs the agent a round trip: 1 MiB (Faust's default) is 26 messages of "
        "256 ECC samples, and the agent waited for its inputs half of a backlog's replay. At least "
        "the broker's largest message; a fetch request stays capped at 50 MiB over its partitions.",
    )
    worker_poll_bytes: int = setting(
        1024**2,
        "Worker: about how much (message values and keys) one poll hands to the agents, shared evenly "
        "by the partitions with records fetched, at least one message each. Faust hands on a whole "
        "poll before it polls again: a poll of everything fetched (up to 16 MiB a partition on a "
        "backlog) held the jobs topic's next messages, and every partition's merge waiting for their "
        "copies, behind seconds of detection work.",
    )
    worker_merge_hold_records: int = setting(
        200_000,
        "Worker: about the most records its partitions' event-time merges hold, shared evenly by the "
        "partitions it owns: an input partition of which its merge holds its share is not fetched until "
        "half of them are released. A backlog's ECC scrapes run ahead of the XIDs and jobs they are merged "
        "with; the records wait in Kafka instead of the worker's memory. 0: no bound.",
    )
    worker_join_records: int = setting(
        256,
        "Worker: consecutive one-record messages of an input partition fetched together are handed to "
        "the agents as one message of up to this many records, each still located at its own offset "
        "(0 or 1: never). Faust's per-message path held a producer sending one record a message to "
        "~3,000 records/s; nothing waits to be joined.",
    )
    worker_join_messages: int = setting(
        32,
        "Worker: consecutive messages of several records each (a publisher's batches) of the XID and "
        "ECC topics fetched together are handed to the agent as one of up to this many messages, each "
        "message's lines still located at its own offset and line (0 or 1: never). Faust's path and "
        "the worker's checks cost ~200 µs a message, ~1 µs a record at 256 records a message; nothing "
        "waits to be joined.",
    )
    worker_idle_seconds: float = setting(
        0.25,
        "Worker: an input partition silent this long, with nothing left to read (as the broker said "
        "50 ms or more after the held record arrived), no longer holds back the event-time merge. "
        "A live stream's sparse jobs topic holds every XID after a job change this long; raise it (2) "
        "for publishers that send a topic's records later than those of the other topics.",
    )
    worker_fleet_idle_seconds: float = setting(
        30.0,
        "Worker: an input partition with nothing left to read tells the fleet stage not to wait for it "
        "after this long (records it gets later that are older than the stage's horizon are not "
        "counted in the fleet statistics); long enough for a replay's publisher to reach every partition.",
    )
    worker_fleet_wait_seconds: float = setting(
        900.0,
        "Worker: a record that has waited this long for a decision of the fleet stage (a storm "
        "baseline, an ECC reference), while the stage decided nothing, goes without it, loudly (an "
        "ERROR line, faultstream_fleet_decided_without_total; results may then differ from a "
        "replay's); a warning comes after a quarter of it. On a healthy group such waits end by "
        "themselves within seconds; this ends one whose cause is outside the workers' reach (no worker "
        "owns input partition 0, say). 0: wait as long as it takes.",
    )
    worker_session_timeout_seconds: float = setting(
        10.0,
        "Worker: how long the group waits for a worker's heartbeat before it gives the worker's "
        "partitions to the others (a killed worker's partitions sit idle that long unless a replacement "
        "with its instance id comes back first); heartbeats go every third of it. Kafka's brokers accept "
        "6 to 1,800 s (group.min/max.session.timeout.ms).",
    )
    worker_instance_id: str = setting(
        "",
        "Worker: static group membership (Kafka's group.instance.id), unique per worker replica and kept "
        "across its restarts (a StatefulSet pod name, a compose service name): a replacement with the "
        "same id takes the partitions back at once, without a rebalance and without waiting for the "
        "session timeout; empty: dynamic membership (a clean stop leaves the group at once).",
    )
    metrics_port: int = setting(
        9464, "Worker: port of the Prometheus metrics endpoint (`/metrics`); 0 turns it off."
    )
    metrics_host: str = setting(
        "127.0.0.1", "Worker: address the metrics endpoint binds (0.0.0.0 inside a container)."
    )
    alertmanager_url: str = setting(
        "",
        "notify: Alertmanager base URL incidents are posted to (`http://host:9093`); `--alertmanager` wins.",
    )
    notify_group: str = setting(
        "faultstream-notify",
        "notify: consumer group holding the notifier's committed offsets on the incidents topic.",
    )
    notify_resend_seconds: float = setting(
        60.0,
        "notify: open incidents' alerts are posted again this often; each ends 4 x this after its "
        "last post, so alerts expire by themselves only if the notifier is gone.",
    )
    receive_listen: str = setting(
        "127.0.0.1:9201",
        "receive: the address Prometheus' remote_write is served on (`/api/v1/write`); an address "
        "beyond the loopback is refused unless both TLS and an authentication method are configured.",
    )
    receive_tls_cert_file: str = setting(
        "",
        "receive: PEM certificate (chain) served over TLS (https); empty: plain HTTP (loopback only).",
    )
    receive_tls_key_file: str = setting(
        "", "receive: PEM private key of `receive_tls_cert_file` (empty: the key is in the certificate file)."
    )
    receive_basic_auth_username: str = setting(
        "",
        "receive: the user of HTTP Basic authentication (Prometheus' `basic_auth`); with "
        "`receive_basic_auth_password_file`.",
    )
    receive_basic_auth_password_file: str = setting(
        "",
        "receive: file holding the Basic password (a mounted secret; surrounding whitespace ignored, "
        "as Prometheus' `password_file`); never printed.",
    )
    receive_bearer_token_file: str = setting(
        "",
        "receive: file holding the bearer token (Prometheus' `authorization: {type: Bearer, "
        "credentials_file}`; surrounding whitespace ignored); never printed. With Basic set too, "
        "either is accepted.",
    )
    receive_metrics_port: int = setting(
        9468,
        "receive: port of its Prometheus `/metrics` (on metrics_host): requests by status, 401s by "
        "reason; 0 turns it off.",
    )
    receive_settle_seconds: float = setting(
        10.0,
        "receive: a GPU's sample whose counters have not all come is sent out after gathering this long "
        "(longer than Prometheus' batch_send_deadline, 5 s by default).",
    )
    receive_max_body_bytes: int = setting(
        32 * 1024 * 1024, "receive: the largest request body taken (a larger one is a 413)."
    )
    inventory_file: str = setting(
        "",
        "The fleet's inventory (node names one a line, a CSV `node[,gpus][,model]`, or `scontrol show "
        "nodes --oneliner`): fleet-wide figures (MTBF, failures per 1,000 node-days) count its nodes; "
        "empty: the nodes the inputs name. `replay --inventory` wins.",
    )
    slurm_poll_seconds: float = setting(
        30.0,
        "slurm-jobs: how often sacct is asked for the jobs' state changes (a job's end reaches the "
        "jobs topic within about this long).",
    )
    slurm_overlap_seconds: float = setting(
        600.0,
        "slurm-jobs: each sacct window starts this long before the previous one ended, for the ends "
        "slurmdbd records late (a slow or restarted slurmctld); what was published already is not again.",
    )
    slurm_backfill_seconds: float = setting(
        3600.0, "slurm-jobs: on the first start (no cursor file) the first window starts this long ago."
    )
    slurm_cursor_file: str = setting(
        "",
        "slurm-jobs: the cursor file (the end of the last window Kafka acknowledged); empty: "
        "`slurm-jobs.cursor` in data_dir.",
    )
    slurm_command_timeout_seconds: float = setting(
        60.0,
        "slurm-jobs, remediate: a sacct, scontrol or sinfo that has not answered in this long is killed "
        "(and tried again later, with backoff).",
    )
    slurm_bin_dir: str = setting(
        "", "slurm-jobs, remediate: the folder of Slurm's client commands; empty: found on PATH."
    )
    slurm_metrics_port: int = setting(
        9466, "slurm-jobs: port of its Prometheus `/metrics` (on metrics_host); 0 turns it off."
    )
    agent_kernel_log: str = setting(
        "journal",
        "agent: the kernel log it follows: `journal` (`journalctl -k -f`), a file path (`/var/log/kern.log`; "
        "rotation by rename or copytruncate is followed), or `journal:PATH` (a `.journal` file or folder, "
        "read with `journalctl --file`/`--directory`).",
    )
    agent_node: str = setting("", "agent: the node name its records are keyed by; empty: this host's name.")
    agent_state_dir: str = setting(
        "",
        "agent: folder of its cursor and spool (keep it across restarts); empty: `agent` in data_dir.",
    )
    agent_from_start: bool = setting(
        False,
        "agent: with no cursor yet, read an existing kernel-log file from its start (default: from its "
        "end; a file that appears later is read whole, the journal from the current boot's start).",
    )
    agent_spool_max_bytes: int = setting(
        64 * 1024 * 1024,
        "agent: the on-disk spool of records Kafka has not acknowledged stays under this size; past it the "
        "oldest are dropped, counted and logged.",
    )
    agent_max_line_bytes: int = setting(
        65536,
        "agent: a longer kernel-log line (or journal entry) is cut to this many bytes (and counted).",
    )
    agent_poll_seconds: float = setting(
        0.5, "agent: how often a kernel-log file is looked at for new lines and rotation."
    )
    agent_dcgm_url: str = setting(
        "",
        "agent: the local dcgm-exporter's metrics URL (`http://127.0.0.1:9400/metrics`), scraped for ECC "
        "samples; empty: no scraping.",
    )
    agent_dcgm_seconds: float = setting(30.0, "agent: how often the dcgm-exporter is scraped.")
    agent_nvidia_smi_seconds: float = setting(
        0.0, "agent: how often `nvidia-smi -q` is run for ECC samples; 0: never."
    )
    agent_nvidia_smi_command: str = setting(
        "nvidia-smi", "agent: the nvidia-smi command (a path, or a name found on PATH)."
    )
    agent_metrics_port: int = setting(
        9469, "agent: port of its Prometheus `/metrics` (on metrics_host); 0 turns it off."
    )
    remediate_group: str = setting(
        "faultstream-remediate",
        "remediate: consumer group holding the remediator's committed offsets on the incidents topic.",
    )
    remediate_execute: bool = setting(
        False,
        "remediate: drain nodes in Slurm (`--execute` does the same); false: a dry run, every decision "
        "audited and nothing changed.",
    )
    remediate_kinds: str = setting(
        "gpu_memory,gpu_row_remap,gpu_nvlink,gpu_bus,gpu_recovery,gpu_thermal_power,nvswitch_fatal,lemon_node",
        "remediate: incident kinds whose node is drained (critical ones; lemon verdicts at any severity); "
        "application-class and job-owner kinds are refused.",
    )
    remediate_max_nodes: int = setting(
        2,
        "remediate: the breaker trips rather than have more nodes than this drained by faultstream at once.",
    )
    remediate_max_fraction: float = setting(
        0.02, "remediate: ... or more than this share of the fleet (sinfo's nodes) drained by faultstream."
    )
    remediate_max_per_hour: int = setting(
        4, "remediate: ... or more drains than this within an hour. A person resets it: docs/slurm.md."
    )
    remediate_resume: bool = setting(
        False,
        "remediate: resume a node faultstream drained once its incident resolved (never one a person "
        "drained or re-labelled).",
    )
    remediate_metrics_port: int = setting(
        9467, "remediate: port of its Prometheus `/metrics` (on metrics_host); 0 turns it off."
    )
    checkpoint_write_minutes: float = setting(2.0, "ETTR guidance: time to write one checkpoint (w_cp).")
    restart_overhead_minutes: float = setting(
        10.0, "ETTR guidance: time lost to restart a job after a failure (u0)."
    )

    def __post_init__(self) -> None:
        # The internal topics are a deployment's own: named from its application id unless set, so
        # two deployments on one broker (app ids `prod` and `canary`) never read each other's facts.
        for name, suffix in INTERNAL_TOPICS.items():
            if not getattr(self, name):
                object.__setattr__(self, name, f"{self.worker_app_id}.{suffix}")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        file_values: Mapping[str, Any] | None = None,
        check: bool = True,
        **overrides: Any,
    ) -> Settings:
        """Read the settings: the TOML file ``FAULTSTREAM_CONFIG_FILE`` names (or ``file_values``,
        read from one already: :func:`stream.configuration.read_config_file`), then the
        ``FAULTSTREAM_<FIELD>`` variables, which win over it; keyword overrides (CLI flags) win
        over both when not None. ``check``: refuse detector settings with a problem (off for
        ``faultstream config --check``, which lists them all)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if file_values is None and env.get(CONFIG_FILE_VARIABLE):
            from stream.configuration import read_config_file

            file_values, problems = read_config_file(Path(env[CONFIG_FILE_VARIABLE]))
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise SettingsError(problems[0] + more)
        values.update(file_values or {})
        for spec in fields(cls):
            name = ENV_PREFIX + spec.name.upper()
            if name not in env:
                continue
            raw = env[name]
            try:
                if spec.type in ("int", int):
                    values[spec.name] = int(raw)
                elif spec.type in ("float", float):
                    values[spec.name] = float(raw)
                else:
                    values[spec.name] = raw
            except ValueError:
                raise SettingsError(f"{name}={raw!r}: expected {spec.type}") from None
        values.update({key: value for key, value in overrides.items() if value is not None})
        settings = cls(**values)
        if check:
            settings.core_config()  # validate the derived values now, not in the middle of a run
        return settings

    def xid_overrides(self) -> tuple[Any, ...]:
        """The XID catalog overrides of ``xid_catalog_file`` (none when it is empty).

        Raises
        ------
        ValueError
            For a file that cannot be used, with the reason.
        """
        if not self.xid_catalog_file:
            return ()
        from stream.xid_overrides import load_xid_overrides

        return load_xid_overrides(Path(self.xid_catalog_file))

    def with_overrides(self, **overrides: Any) -> Settings:
        """Return a copy with the given (non-None) fields replaced (a new application id renames the
        internal topics that were named from the old one)."""
        given = {key: value for key, value in overrides.items() if value is not None}
        if given.get("worker_app_id", self.worker_app_id) != self.worker_app_id:
            for name, suffix in INTERNAL_TOPICS.items():
                if getattr(self, name) == f"{self.worker_app_id}.{suffix}":
                    given.setdefault(name, "")
        return replace(self, **given)

    @property
    def dsn(self) -> str:
        """The ClickHouse DSN to use: the configured one, or the embedded store in ``data_dir``."""
        if self.clickhouse_dsn:
            return self.clickhouse_dsn
        return "chdb://" + str(Path(self.data_dir).resolve())

    @property
    def is_embedded(self) -> bool:
        """True when the store is chdb in this process."""
        return self.dsn.startswith("chdb:")

    @property
    def reference_sizes(self) -> tuple[int, ...]:
        """Reference job sizes as integers."""
        return _ints(self.reference_job_sizes)

    def detector_problems(self) -> list[str]:
        """Every problem of the settings that configure the detectors, one line each (empty: none):
        a value out of its range, a list that does not parse, a combination the core refuses."""
        out_of_range = [
            f"{ENV_PREFIX}{name.upper()}={getattr(self, name)!r}: {why}"
            for name, (valid, why) in _DETECTOR_RANGES.items()
            if not valid(getattr(self, name))
        ]
        problems: list[str] = []
        try:
            _ints(self.reference_job_sizes)
        except ValueError:
            problems.append(
                f"{ENV_PREFIX}REFERENCE_JOB_SIZES={self.reference_job_sizes!r}: not a list of integers"
            )
        try:
            windows = _ints(self.windows_seconds)
            if not windows or any(w <= 0 for w in windows):
                raise ValueError
        except ValueError:
            problems.append(
                f"{ENV_PREFIX}WINDOWS_SECONDS={self.windows_seconds!r}: "
                "not a list of positive integer seconds"
            )
        try:
            SizeBuckets(_ints(self.size_buckets))
        except ValueError as exc:
            problems.append(f"{ENV_PREFIX}SIZE_BUCKETS={self.size_buckets!r}: {exc}")
        try:
            quiet_periods_by_kind(self.quiet_period_by_kind)
        except ValueError as exc:
            problems.append(f"{ENV_PREFIX}QUIET_PERIOD_BY_KIND={self.quiet_period_by_kind!r}: {exc}")
        if not problems:  # the lists parse: the core can say what else it refuses
            try:
                self._core_config()
            except (ValueError, ZeroDivisionError) as exc:
                if not out_of_range:
                    problems.append(f"the detector settings contradict each other: {exc}")
                elif not any(str(exc) in line for line in out_of_range):
                    problems.append(f"the detector settings are refused: {exc}")
        return out_of_range + problems

    def core_config(self) -> CoreConfig:
        """The detection core's configuration.

        Raises
        ------
        SettingsError
            Naming the first problem of :meth:`detector_problems` (and how many more there are).
        """
        problems = self.detector_problems()
        if problems:
            more = f" (and {len(problems) - 1} more: faultstream config --check)" if len(problems) > 1 else ""
            raise SettingsError(problems[0] + more)
        return self._core_config()

    def _core_config(self) -> CoreConfig:
        # Imported here: the core's modules (River among them) are for the commands that run it,
        # not for every command that reads a setting (init-kafka, tail, --help).
        from detectors.core import CoreConfig
        from detectors.lemon import LemonConfig

        seconds = 1000
        return CoreConfig(
            windows_s=_ints(self.windows_seconds),
            size_buckets=SizeBuckets(_ints(self.size_buckets)),
            allowed_lateness_ms=self.allowed_lateness_seconds * seconds,
            quiet_period_ms=self.quiet_period_seconds * seconds,
            attribution_before_ms=self.attribution_before_seconds * seconds,
            attribution_after_ms=self.attribution_after_seconds * seconds,
            gpus_per_node=self.gpus_per_node,
            ecc_keep_interval_ms=self.ecc_keep_interval_seconds * seconds,
            storm_window_hours=self.storm_window_hours,
            storm_min_events=self.storm_min_events,
            spread_window_hours=self.spread_window_hours,
            spread_min_events=self.spread_min_events,
            spread_min_gpus=self.spread_min_gpus,
            ecc_trend_window=self.ecc_trend_window,
            ecc_trend_floor_per_day=self.ecc_trend_floor_per_day,
            ecc_trend_threshold=self.ecc_trend_threshold,
            lemon=LemonConfig(
                window_ms=self.lemon_window_seconds * seconds,
                evaluate_every_ms=self.lemon_evaluate_every_seconds * seconds,
                threshold=self.lemon_threshold,
                min_signal_surprise=self.lemon_min_signal_surprise,
                min_history_ms=self.lemon_min_history_seconds * seconds,
                episode_gap_ms=self.lemon_episode_gap_seconds * seconds,
                prior_fault_rate=self.lemon_prior_fault_rate,
                min_confidence=self.lemon_min_confidence,
                trim_share=self.lemon_trim_share,
            ),
            storm_baseline_period_ms=self.storm_baseline_period_seconds * seconds,
            quiet_period_by_kind_ms=quiet_periods_by_kind(self.quiet_period_by_kind),
            storm_owner_window_hours=self.storm_owner_window_hours,
            spread_min_bursts=self.spread_min_bursts,
            storm_baseline_min_gpus=self.storm_baseline_min_gpus,
            ecc_reference_period_ms=self.ecc_reference_period_seconds * seconds,
            ecc_reference_window_ms=self.ecc_reference_window_seconds * seconds,
            ecc_reference_min_gpus=self.ecc_reference_min_gpus,
        )

    @classmethod
    def topic_env_names(cls) -> tuple[str, ...]:
        """The environment variables naming topics (``FAULTSTREAM_TOPIC_XID``, ...): what a test or
        benchmark sets to give a deployment topics of its own.

        >>> Settings.topic_env_names()[:3]
        ('FAULTSTREAM_TOPIC_XID', 'FAULTSTREAM_TOPIC_ECC', 'FAULTSTREAM_TOPIC_JOBS')
        """
        return tuple(
            ENV_PREFIX + f.name.upper()
            for f in fields(cls)
            if f.name.startswith("topic_") and f.type in (str, "str")
        )

    @classmethod
    def reference(cls) -> list[tuple[str, str, str]]:
        """``(environment variable, default, description)`` for every setting."""
        return [
            (ENV_PREFIX + spec.name.upper(), repr(spec.default), spec.metadata.get("doc", ""))
            for spec in fields(cls)
        ]
