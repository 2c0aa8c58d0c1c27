"""Running `faultstream worker` processes against the test broker, and reading what they wrote.

Each worker writes its own embedded ClickHouse store (chdb allows one process per store path), so
tests read stores through `faultstream query` subprocesses and merge the stores of several workers
the way ReplacingMergeTree would: the highest version of each key wins.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream.worker.caught_up import caught_up_on_gauges, metric_sum

if TYPE_CHECKING:
    from tests.services.chdb_sql import SqlSession

ROOT = Path(__file__).resolve().parents[2]
FLAKY_SINK_WORKER = Path(__file__).with_name("flaky_sink_worker.py")


def cli(env: dict[str, str], *args: str) -> str:
    """Run the faultstream command line; its stdout (the test fails with stderr on a non-zero exit)."""
    result = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env}, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, f"faultstream {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result.stdout


def stop_process(process: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``grace`` seconds (nothing if it has ended)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Worker:
    """One `faultstream worker` process with its own store, log file and metrics port."""

    def __init__(self, env: dict[str, str], store: Path, log: Path, *, entry: Path | None = None) -> None:
        self.store = store
        self.log_path = log
        self.metrics_port = free_port()
        self.restarts = 0
        self._command = [str(entry)] if entry else ["-m", "stream.cli"]
        self._env = {**os.environ, **env, "FAULTSTREAM_METRICS_PORT": str(self.metrics_port)}
        self._log = log.open("w")
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *self._command, "worker", "--clickhouse", f"chdb://{self.store}"],
            env=self._env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip

    def supervise(self) -> None:
        """What the stack's supervisor does (docker `restart: unless-stopped`): a worker that
        stopped itself because an input partition stalled is started again (a few times at
        most); any other exit fails the test."""
        if self.process.poll() is not None and STALLED in self.log() and self.restarts < 3:
            self.restarts += 1
            self._log.write(f"\n=== test supervisor: restart {self.restarts} after a stall ===\n")
            self._log.flush()
            self._start()
        self.assert_alive()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assert_alive(self) -> None:
        assert self.process.poll() is None, f"the worker exited early:\n{self.log()[-3000:]}"

    def metrics_text(self) -> str:
        """The worker's /metrics page (its faultstream_ lines), or why it could not be read."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                lines = response.read().decode().splitlines()
        except OSError as exc:
            return f"(metrics unavailable: {exc})"
        return "\n".join(line for line in lines if line.startswith("faultstream_") and "_created" not in line)

    def metrics_page(self) -> str | None:
        """The worker's /metrics page; None while the endpoint is not up yet."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except urllib.error.URLError:
            return None

    def metric(self, name: str, *, before_start: float | None = None, label: str = "") -> float:
        """Sum of a metric's samples on the worker's /metrics endpoint (``label``, ``key="value"``:
        those that carry it); ``before_start`` while the endpoint is not up yet (otherwise that is
        an error)."""
        page = self.metrics_page()
        if page is None:
            if before_start is None:
                raise urllib.error.URLError(
                    f"127.0.0.1:{self.metrics_port}: the worker's metrics endpoint does not answer"
                )
            return before_start
        return metric_sum(page, name, label)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end within a minute."""
        stop_process(self.process, 60)
        self._log.close()

    def kill(self) -> None:
        """kill -9: no shutdown, no last commit."""
        self.process.kill()
        self.process.wait()
        self._log.close()


#: What a worker logs when it stops itself because an input partition stalled (stream.worker.app).
STALLED = "stopping the worker so that it is restarted"


def input_topics(env: dict[str, str]) -> list[str]:
    names = ("XID", "ECC", "JOBS", "JOBS_BY_NODE", "KERNEL_LOG", "KERNEL_LOG_BY_NODE")
    return [env[f"FAULTSTREAM_TOPIC_{name}"] for name in names]


