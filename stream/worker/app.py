"""``faultstream worker``: the Faust application that runs the detection core on Kafka.

Topology
--------
``jobs`` (key: job) --rekey_jobs--> ``jobs-by-node`` (key: node, one copy per node of the job)
``kernel-log`` (shippers' lines) --rekey_kernel_log--> ``kernel-log-by-node`` (key: node, XID events)
``xid``, ``ecc``, ``jobs-by-node``, ``kernel-log-by-node`` (co-partitioned by node) --detect-->
ClickHouse, ``incidents``

This module is Faust's wiring only. Per assigned input partition the worker keeps one
:class:`~stream.worker.partition.PartitionWorker` (a :class:`detectors.core.DetectionCore` in a
:class:`~stream.pipeline.RecordPipeline`, fed in event-time order by an
:class:`~stream.worker.merge.EventTimeMerger` over the partition's three topics, and one batch of
the :class:`~stream.sinks.clickhouse.ClickHouseSink`); :mod:`stream.worker.runtime` applies
messages to them, :mod:`stream.worker.commit` is the commit point (flush, send, checkpoint,
commit offsets) and :mod:`stream.worker.checkpoints` the detector state a restarted or new owner
of a partition continues from.

The worker commits offsets itself (the input topics are declared without Faust acks): Faust's
offset tracking can commit past messages its agents never saw. :class:`stream.worker.positions.InputPositions`
checks that each input partition's messages arrive contiguously; a gap, or a partition with more
to read that has delivered nothing for 15 s, is read again from its first offset not applied
(logged, and counted in ``faultstream_input_rereads_total``).

What needs the whole fleet (lemon verdicts, the storm baseline, one attribution per failed job)
is the fleet stage's (:mod:`detectors.fleet`): every partition hands it facts at its commit points
over the ``fleet`` topic; the owner of input partition 0 runs it (its state is in partition 0's
checkpoint) and publishes the storm baselines on ``fleet-baselines``, which every worker reads. A
partition holds a record whose period's baseline is not known yet (at most about a day ahead of
the slowest partition), so the results do not depend on the partitioning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust
import faust.utils.venusian
from faust.tables import TableManager

from stream.configuration import describe, fingerprint
from stream.gc_tuning import tune_for_streaming
from stream.kafka.fleet import ForeignDeployment
from stream.kafka.security import KafkaSecurity
from stream.settings import Settings
from stream.sinks.clickhouse import ClickHouseSink, FlushStats
from stream.sinks.dead_letters import DeadLetterLimitExceeded
from stream.sinks.inventory import read_inventory, write_inventory
from stream.sinks.pending import PendingStore
from stream.sinks.store import connect
from stream.worker.fetching import install as install_fair_share
from stream.worker.joining import RunJoining
from stream.worker.metrics import WorkerMetrics
from stream.worker.partition import CheckpointConfiguration
from stream.worker.rekeyed import RekeyedInput, job_copies, kernel_copies
from stream.worker.runtime import WorkerRuntime, WorkerStalled, WorkerTopics

__all__ = ["build_app", "run_worker"]

_log = logging.getLogger("faultstream.worker")

#: How soon the broker is asked how far the inputs go after an assignment (then every interval).
_FIRST_REFRESH_SECONDS = 0.05
#: What stops the worker with one line (a configuration to fix), not a traceback.
_REFUSALS = (ForeignDeployment, CheckpointConfiguration)
#: How long a stop waits for the timer's round in progress (broker requests, a commit point).
_STOP_WAIT_SECONDS = 10.0

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


class _TablelessManager(TableManager):
    """Faust's table manager for an app without tables: it starts at once. Faust's waits a second
    first (for tables still being declared), and the consumer subscribes only after it: a second
    of every worker start and of every failover (docs/kafka.md#failover)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


@contextlib.contextmanager
def _without_scan_marks() -> Iterator[None]:
    """Faust marks every agent, task and web page it declares for venusian, whose scan is Faust's
    autodiscovery, which this app turns off (``autodiscover=False``): nothing reads the marks, and
    making one reads the declaring source file (``inspect.getframeinfo``, which resolves the path
    of every module loaded): 0.2 s of every worker start."""
    mark = faust.utils.venusian.attach
    faust.utils.venusian.attach = lambda *args, **kwargs: None
    try:
        yield
    finally:
        faust.utils.venusian.attach = mark


def broker_credentials(security: KafkaSecurity) -> faust.types.auth.CredentialsT | None:
    """Faust's form of the Kafka security every other client gets from
    :func:`stream.kafka.security.client_options` (Faust passes it on to its aiokafka clients).

    Parameters
    ----------
    security
        The resolved security settings.

    Returns
    -------
    CredentialsT or None
        SASL credentials (with the TLS context under ``SASL_SSL``), TLS credentials, or None for
        ``PLAINTEXT``.
    """
    context = security.ssl_context()
    if security.uses_sasl:
        # With a context Faust speaks SASL_SSL, without one SASL_PLAINTEXT.
        return faust.SASLCredentials(
            username=security.username,
            password=security.password,
            mechanism=security.mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def build_app(
    settings: Settings,
    security: KafkaSecurity | None = None,
    store: PendingStore | None = None,
    metrics: WorkerMetrics | None = None,
) -> faust.App:
    """The Faust app of a worker, configured from ``settings`` (``security``: already resolved;
    ``store``: the ClickHouse connection under way, else connected here; ``metrics``: made and
    perhaps served already, else made here). A connection under way
    goes on while Faust starts and joins the group; the first write waits for it, and an app task
    stops the worker if it fails."""
    security = security or KafkaSecurity.from_settings(settings)
    datadir = Path(settings.data_dir) / "faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.worker_app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        broker_credentials=broker_credentials(security),
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        consumer_auto_offset_reset="earliest",
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication,
        topic_allow_declare=False,
        # No leader election: nothing here runs `on_leader` (Faust's own advice for such apps).
        # With election on, every start subscribed to `<app id>-__assignor-__leader`, which
        # `topic_allow_declare=False` never creates, and aiokafka logged "[ERROR] Topic ... not
        # found in cluster metadata" on each healthy start.
        topic_disable_leader=True,
        broker_commit_every=1000,
        consumer_max_fetch_size=settings.worker_fetch_partition_bytes,
        # Failover in seconds (docs/kafka.md#failover): a killed member's partitions wait for its
        # session to time out (Faust's 60 s default made 8 of a 9-minute kill test idle), unless a
        # replacement with its static instance id takes them back at once.
        broker_session_timeout=settings.worker_session_timeout_seconds,
        broker_heartbeat_interval=settings.worker_session_timeout_seconds / 3,
        consumer_group_instance_id=settings.worker_instance_id or None,
        # Nothing is acked to Faust (the worker commits its own offsets); a rebalance must not wait
        # for them (the partition's next owner redoes them from its checkpoint).
        stream_wait_empty=False,
        datadir=str(datadir),
        TableManager=_TablelessManager,
    )
    joining = RunJoining(
        # The input topics (not the by-node copies, whose headers the worker reads).
        topics=frozenset(
            {settings.topic_xid, settings.topic_ecc, settings.topic_jobs, settings.topic_kernel_log}
        ),
        most=settings.worker_join_records,
        # The topics taken message by message (the jobs topic is re-keyed line by line); a shipper's
        # kernel-log value ends with its newline, so its runs are batches of messages.
        batch_topics=frozenset({settings.topic_xid, settings.topic_ecc, settings.topic_kernel_log}),
        batch_most=settings.worker_join_messages,
    )
    held_back = install_fair_share(app, settings.worker_poll_bytes, joining)
    kinds = {
        settings.topic_xid: "xid",
        settings.topic_ecc: "ecc",
        settings.topic_jobs_by_node: "job",
        settings.topic_kernel_log_by_node: "kernel",
    }
    # acks=False: Faust neither tracks nor commits these offsets; the commit points do.
    jobs = app.topic(settings.topic_jobs, acks=False, **_RAW)
    kernel_log = app.topic(settings.topic_kernel_log, acks=False, **_RAW)
    inputs = app.topic(*kinds, acks=False, **_RAW)
    rekeyed_jobs = RekeyedInput(
        settings.topic_jobs, "job", app.topic(settings.topic_jobs_by_node, **_RAW),
        settings.topic_jobs_by_node, job_copies(settings.cluster, settings.gpus_per_node),
    )  # fmt: skip
    rekeyed_kernel_log = RekeyedInput(
        settings.topic_kernel_log, "kernel", app.topic(settings.topic_kernel_log_by_node, **_RAW),
        settings.topic_kernel_log_by_node, kernel_copies(settings.cluster), whole_values=True,
    )  # fmt: skip
    topics = WorkerTopics(
        kinds=kinds,
        rekeyed=(rekeyed_jobs, rekeyed_kernel_log),
        incidents=app.topic(settings.topic_incidents, **_RAW),
        dead_letters=app.topic(settings.topic_dead_letters, **_RAW),
        fleet=app.topic(settings.topic_fleet, **_RAW),
        fleet_baselines=app.topic(settings.topic_fleet_baselines, **_RAW),
    )
    metrics = metrics or WorkerMetrics()

    def flushed(stats: FlushStats) -> None:
        metrics.sink_flush_seconds.observe(stats.seconds)
        metrics.sink_rows.inc(stats.rows)

    client, connecting = (connect(settings), None) if store is None else (None, store.client)
    detectors = fingerprint(settings.core_config(), settings.xid_overrides())
    sink = ClickHouseSink(
        client, settings.database, settings.sink_batch_rows, on_flush=flushed, connect=connecting,
        config=detectors,
    )  # fmt: skip
    runtime = WorkerRuntime(app, settings, topics, sink, metrics, held_back)
    # Read at start, so a bad inventory stops the worker at once with the line at fault.
    inventory = read_inventory(Path(settings.inventory_file)) if settings.inventory_file else None

    async def stop(failure: BaseException, why: str = "stopping the worker") -> None:
        """Stop the worker with one ERROR line saying why (its supervisor decides what follows)."""
        _log.error("%s: %s", why, failure)
        await app.crash(failure)

    def crash_on_error(agent: Any) -> Any:
        """Faust logs an agent's exception and carries on without it; a worker must stop instead."""

        async def run(stream: faust.StreamT[bytes]) -> None:
            try:
                await agent(stream)
            except DeadLetterLimitExceeded:
                raise  # already crashed the app, with its own message
            except _REFUSALS as exc:
                await stop(exc)  # one line, no traceback: a configuration to fix
                raise
            except Exception as exc:
                _log.exception("stopping the worker: %s failed", agent.__name__)
                await app.crash(exc)
                raise

        run.__name__ = agent.__name__
        return run

    # One message at a time: Faust's take()/take_events() buffers stalled a rebalance in tests.
    @app.agent(jobs)
    @crash_on_error
    async def rekey_jobs(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.noack().events():
            await runtime.rekey(event, rekeyed_jobs)

    @app.agent(kernel_log)
    @crash_on_error
    async def rekey_kernel_log(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.noack().events():
            await runtime.rekey(event, rekeyed_kernel_log)

    @app.agent(inputs)
    @crash_on_error
    async def detect(stream: faust.StreamT[bytes]) -> None:
        runtime.input_backlog = stream.channel.queue.qsize  # the stall watch asks it
        async for event in stream.noack().events():
            async with runtime.lock:
                await runtime.apply(event)
        # The stream ended (shutdown): uncommitted work is redone from the checkpoint on restart.

    # Often enough for both the commit points and the early publication of incident updates.
    publish_every = settings.worker_publish_seconds or settings.worker_flush_seconds

    interval = max(min(settings.worker_flush_seconds / 2, publish_every), 0.1)

    # One round of each timer loop at a time; a stop waits for the rounds in progress before it
    # closes the runtime's clients (a SIGTERM during a round's broker requests made the round fail
    # on a closed consumer, and Faust logged the clean stop as "[ERROR] Crashed
    # reason=ConsumerStoppedError"). The tick and the broker requests have a lock each: a slow
    # answer must not hold the tick up.
    tick_round = asyncio.Lock()
    refresh_round = asyncio.Lock()
    stopped = asyncio.Event()

    @app.task
    async def tick() -> None:
        # A loop, not Faust's app.timer: a tick waits for the agent's lock, under load often longer
        # than the interval, and the timer then logged "Timer ... tick is overlapping" again and
        # again on healthy workers; here the next tick starts later.
        while not app.should_stop:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.tick_wanted.wait(), interval)
            runtime.tick_wanted.clear()
            async with tick_round:
                if stopped.is_set():
                    return
                async with runtime.lock:
                    try:
                        await runtime.tick()
                    except WorkerStalled as exc:
                        # Crash-only: a restart reads everything since the last commit point again.
                        await stop(exc, "stopping the worker so that it is restarted")
                        return
                    except _REFUSALS as exc:
                        await stop(exc)
                        return

    @app.task
    async def connect_checkpoints() -> None:
        await runtime.connect_checkpoints()

    if store is not None:

        @app.task
        async def store_connected() -> None:
            # The engine starts on its thread while Faust starts (~0.3 s of chdb's start, which
            # slowed the imports beside it by as much); a failure stops the worker at once, as it
            # did when the connection was waited for before the app was built.
            await asyncio.to_thread(store.wait)
            failure = store.failure()
            if failure is not None:
                await stop(failure)

    @app.task
    async def load_inventory() -> None:
        if inventory is None:
            return
        if store is not None:
            await asyncio.to_thread(store.wait)
            if store.failure() is not None:
                return
        count = write_inventory(
            sink.client, settings.database, settings.cluster, inventory, settings.inventory_file
        )
        _log.info("fleet inventory: %d nodes from %s", count, settings.inventory_file)

    @app.task
    async def refresh() -> None:
        # The broker requests of the timer, in a loop of their own: without the agent's lock, and
        # without holding the tick up (an answer can take most of a second under load, and the
        # tick applies what the fleet stage decided).
        while not app.should_stop:
            # Soon after an assignment: until the inputs' progress is known, an input that sends
            # nothing (an unused kernel log) holds every partition's merge back.
            await app.sleep(_FIRST_REFRESH_SECONDS if runtime.progress_unknown else interval)
            async with refresh_round:
                if stopped.is_set():
                    return
                try:
                    await runtime.refresh()
                except _REFUSALS as exc:
                    await stop(exc)
                    return

    @app.on_partitions_revoked.connect
    async def forget_revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        runtime.forget(revoked)

    @app.on_partitions_assigned.connect
    async def note_assigned(_app: Any, assigned: set[Any], **_: Any) -> None:
        runtime.note_assigned()

    @app.task
    async def serve_metrics() -> None:
        # Faust runs at -l warn (its INFO is chatty); the worker's own progress is worth INFO, on a
        # handler of its own, added once Faust has set up its logging.
        handler = logging.StreamHandler(sys.__stderr__)  # mode wraps sys.stderr into its own logger
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
        ours = logging.getLogger("faultstream")
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
        _log.info("detector configuration %s", describe(settings, detectors))
        if settings.metrics_port:
            metrics.serve(settings.metrics_host, settings.metrics_port)  # if not served yet
            _log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)

    @app.on_before_shutdown.connect
    async def stop_checkpoints(_app: Any, **_: Any) -> None:
        stopped.set()

        async def rounds_done() -> None:
            await tick_round.acquire()
            await refresh_round.acquire()

        try:
            await asyncio.wait_for(rounds_done(), timeout=_STOP_WAIT_SECONDS)
        except TimeoutError:
            _log.warning("the timer's round outlasted the stop (%.0f s); stopping anyway", _STOP_WAIT_SECONDS)
        await runtime.stop()

    return app


def run_worker(
    settings: Settings,
    security: KafkaSecurity | None = None,
    store: PendingStore | None = None,
    metrics: WorkerMetrics | None = None,
) -> None:
    """Run a worker until it is stopped (``faultstream worker``). A store connection that failed
    is raised once the worker has stopped (the command's exit code says ClickHouse)."""
    with _without_scan_marks():
        app = build_app(settings, security, store, metrics)
        tune_for_streaming()
        # Faust's command line reads sys.argv, and would otherwise start a web server on
        # 0.0.0.0:6066, which two workers on one host cannot share. The worker's start still
        # declares Faust's web pages (unserved), each marked for the scan too (0.06 s).
        sys.argv = ["faultstream-worker", "worker", "-l", "warn", "--without-web"]
        try:
            app.main()
        except SystemExit:
            failure = None if store is None else store.failure()
            if failure is not None:
                raise failure from None
            raise
