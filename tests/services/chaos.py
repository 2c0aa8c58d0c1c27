"""Chaos for the worker group: kill -9 at random moments, a broker restart, a ClickHouse outage.

:func:`run_chaos` publishes logs to a fresh deployment of several partitions with
``faultstream replay --to``, runs ``faultstream worker`` processes over them (each its own chdb
store: one process per chdb path) and, while they work, follows a seeded plan:

- SIGKILL a random worker when the group's committed input passes each of ``kills`` random
  fractions, and start it again at once on the same store (what a supervisor does);
- stop the broker (``stop.sh --keep``) once the publisher is done and start it again on the same
  port and data (``start.sh --restart``), once;
- fail every ClickHouse insert of every worker for ``outage_seconds``: the workers run
  ``tests/services/flaky_sink_worker.py`` (the real worker whose client's ``insert`` raises
  ``ConnectionError`` while a file exists), so the sink's retry and the commit logic are the real ones.

A worker that exits on its own (a stalled partition stops the worker by design) is started again
and counted. When everything is committed, the workers are stopped and every row they wrote is
loaded into one store with the real DDL (what a shared ClickHouse server would hold), whose tables
are compared with the embedded replay's: incidents, attributions and MTTF rows (after FINAL),
the XID, job and ECC event rows by key, the ids duplicated after FINAL, and the incidents topic
(every incident's newest version there; repeats of one id and version counted).
``tests/soak/chaos.py`` prints the report for a simulated 200-node, 30-day cluster;
``tests/e2e/test_chaos_smoke.py`` runs a short plan on the bundled example.

Run as a script, this file is the per-store step of that load (one process per chdb path)::

    python tests/services/chaos.py dump STORE DIR TAG   # each table to DIR/<table>.TAG.native
    python tests/services/chaos.py load STORE DIR       # the real DDL, then every DIR/<table>.*.native
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

KAFKA_SCRIPTS = ROOT / "tests" / "services" / "kafka"
#: Tables loaded into the combined store (the mttf_windows view is computed from mttf_partials).
TABLES = ("xid_events", "job_events", "ecc_samples", "incidents", "job_attributions", "mttf_partials",
          "dead_letters")  # fmt: skip
#: Event tables compared by their ReplacingMergeTree key (schemas/ddl.py).
EVENT_KEYS = {
    "xid_events": "cluster, node, toString(ts) AS ts, event_id",
    "job_events": "cluster, job_id, toString(ts) AS ts, state",
    "ecc_samples": "cluster, node, gpu_key, toString(ts) AS ts",
}
#: Result tables: their key and the ids a shared server must hold once after FINAL.
RESULT_KEYS = {
    "incidents": "incident_id",
    "job_attributions": "cluster, job_id, start",
    "mttf_partials": "window_seconds, window_start, job_id, run_start",
}


@dataclass
class ChaosPlan:
    """What happens to the group, drawn from one seed: kill moments as fractions of the input
    committed, the moments of the broker restart and of the outage alike."""

    seed: int
    kills: int
    workers: int
    outage_seconds: float
    broker_down_seconds: float = 5.0
    kill_at: list[float] = field(default_factory=list)
    kill_whom: list[int] = field(default_factory=list)
    restart_after: list[float] = field(default_factory=list)
    broker_at: float = 0.0
    outage_at: float = 0.0

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.kill_at = sorted(rng.uniform(0.02, 0.9) for _ in range(self.kills))
        self.kill_whom = [rng.randrange(self.workers) for _ in range(self.kills)]
        self.restart_after = [rng.uniform(0.0, 2.0) for _ in range(self.kills)]
        self.broker_at = rng.uniform(0.2, 0.7)
        self.outage_at = rng.uniform(0.1, 0.6)


@dataclass
class ChaosReport:
    """What a chaos run did and what came out of it."""

    kills: int = 0
    broker_restarts: int = 0
    broker_down_seconds: float = 0.0
    outage_seconds: float = 0.0
    flush_failures_seen: int = 0
    committed_during_outage: dict[str, int] = field(default_factory=dict)
    worker_exits: list[str] = field(default_factory=list)
    records_in: int = 0
    messages_in: int = 0
    partitions: int = 0
    workers: int = 0
    incidents_expected: int = 0
    incidents_found: int = 0
    rows_lost: dict[str, int] = field(default_factory=dict)
    rows_unexpected: dict[str, int] = field(default_factory=dict)
    #: Rows of runs ending within the attribution window of the logs' end, left out on both sides.
    decided_at_end: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    duplicate_ids_after_final: dict[str, int] = field(default_factory=dict)
    incident_messages: int = 0
    incident_repeats: int = 0
    #: Job lines re-keyed twice onto jobs-by-node (a kill between re-keying a jobs message and
    #: committing it); each repeat reaches a partition's core a second time.
    rekeyed_repeats: int = 0
    incidents_missing_on_topic: int = 0
    timeline: list[str] = field(default_factory=list)
    caught_up: bool = False
    seconds: float = 0.0
    logs: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Everything the soak promises: nothing lost, nothing extra, nothing duplicated after FINAL."""
        return (
            self.caught_up
            and not any(self.rows_lost.values())
            and not any(self.rows_unexpected.values())
            and not any(self.duplicate_ids_after_final.values())
            and self.incidents_missing_on_topic == 0
            and self.incidents_found == self.incidents_expected
        )


