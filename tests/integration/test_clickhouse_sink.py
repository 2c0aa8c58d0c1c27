"""The ClickHouse sink against the real engine (chdb): idempotence, latest versions, failed flushes."""

import pytest

from detectors.core import CoreConfig, DetectionCore
from schemas.outputs import DeadLetter
from schemas.records import EccSample, JobEvent, JobState, XidEvent
from stream.sinks.clickhouse import ClickHouseSink, SinkFlushError

T0 = 1_704_067_200_000
MIN = 60_000


def records():
    return [
        JobEvent(ts_ms=T0, cluster="c", job_id="j1", state=JobState.RUNNING, nodes=("n1", "n2"), gpus=16, start_ms=T0,
                 partition="train"),
        EccSample(ts_ms=T0, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00", counters={"dbe_volatile": 0}),
        *[XidEvent(ts_ms=T0 + i * MIN, cluster="c", node="n1", xid=79, pci_bus_id="0000:07:00") for i in range(1, 6)],
        EccSample(ts_ms=T0 + 10 * MIN, cluster="c", node="n1", gpu=0, pci_bus_id="0000:07:00", counters={"dbe_volatile": 2}),
        JobEvent(ts_ms=T0 + 12 * MIN, cluster="c", job_id="j1", state=JobState.FAILED, nodes=("n1", "n2"), gpus=16,
                 start_ms=T0, end_ms=T0 + 12 * MIN, partition="train"),
        XidEvent(ts_ms=T0 + 3 * 60 * MIN, cluster="c", node="n5", xid=13),
    ]  # fmt: skip


def write_all(sink):
    core = DetectionCore(CoreConfig())
    for record in records():
        assert core.process(record)
        if not isinstance(record, EccSample):
            sink.add(record)
        sink.add_emitted(core.drain())
    sink.add_emitted(core.finish())
    sink.flush()


def scalar(client, sql):
    return client.query(sql).result_rows[0][0]


def test_writing_twice_leaves_each_fact_once(store):
    client, settings = store
    db = settings.database
    write_all(ClickHouseSink(client, db))
    write_all(ClickHouseSink(client, db))
    assert scalar(client, f"SELECT count() FROM {db}.xid_events FINAL") == 6
    assert scalar(client, f"SELECT count() FROM {db}.incidents FINAL") == scalar(
        client, f"SELECT uniqExact(incident_id) FROM {db}.incidents"
    )
    kinds = client.query(
        f"SELECT kind, status, evidence_count FROM {db}.incidents FINAL ORDER BY kind"
    ).result_rows
    assert kinds == [
        ("gpu_bus", "resolved", 5),
        ("gpu_memory", "resolved", 1),
        ("job_hw_failure", "resolved", 5),
    ]
    assert (
        scalar(client, f"SELECT sum(failures) FROM {db}.mttf_windows WHERE size_bucket = 'all'") == 2
    )  # 1 h + 1 d
    node_hours = scalar(
        client,
        f"SELECT sum(node_hours) FROM {db}.mttf_windows WHERE window_seconds = 3600 AND size_bucket = 'all'",
    )
    assert node_hours == pytest.approx(2 * 12 / 60)
    rf = scalar(
        client,
        f"SELECT rf_per_1000_node_days FROM {db}.mttf_windows WHERE window_seconds = 86400 AND size_bucket = '8-63'",
    )
    assert rf == pytest.approx(1000 / (0.4 / 24))
    assert scalar(client, f"SELECT hardware FROM {db}.job_attributions FINAL") is True
    assert client.query(f"SELECT DISTINCT partition FROM {db}.job_events FINAL").result_rows == [("train",)]
    summary = scalar(client, f"SELECT summary FROM {db}.incidents FINAL WHERE kind = 'job_hw_failure'")
    assert summary.startswith("[warn] Job j1 (16 GPUs on 2 nodes, partition train) ended FAILED")
    evidence = scalar(client, f"SELECT evidence FROM {db}.incidents FINAL WHERE kind = 'job_hw_failure'")
    assert '"partition":"train"' in evidence


def test_only_the_newest_incident_version_is_kept_in_a_batch(store):
    client, settings = store
    sink = ClickHouseSink(client, settings.database)
    write_all(sink)
    raw_rows = scalar(client, f"SELECT count() FROM {settings.database}.incidents")
    assert raw_rows == 3  # five XID 79 updates collapsed into one row before the insert


class FailingClient:
    def __init__(self, real, failures):
        self.real, self.failures = real, failures

    def insert(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("ClickHouse is down")
        return self.real.insert(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_failed_flush_keeps_the_batch_and_a_retry_writes_it(store):
    client, settings = store
    sink = ClickHouseSink(FailingClient(client, failures=1), settings.database)
    sink.add(XidEvent(ts_ms=T0, cluster="c", node="n1", xid=79))
    sink.add(DeadLetter("f.log", "line 3", "unparseable XID line", b"\xffNVRM: Xid (PCI", "xid"))
    with pytest.raises(SinkFlushError, match="ClickHouse is down"):
        sink.flush()
    assert sink.pending_rows() == 2
    assert sink.flush() == 2
    assert sink.pending_rows() == 0
    raw = scalar(client, f"SELECT raw FROM {settings.database}.dead_letters")
    assert "NVRM: Xid (PCI" in raw


def test_replay_waits_out_a_clickhouse_outage_and_loses_nothing(store, caplog):
    from pathlib import Path

    from stream.inputs.parsers import parse_file
    from stream.inputs.parsers.options import ParseOptions
    from stream.replay import replay

    client, settings = store
    logs = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14" / "logs"
    flaky = FailingClient(client, failures=2)
    summary = replay([logs], settings, flaky, ParseOptions())
    assert flaky.failures == 0
    assert "ClickHouse write failed (attempt 1)" in caplog.text
    kernel_log = next(path for path in logs.iterdir() if path.name == "kernel.log")
    event_ids = {r.event_id for r in parse_file(kernel_log, ParseOptions()) if isinstance(r, XidEvent)}
    assert scalar(client, f"SELECT uniqExact(event_id) FROM {settings.database}.xid_events") == len(event_ids)
    assert scalar(client, f"SELECT count() FROM {settings.database}.incidents FINAL") == len(
        summary.incidents
    )


def test_a_store_made_before_device_gains_the_column_and_old_rows_read_gpu(store):
    """``xid_events.device`` was added to a released table: init_db ALTERs an older table."""
    from stream.sinks.store import init_db

    client, settings = store
    db = settings.database
    client.command(f"DROP TABLE {db}.xid_events")
    old_create = next(s for s in _ddl(db) if "xid_events" in s.split("(")[0])
    old_create = "\n".join(
        line for line in old_create.splitlines() if "device" not in line and "--" not in line
    )
    client.command(old_create)  # the table as the previous version created it
    client.command(
        f"INSERT INTO {db}.xid_events (event_id, ts, cluster, node, xid, xid_name, category, severity, hardware,"
        f" process, message, source, pci_bus_id) VALUES ('old', 0, 'c', 'n', 79, '', '', '', true, '', '', '', '')"
    )
    init_db(client, settings)
    sink = ClickHouseSink(client, db)
    sink.add(XidEvent(ts_ms=T0, cluster="c", node="n", xid=12028, pci_bus_id="0000:05:00", device="nvswitch"))
    sink.flush()
    rows = client.query(f"SELECT event_id, device, xid FROM {db}.xid_events FINAL ORDER BY ts").result_rows
    assert rows[0] == ("old", "gpu", 79)
    assert rows[1][1:] == ("nvswitch", 12028)


def _ddl(database):
    from schemas.ddl import ddl_statements

    return ddl_statements(database)
