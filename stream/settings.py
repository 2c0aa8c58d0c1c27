"""The one settings object of faultstream, read from ``FAULTSTREAM_*`` environment variables.

Every field names its environment variable; command-line flags override the environment.
The configuration reference (docs/configuration.md) is generated from this file's docstrings
(``faultstream config``), so what is documented is what is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detectors.mttf import SizeBuckets

if TYPE_CHECKING:
    from detectors.core import CoreConfig

__all__ = ["ENV_PREFIX", "INTERNAL_TOPICS", "Settings", "SettingsError"]

ENV_PREFIX = "FAULTSTREAM_"
#: The internal topics, named ``<app id>.<suffix>`` unless set (:class:`Settings`).
INTERNAL_TOPICS = {
    "topic_jobs_by_node": "jobs-by-node",
    "topic_kernel_log_by_node": "kernel-log-by-node",
    "topic_checkpoints": "checkpoints",
    "topic_fleet": "fleet",
    "topic_fleet_baselines": "fleet-baselines",
}


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


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
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``FAULTSTREAM_<FIELD>`` variables; keyword overrides (CLI flags) win when not None."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
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
        settings.core_config()  # validate the derived values now, not in the middle of a run
        return settings

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

    def core_config(self) -> CoreConfig:
        """The detection core's configuration."""
        # Imported here: the core's modules (River among them) are for the commands that run it,
        # not for every command that reads a setting (init-kafka, tail, --help).
        from detectors.core import CoreConfig

        try:
            windows = _ints(self.windows_seconds)
            buckets = SizeBuckets(_ints(self.size_buckets))
            if not windows or any(w <= 0 for w in windows):
                raise ValueError("window lengths must be positive seconds")
            _ints(self.reference_job_sizes)
        except ValueError as exc:
            raise SettingsError(f"invalid window, bucket or job-size list: {exc}") from None
        return CoreConfig(
            windows_s=windows,
            size_buckets=buckets,
            allowed_lateness_ms=self.allowed_lateness_seconds * 1000,
            quiet_period_ms=self.quiet_period_seconds * 1000,
            attribution_before_ms=self.attribution_before_seconds * 1000,
            attribution_after_ms=self.attribution_after_seconds * 1000,
            gpus_per_node=self.gpus_per_node,
            ecc_keep_interval_ms=self.ecc_keep_interval_seconds * 1000,
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