class ChaosWorker:
    """One worker slot: a `faultstream worker` (the flaky-sink entry) with its own store, data
    folder, log and metrics port, started again after a kill or an exit."""

    def __init__(self, env: dict[str, str], folder: Path, name: str) -> None:
        from tests.services.worker import FLAKY_SINK_WORKER, free_port

        self.name = name
        self.store = folder / f"{name}-store"
        self.log_path = folder / f"{name}.log"
        self.metrics_port = free_port()
        self._env = {**os.environ, **env, "FAULTSTREAM_DATA_DIR": str(folder / f"{name}-data"),
                     "FAULTSTREAM_METRICS_PORT": str(self.metrics_port)}  # fmt: skip
        self._entry = FLAKY_SINK_WORKER
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(self._entry), "worker", "--clickhouse", f"chdb://{self.store}"],
                env=self._env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip

    def note(self, text: str) -> None:
        with self.log_path.open("a") as log:
            log.write(f"\n=== chaos: {text} ===\n")

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        from tests.services.worker import stop_process

        if self.process is not None:
            stop_process(self.process, 60)

    def metrics_page(self) -> str | None:
        """The worker's /metrics page, or None while the endpoint does not answer."""
        import urllib.request

        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            return None

    def metric(self, name: str) -> float | None:
        """Sum of a metric's samples, or None while the endpoint does not answer."""
        from stream.worker.caught_up import metric_sum

        page = self.metrics_page()
        return None if page is None else metric_sum(page, name)

    def last_words(self) -> str:
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        for line in reversed(lines[-200:]):
            if "stopping the worker" in line or "Error" in line or "error" in line:
                return line.strip()[:300]
        return lines[-1].strip()[:300] if lines else "(empty log)"


def _run(*command: str, timeout: float = 300) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stderr[-3000:]}"
    return result.stdout


def restart_broker(run_dir: Path, down_seconds: float) -> float:
    """Stop the broker of ``run_dir`` (keeping its data), wait, start it again; seconds it was down."""
    started = time.monotonic()
    _run(str(KAFKA_SCRIPTS / "stop.sh"), "--keep", str(run_dir))
    time.sleep(down_seconds)
    _run(str(KAFKA_SCRIPTS / "start.sh"), "--restart", str(run_dir), timeout=180)
    return time.monotonic() - started


def _committed(env: dict[str, str]) -> dict[str, tuple[int, int]] | None:
    """The group's (committed, end) per input topic, or None while the broker does not answer."""
    from tests.services.worker import progress

    try:
        return progress(env)
    except Exception:  # the broker restarting, the group rebalancing: ask again next time
        return None


def _fraction(done: dict[str, tuple[int, int]], env: dict[str, str]) -> float:
    # jobs-by-node is left out: the workers make it, so its end grows with their progress.
    topics = [env[f"FAULTSTREAM_TOPIC_{name}"] for name in ("XID", "ECC", "JOBS")]
    committed = sum(done[topic][0] for topic in topics)
    end = sum(done[topic][1] for topic in topics)
    return committed / end if end else 0.0


def _finished(done: dict[str, tuple[int, int]] | None, slots: list[ChaosWorker]) -> bool:
    """wait_until_caught_up's test: every input partition committed to its end, and the workers'
    gauges say all is done (:func:`stream.worker.caught_up.caught_up_on_gauges`)."""
    from stream.worker.caught_up import caught_up_on_gauges

    if done is None or not all(c >= e for c, e in done.values()) or not any(e for _, e in done.values()):
        return False
    return caught_up_on_gauges([slot.metrics_page() for slot in slots])


