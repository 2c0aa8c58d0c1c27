"""A short chaos soak in CI: the bundled example through two workers on two partitions while
ClickHouse fails, workers are killed with SIGKILL and the broker restarts; nothing may be lost.

tests/soak/chaos.py runs the long version (a simulated 200-node, 30-day cluster, ten kills, a
30 s outage) and prints its figures; tests/services/chaos.py says how the chaos is made. The
smoke starts a broker of its own (tests/services/kafka/start.sh, a few seconds): it stops and
restarts it, which the suite's shared broker must not suffer under other tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.chaos import KAFKA_SCRIPTS, ChaosPlan, run_chaos

pytestmark = pytest.mark.e2e

LOGS = Path(__file__).resolve().parents[2] / "examples" / "sim-48x14" / "logs"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A broker for this test alone, in its own folder: (bootstrap, folder)."""
    folder = tmp_path / "kafka"
    started = subprocess.run(
        [str(KAFKA_SCRIPTS / "start.sh"), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert started.returncode == 0, f"start.sh failed:\n{started.stderr[-3000:]}"
    try:
        yield started.stdout.strip().splitlines()[-1].split("=", 1)[1], folder
    finally:
        subprocess.run([str(KAFKA_SCRIPTS / "stop.sh"), str(folder)], timeout=120, check=False)


def test_kills_a_broker_restart_and_a_clickhouse_outage_lose_nothing(
    own_broker: tuple[str, Path], tmp_path: Path, embedded_store: Path
) -> None:
    bootstrap, folder = own_broker
    # The outage from the publisher's start, so that the first records meet it: a worker has rows
    # at its next commit point and its flush fails (from 2 %, the loop once first saw 43 %, killed
    # first, and the rebalance outlasted the outage). Then the broker restart and two kills while
    # the input is worked.
    plan = ChaosPlan(seed=15, kills=2, workers=2, outage_seconds=8, broker_down_seconds=2)
    plan.outage_at, plan.kill_at, plan.broker_at = 0.0, [0.3, 0.6], 0.45
    report = run_chaos(
        bootstrap, folder, tmp_path / "run", [LOGS], embedded_store,
        partitions=2, workers=2, kills=2, outage_seconds=8, records_per_message=32, plan=plan, timeout=400,
    )  # fmt: skip
    timeline = "\n".join(report.timeline)
    assert report.caught_up, f"the workers did not finish:\n{timeline}\n{report.logs}"
    assert report.kills == 2 and report.broker_restarts == 1, timeline
    assert report.flush_failures_seen > 0, (
        f"no flush failed during the outage: nothing was tested\n{timeline}"
    )
    problems = f"{report.rows_lost}, {report.rows_unexpected}\n" + "\n".join(report.examples)
    # Every input row is there once, every incident, and no id twice after FINAL.
    for table in ("xid_events", "job_events", "ecc_samples"):
        assert report.rows_lost[table] == report.rows_unexpected[table] == 0, problems
    assert report.incidents_found == report.incidents_expected > 10, problems
    assert not any(report.duplicate_ids_after_final.values()), report.duplicate_ids_after_final
    # A kill between re-keying a jobs message and committing it makes the next owner re-key it
    # again (report.rekeyed_repeats counts those lines on jobs-by-node): each copy carries its
    # source offset, and the cores skip a repeat (faultstream_rekey_repeats_total), so the tables
    # are equal all the same.
    assert report.ok, f"{report.rekeyed_repeats} job lines re-keyed twice; {problems}"
    assert report.incidents_missing_on_topic == 0