async def _progress(bootstrap: str, group: str, topics: list[str]) -> dict[str, tuple[int, int]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        tps = [TopicPartition(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())]
        ends = await consumer.end_offsets(tps)
        done: dict[str, tuple[int, int]] = {}
        for tp in tps:
            committed = (await consumer.committed(tp)) or 0
            before = done.get(tp.topic, (0, 0))
            done[tp.topic] = (before[0] + committed, before[1] + ends[tp])
        return done
    finally:
        await consumer.stop()


def progress(env: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Per input topic: (offsets the group committed, end offsets), summed over partitions."""
    return asyncio.run(
        _progress(
            env["FAULTSTREAM_KAFKA_BOOTSTRAP"],
            env["FAULTSTREAM_WORKER_APP_ID"],
            input_topics(env),
        )
    )


def wait_until_caught_up(
    env: dict[str, str], workers: list[Worker], timeout: float = 240, *, topics: list[str] | None = None
) -> None:
    """Until the group has committed every input partition to its end (jobs-by-node included) and
    no worker holds records back or has work short of a commit point (the merge releases the
    newest records once the sources are idle, and they are committed after that), each worker's
    gauges covering all it owns, and the fleet stage has read everything sent to it."""
    deadline = time.monotonic() + timeout
    while True:
        done = progress(env)
        fed = done[input_topics(env)[3]][1] if topics is None else 1  # jobs re-keyed, unless only `topics`
        committed = all(done[topic][0] >= done[topic][1] for topic in topics or done) and fed
        if committed and caught_up_on_gauges([worker.metrics_page() for worker in workers]):
            return
        for worker in workers:
            worker.supervise()
        if time.monotonic() > deadline:
            for worker in workers:  # mode's workers log every task's stack on SIGUSR1
                worker.process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            pages = "\n\n".join(f"{worker.metrics_text()}\n{worker.log_path}" for worker in workers)
            raise AssertionError(f"the workers did not commit all input in {timeout:.0f} s: {done}\n{pages}")
        time.sleep(1)


def query(store: Path, sql: str) -> list[dict]:
    out = cli({}, "query", sql, "--clickhouse", f"chdb://{store}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def newest(rows: list[dict], key: tuple[str, ...]) -> list[dict]:
    """Rows of several stores merged as ReplacingMergeTree(version) does: the highest version per key."""
    best: dict[tuple, dict] = {}
    for row in rows:
        k = tuple(row[name] for name in key)
        if k not in best or row.get("version", 0) >= best[k].get("version", 0):
            best[k] = row
    return [best[k] for k in sorted(best)]


#: What the equality tests compare of an incident (SPEC: id, kind, severity, node, GPU, first
#: evidence) beside its version and status.
INCIDENT_COLUMNS = (
    "incident_id, version, status, kind, severity, node, gpu, toString(first_evidence) AS first_evidence"
)
#: ... and of a job attribution: the verdict, the run, and the evidence it lists from every node.
ATTRIBUTION_COLUMNS = (
    "job_id, toString(start) AS start, toString(end) AS end, state, num_nodes, hardware, "
    "evidence_nodes, evidence_xids, evidence_kinds, incident_id, round(gpu_hours, 6) AS gpu_hours"
)


def results(stores: list[Path], before: str, *, dead_letters: bool = False) -> dict[str, list[dict]]:
    """Incidents, attributions and the MTTF partial rows of windows ending by `before`, merged over
    stores; with ``dead_letters``, also every dead letter's kind and reason (one per source,
    location and reason), under ``"dead_letters"``: compare that list as a list, not as a set.

    One SQL runner process per store answers its queries (a `faultstream query` process per query
    took three times as long: most of each is the interpreter's and chdb's start)."""
    from tests.services.chdb_sql import SqlSession

    incidents, attributions, partials, letters = [], [], [], {}
    for store in stores:
        session = SqlSession(store)
        try:
            if dead_letters:
                sql = "SELECT source, location, reason, record_kind FROM faultstream.dead_letters FINAL"
                letters |= {(r["source"], r["location"], r["reason"]): r for r in _rows(session, sql)}
            incidents += _rows(session, f"SELECT {INCIDENT_COLUMNS} FROM faultstream.incidents FINAL")
            attributions += _rows(
                session,
                f"SELECT {ATTRIBUTION_COLUMNS}, verdict AS version FROM faultstream.job_attributions FINAL",
            )
            partials += _rows(
                session,
                "SELECT window_seconds, window_start, job_id, run_start, version, size_bucket, "
                "round(node_hours, 6) AS nh, failures, jobs_ended FROM faultstream.mttf_partials FINAL "
                f"WHERE window_start + toIntervalSecond(window_seconds) <= toDateTime64('{before}', 3, 'UTC')",
            )
        finally:
            session.close()
    found = {
        "incidents": newest(incidents, ("incident_id",)),
        "attributions": newest(attributions, ("job_id", "start")),
        "mttf": newest(partials, ("window_seconds", "window_start", "job_id", "run_start")),
    }
    if dead_letters:
        kinds = ({"kind": r["record_kind"], "reason": r["reason"]} for r in letters.values())
        found["dead_letters"] = sorted(kinds, key=str)
    return found


def _rows(session: SqlSession, sql: str) -> list[dict]:
    answer = session.run(sql)
    assert "error" not in answer, f"{sql}: {answer['error']}"
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]


def incident_messages(env: dict[str, str]) -> list[tuple[str, int]]:
    """(incident id, version) of every message on the incidents topic, in no particular order."""
    from tests.services.kafka import consume

    partitions = int(env["FAULTSTREAM_TOPIC_PARTITIONS"])
    messages, ends = asyncio.run(
        consume(env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env["FAULTSTREAM_TOPIC_INCIDENTS"], partitions, 10**9,
                timeout=15, give_up=lambda: False)
    )  # fmt: skip
    out = []
    for message in messages:
        incident = json.loads(message.value)
        assert message.key.decode() == incident["node"], "incidents are keyed by node"
        out.append((incident["incident_id"], incident["version"]))
    assert len(out) == sum(ends.values()), "the incidents topic was not read to its end"
    return out


def assert_same_results(got: dict[str, list[dict]], expected: dict[str, list[dict]]) -> None:
    """Equal result tables, or an error naming the rows only one side has (a few per table)."""
    problems = []
    for table in expected:
        want = {json.dumps(row, sort_keys=True) for row in expected[table]}
        have = {json.dumps(row, sort_keys=True) for row in got[table]}
        if want != have:
            missing, extra = sorted(want - have)[:5], sorted(have - want)[:5]
            problems.append(f"{table}: {len(want - have)} rows missing, {len(have - want)} unexpected")
            problems += [f"  missing {row}" for row in missing] + [f"  unexpected {row}" for row in extra]
    assert not problems, "\n".join(problems)