def run_chaos(
    bootstrap: str,
    broker_dir: Path,
    workdir: Path,
    logs: list[Path],
    expected_store: Path,
    *,
    partitions: int = 4,
    workers: int = 3,
    kills: int = 10,
    outage_seconds: float = 30.0,
    seed: int = 15,
    records_per_message: int = 256,
    broker_restart: bool = True,
    timeout: float = 3600.0,
    say: bool = False,
    plan: ChaosPlan | None = None,
) -> ChaosReport:
    """Publish ``logs`` to a fresh deployment on the broker ``bootstrap`` (started by start.sh in
    ``broker_dir``), work it under the seeded chaos plan and compare with ``expected_store`` (the
    embedded replay of the same logs)."""
    from tests.services import kafka
    from tests.services.worker import cli

    started = time.monotonic()
    plan = plan or ChaosPlan(seed, kills, workers, outage_seconds)
    report = ChaosReport(partitions=partitions, workers=workers)
    workdir.mkdir(parents=True, exist_ok=True)

    def event(text: str) -> None:
        line = f"{time.monotonic() - started:7.1f} s  {text}"
        report.timeline.append(line)
        if say:
            print(line, flush=True)

    outage = workdir / "clickhouse-is-down"
    outage.unlink(missing_ok=True)
    env = kafka.deployment_env(bootstrap, f"chaos{uuid.uuid4().hex[:8]}", partitions,
                               FAULTSTREAM_TEST_OUTAGE_FILE=str(outage))  # fmt: skip
    cli(env, "init-kafka")
    slots = [ChaosWorker(env, workdir, f"worker{n}") for n in range(workers)]
    report.logs = [slot.log_path for slot in slots]
    publisher: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 180
        while not all(slot.metric("faultstream_commits_total") is not None for slot in slots):
            assert time.monotonic() < deadline, f"the workers did not start in 180 s: {report.logs}"
            for slot in slots:
                assert slot.exited() is None, f"{slot.name} exited at start: {slot.last_words()}"
            time.sleep(0.5)
        event(f"{workers} workers up")
        time.sleep(3)  # every worker has joined: the history arrives at a full group
        publisher = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "replay", *map(str, logs), "--to", f"kafka://{bootstrap}",
             "--no-progress", "--json", "--records-per-message", str(records_per_message)],
            env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        event("publisher started")
        published = False
        outage_started: float | None = None
        outage_mark: dict[str, tuple[int, int]] | None = None
        outage_done = outage_seconds <= 0
        broker_done = not broker_restart
        next_kill = 0
        deadline = time.monotonic() + timeout
        while True:
            if not published and publisher.poll() is not None:
                out, err = publisher.communicate()
                assert publisher.returncode == 0, f"replay --to failed: {err.decode()[-3000:]}"
                summary = json.loads(out)
                report.records_in = sum(summary["sent"].values())
                report.messages_in = sum(summary["messages"].values())
                published = True
                event(f"publisher done: {report.records_in:,} records in {report.messages_in:,} messages")
            for slot in slots:  # the supervisor: whatever stopped is started again
                code = slot.exited()
                if code is not None:
                    why = f"{slot.name} exited by itself (status {code}): {slot.last_words()}"
                    report.worker_exits.append(why)
                    event(why)
                    slot.note("restarted after an exit")
                    slot.start()
            done = _committed(env)
            fraction = _fraction(done, env) if done is not None else None
            # The outage first when both are due: a kill's rebalance could pass the whole outage
            # with no flush to fail.
            if (
                not outage_done
                and outage_started is None
                and fraction is not None
                and fraction >= plan.outage_at
            ):
                outage.touch()
                outage_started = time.monotonic()
                event(f"ClickHouse outage begins at {fraction:.0%} committed")
            # A kill due during the outage waits for its first failed flush (or its end): the
            # rebalance it starts could otherwise pass the outage with nothing flushed.
            outage_untested = outage_started is not None and not outage_done and outage_mark is None
            if (
                fraction is not None
                and next_kill < kills
                and fraction >= plan.kill_at[next_kill]
                and not outage_untested
            ):
                slot = slots[plan.kill_whom[next_kill]]
                slot.kill()
                slot.note(f"kill -9 number {next_kill + 1}")
                report.kills += 1
                event(f"kill -9 {slot.name} at {fraction:.0%} committed (kill {report.kills})")
                time.sleep(plan.restart_after[next_kill])
                slot.start()
                next_kill += 1
            if outage_started is not None and not outage_done:
                # The offsets committed from the first failed flush on (commit points that flushed
                # nothing may pass before it: the checkpoint holds their state).
                if (
                    outage_mark is None
                    and done is not None
                    and sum(slot.metric("faultstream_sink_flush_failures_total") or 0 for slot in slots)
                ):
                    outage_mark = done
                if time.monotonic() - outage_started >= outage_seconds:
                    report.flush_failures_seen = int(
                        sum(slot.metric("faultstream_sink_flush_failures_total") or 0 for slot in slots)
                    )
                    if outage_mark is not None and done is not None:
                        report.committed_during_outage = {
                            topic: done[topic][0] - outage_mark[topic][0] for topic in done
                        }
                    outage.unlink()
                    report.outage_seconds = time.monotonic() - outage_started
                    outage_done = True
                    event(f"ClickHouse outage ends after {report.outage_seconds:.0f} s "
                          f"({report.flush_failures_seen} failed flushes seen)")  # fmt: skip
            # Not during the outage: the restart blocks this loop, which would stretch the outage.
            outage_on = outage_started is not None and not outage_done
            if (
                published
                and not broker_done
                and not outage_on
                and fraction is not None
                and fraction >= plan.broker_at
            ):
                event(f"broker stops at {fraction:.0%} committed")
                report.broker_down_seconds = restart_broker(broker_dir, plan.broker_down_seconds)
                report.broker_restarts += 1
                broker_done = True
                event(f"broker back after {report.broker_down_seconds:.0f} s")
            chaos_done = next_kill >= kills and outage_done and broker_done
            if published and chaos_done and _finished(done, slots):
                report.caught_up = True
                event("every input partition committed to its end, nothing held")
                break
            if (
                published
                and not chaos_done
                and fraction is not None
                and fraction >= 1
                and _finished(done, slots)
            ):
                # The group finished before the plan did: what is left of it happens now.
                plan.kill_at[next_kill:] = [0.0] * (kills - next_kill)
                plan.broker_at = min(plan.broker_at, 0.0)
                plan.outage_at = min(plan.outage_at, 0.0)
            if time.monotonic() > deadline:
                event(f"gave up after {timeout:.0f} s: {done}")
                break
            time.sleep(1)
    finally:
        outage.unlink(missing_ok=True)
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait()
        for slot in slots:
            slot.stop()
    report.env = env
    if report.caught_up:
        _compare(report, env, slots, workdir, expected_store)
        if report.ok:  # otherwise the topics stay for a look at what went wrong
            kafka.delete_deployment_topics(env)
    report.seconds = time.monotonic() - started
    return report


def _compare(
    report: ChaosReport, env: dict[str, str], slots: list[ChaosWorker], workdir: Path, expected_store: Path
) -> None:
    """Load every worker's rows into one store and compare it with the embedded replay's."""
    from tests.services.worker import ATTRIBUTION_COLUMNS, INCIDENT_COLUMNS, incident_messages, query

    dumps = workdir / "dumps"
    dumps.mkdir(exist_ok=True)
    for slot in slots:
        _run(sys.executable, __file__, "dump", str(slot.store), str(dumps), slot.name)
    combined = workdir / "combined-store"
    _run(sys.executable, __file__, "load", str(combined), str(dumps))
    [last] = query(expected_store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    before = last["t"]
    mttf_where = (f"WHERE window_start + toIntervalSecond(window_seconds) <= toDateTime64('{before}', 3, 'UTC')")  # fmt: skip
    selects = {table: f"SELECT {keys} FROM faultstream.{table} FINAL" for table, keys in EVENT_KEYS.items()}
    selects["incidents"] = f"SELECT {INCIDENT_COLUMNS} FROM faultstream.incidents FINAL"
    selects["job_attributions"] = (
        f"SELECT {ATTRIBUTION_COLUMNS}, start AS run_start, verdict FROM faultstream.job_attributions FINAL"
    )
    selects["mttf_partials"] = (
        "SELECT window_seconds, toString(window_start) AS window_start, job_id, toString(run_start) AS run_start, "
        "version, size_bucket, round(node_hours, 6) AS nh, failures, jobs_ended "
        f"FROM faultstream.mttf_partials FINAL {mttf_where}"
    )
    selects["dead_letters"] = "SELECT source, location, reason FROM faultstream.dead_letters FINAL"
    pending = _decided_at_end(expected_store)
    for table, sql in selects.items():
        rows = {name: query(store, sql) for name, store in (("want", expected_store), ("have", combined))}
        if table in ("job_attributions", "mttf_partials"):
            for name, found in rows.items():
                kept = [row for row in found if _run_of(row) not in pending]
                if name == "want":
                    report.decided_at_end[table] = len(found) - len(kept)
                rows[name] = kept
        want = Counter(json.dumps(row, sort_keys=True) for row in rows["want"])
        have = Counter(json.dumps(row, sort_keys=True) for row in rows["have"])
        report.rows_lost[table] = sum((want - have).values())
        report.rows_unexpected[table] = sum((have - want).values())
        report.examples += [f"{table}: lost {row}" for row in sorted(want - have)[:3]]
        report.examples += [f"{table}: unexpected {row}" for row in sorted(have - want)[:3]]
        if table == "incidents":
            report.incidents_expected, report.incidents_found = sum(want.values()), sum(have.values())
    for table, key in RESULT_KEYS.items():
        [row] = query(combined, f"SELECT count() - uniqExact({key}) AS n FROM faultstream.{table} FINAL")
        report.duplicate_ids_after_final[table] = int(row["n"])
    report.rekeyed_repeats = _rekeyed_repeats(env)
    messages = incident_messages(env)
    report.incident_messages = len(messages)
    report.incident_repeats = sum(count - 1 for count in Counter(messages).values())
    newest: dict[str, int] = {}
    for incident_id, version in messages:
        newest[incident_id] = max(version, newest.get(incident_id, 0))
    expected = {row["incident_id"]: row["version"] for row in query(expected_store, selects["incidents"])}
    report.incidents_missing_on_topic = sum(newest.get(i) != v for i, v in expected.items())


def _rekeyed_repeats(env: dict[str, str]) -> int:
    """Job lines on the jobs-by-node topic that repeat an earlier line of their partition: a jobs
    message re-keyed again by the worker that took the jobs partition over from a killed one."""
    import asyncio

    from tests.services.kafka import consume

    bootstrap, topic = env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env["FAULTSTREAM_TOPIC_JOBS_BY_NODE"]
    partitions = int(env["FAULTSTREAM_TOPIC_PARTITIONS"])
    _, ends = asyncio.run(consume(bootstrap, topic, partitions, 0, 15))
    messages, _ = asyncio.run(consume(bootstrap, topic, partitions, sum(ends.values()), 300))
    lines = Counter((message.partition, line) for message in messages for line in message.value.split(b"\n"))
    return sum(count - 1 for count in lines.values())


def _decided_at_end(store: Path) -> set[tuple[str, str]]:
    """(job id, run start) of the runs that ended too close to the end of the logs for a worker to
    decide them: the embedded replay decides every pending attribution at the end of its input
    (``DetectionCore.finish``), a worker only once later events move its watermark past the run's
    end plus the attribution window, which a stream that stops never does."""
    from detectors.core import CoreConfig
    from tests.services.worker import query

    config = CoreConfig()
    [row] = query(store, "SELECT toUnixTimestamp64Milli(greatest((SELECT max(ts) FROM faultstream.xid_events), "
                         "(SELECT max(ts) FROM faultstream.ecc_samples), (SELECT max(ts) FROM faultstream.job_events))) AS t")  # fmt: skip
    cutoff = int(row["t"]) - config.allowed_lateness_ms - config.attribution_after_ms
    rows = query(store, "SELECT DISTINCT job_id, toString(start) AS run_start FROM faultstream.job_events FINAL "
                        f"WHERE toUnixTimestamp64Milli(end) >= {cutoff}")  # fmt: skip
    return {(row["job_id"], row["run_start"]) for row in rows}


def _run_of(row: dict[str, object]) -> tuple[str, str]:
    return str(row["job_id"]), str(row["run_start"])


def _dump(store: str, folder: str, tag: str) -> None:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
    for table in TABLES:
        target = Path(folder) / f"{table}.{tag}.native"
        target.unlink(missing_ok=True)
        client.command(f"INSERT INTO FUNCTION file('{target}', 'Native') SELECT * FROM faultstream.{table}")


def _load(store: str, folder: str) -> None:
    from stream.settings import Settings
    from stream.sinks.store import connect

    client = connect(Settings(clickhouse_dsn=f"chdb://{store}"))
    for table in TABLES:
        client.command(
            f"INSERT INTO faultstream.{table} SELECT * FROM file('{Path(folder)}/{table}.*.native', 'Native')"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"] and len(sys.argv) == 5:
        _dump(*sys.argv[2:5])
    elif sys.argv[1:2] == ["load"] and len(sys.argv) == 4:
        _load(*sys.argv[2:4])
    else:
        sys.exit(__doc__)
