"""What a real Slurm 22.05 (Debian's packages, tests/services/slurm.py) says about jobs and nodes.

The product reads ``sacct -P`` and ``sinfo -R``; these tests pin down what the real scheduler
writes there for the outcomes it cares about: a job that completes, one that exits 1, one
cancelled while running, one whose node goes down under it (with and without requeue), and a node
drained and resumed. Each test leaves every node idle for the next.
"""

from __future__ import annotations

import os
import time

import pytest

from schemas.records import JobEvent, JobState
from stream.inputs.parsers.options import ParseOptions
from stream.inputs.parsers.sacct import SACCT_COMMAND, parse_sacct
from tests.services.slurm import Slurm, marked_processes

pytestmark = pytest.mark.e2e

#: With ``Slurm.sacct``'s ``-P --noconvert -o <SACCT_FIELDS>``: every user's jobs, every record of a
#: requeued job (``--duplicates``), allocations only (no steps), up to now.
SACCT_OPTIONS = ("-a", "--duplicates", "-X", "-E", "now")


def since(seconds_ago: float = 1) -> str:
    """A ``sacct -S`` time: local time, as sacct reads it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - seconds_ago))


def rows_by_id(slurm: Slurm, start: str) -> dict[str, list[dict[str, str]]]:
    """The sacct records of the jobs since ``start``, by job id, in sacct's order."""
    rows: dict[str, list[dict[str, str]]] = {}
    for row in slurm.sacct(*SACCT_OPTIONS, "-S", start):
        rows.setdefault(row["JobID"], []).append(row)
    return rows


def test_stack_starts_within_ci_budget(slurm: Slurm) -> None:
    """munged, MariaDB, slurmdbd, slurmctld and four slurmd start in a few seconds (4-7 s here)."""
    assert slurm.timings["start"] < 30, slurm.timings
    assert slurm.node_states() == dict.fromkeys(slurm.node_names, "idle")
    assert slurm.reasons() == {}


def test_job_outcomes_in_sacct(slurm: Slurm) -> None:
    """Four jobs side by side, one a node: COMPLETED, FAILED (1:0), CANCELLED while running (as
    ``CANCELLED by <uid>``), and NODE_FAIL for the one (``--no-requeue``) whose node is set down."""
    start = since()
    completes = slurm.sbatch("sleep 1", job_name="fs-complete", nodelist="gpu-node-1", gres="gpu:8")
    fails = slurm.sbatch("exit 1", job_name="fs-fail", nodelist="gpu-node-2", gres="gpu:2")
    cancelled = slurm.sbatch("sleep 300", job_name="fs-cancel", nodelist="gpu-node-3")
    node_fails = slurm.sbatch("sleep 300", job_name="fs-node-down", nodelist="gpu-node-4", no_requeue=True)

    slurm.wait_for_state(cancelled, "RUNNING")
    slurm.run("scancel", cancelled)
    slurm.wait_for_state(node_fails, "RUNNING")
    slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=down", "reason=test")
    slurm.wait_for_state(node_fails, "NODE_FAIL")
    slurm.wait_for_state(cancelled, "CANCELLED")
    slurm.wait_for_state(completes, "COMPLETED")
    slurm.wait_for_state(fails, "FAILED")
    assert slurm.reasons() == {"gpu-node-4": "test"}
    slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=resume")
    slurm.wait_for_nodes("idle")

    rows = rows_by_id(slurm, start)
    assert sorted(rows) == sorted([completes, fails, cancelled, node_fails])
    assert all(len(records) == 1 for records in rows.values()), rows
    (a,), (b,), (c,), (d,) = rows[completes], rows[fails], rows[cancelled], rows[node_fails]
    for row, node in ((a, "gpu-node-1"), (b, "gpu-node-2"), (c, "gpu-node-3"), (d, "gpu-node-4")):
        assert row["NodeList"] == node and row["NNodes"] == "1", row
        assert row["User"] == "root" and row["Partition"] == "gpu" and row["Cluster"] == "faultstream", row
        assert row["Start"] not in ("", "None", "Unknown") and row["End"] >= row["Start"], row
    assert (a["State"], a["ExitCode"], a["JobName"]) == ("COMPLETED", "0:0", "fs-complete")
    assert a["AllocTRES"] == "billing=1,cpu=1,gres/gpu=8,node=1"
    assert (b["State"], b["ExitCode"]) == ("FAILED", "1:0")
    assert "gres/gpu=2" in b["AllocTRES"]
    # scancel as root: the state names the uid that cancelled; the allocation's exit code stays
    # 0:0 (the job ends when slurmctld cancels it, before its batch step dies of SIGTERM).
    assert (c["State"], c["ExitCode"]) == ("CANCELLED by 0", "0:0")
    assert (d["State"], d["ExitCode"]) == ("NODE_FAIL", "0:0")


def test_requeue_on_node_failure(slurm: Slurm) -> None:
    """A batch job is requeued when its node fails (JobRequeue=1, Slurm's default): the failed run
    is a NODE_FAIL record that only ``--duplicates`` shows; without it sacct shows the job's
    latest record, pending again, then however that run ends (which is why the product's
    SACCT_COMMAND and the slurm-jobs collector ask with ``--duplicates``). The requeued run is eligible
    only about two minutes later, so ``-E now`` leaves it out until then."""
    start = since()
    job = slurm.sbatch("sleep 300", job_name="fs-requeue", nodelist="gpu-node-1")
    slurm.wait_for_state(job, "RUNNING")
    slurm.run("scontrol", "update", "nodename=gpu-node-1", "state=down", "reason=test")
    failed = slurm.wait_for_state(job, "NODE_FAIL")
    assert failed["NodeList"] == "gpu-node-1" and failed["ExitCode"] == "0:0", failed
    slurm.wait_for_state(job, "PENDING")
    assert [row["State"] for row in slurm.sacct("-X", "-j", job)] == ["PENDING"]
    slurm.run("scancel", job)
    slurm.wait_for_state(job, "CANCELLED")
    slurm.run("scontrol", "update", "nodename=gpu-node-1", "state=resume")
    slurm.wait_for_nodes("idle")

    fields = "JobID,State,Submit,Eligible,Start,End,NodeList"
    records = slurm.sacct("-X", "--duplicates", "-j", job, fields=fields)
    assert [row["State"].split()[0] for row in records] == ["NODE_FAIL", "CANCELLED"]
    requeued = records[1]
    assert requeued["Start"] == "None" and requeued["NodeList"] == "None assigned", requeued
    assert requeued["Submit"] == failed["End"] and requeued["Eligible"] > requeued["End"], requeued
    assert [row["State"].split()[0] for row in slurm.sacct("-X", "-j", job)] == ["CANCELLED"]
    assert [row["State"] for row in rows_by_id(slurm, start)[job]] == ["NODE_FAIL"]


def test_drain_reason_in_sinfo(slurm: Slurm) -> None:
    """``sinfo -R`` names a drained node (``%n``: its host name, which is its node name) with the
    reason given, and nothing once it is resumed."""
    slurm.run("scontrol", "update", "nodename=gpu-node-2", "state=drain", "reason=faultstream test")
    assert slurm.reasons() == {"gpu-node-2": "faultstream test"}
    assert slurm.run("sinfo", "-R", "-h", "-o", "%n|%E").stdout == "gpu-node-2|faultstream test\n"
    assert slurm.node_states()["gpu-node-2"] == "drained"
    slurm.run("scontrol", "update", "nodename=gpu-node-2", "state=resume")
    assert slurm.reasons() == {}
    assert slurm.run("sinfo", "-R", "-h", "-o", "%n|%E").stdout == ""
    slurm.wait_for_nodes("idle")


def test_jobcomp_script_environment(slurm: Slurm) -> None:
    """``jobcomp/script`` works in this build: the script gets the job's id, state, nodes, times
    (epoch seconds), partition, user and exit code in its environment."""
    job = slurm.sbatch("exit 3", job_name="fs-jobcomp", nodelist="gpu-node-3", gres="gpu:4")
    slurm.wait_for_state(job, "FAILED")
    env = slurm.jobcomp_env(job, "FAILED")
    assert env["JOBID"] == job and env["JOBSTATE"] == "FAILED"
    assert env["NODES"] == "gpu-node-3" and env["PARTITION"] == "gpu" and env["USERNAME"] == "root"
    assert env["EXITCODE"] == "3:0" and env["JOBNAME"] == "fs-jobcomp" and env["CLUSTER"] == "faultstream"
    assert int(env["SUBMIT"]) <= int(env["START"]) <= int(env["END"])


def test_product_reads_live_sacct(slurm: Slurm) -> None:
    """The product's own sacct command line (SACCT_COMMAND) and parser on
    this scheduler's output: no dead letter, and each outcome as the product's JobState."""
    start = since()
    completes = slurm.sbatch("sleep 1", job_name="fs-parse", nodelist="gpu-node-1", gres="gpu:8")
    fails = slurm.sbatch("exit 1", job_name="fs-parse-fail", nodelist="gpu-node-2", gres="gpu:2")
    cancelled = slurm.sbatch("sleep 300", job_name="fs-parse-cancel", nodelist="gpu-node-3")
    node_fails = slurm.sbatch("sleep 300", job_name="fs-parse-down", nodelist="gpu-node-4", no_requeue=True)
    slurm.wait_for_state(cancelled, "RUNNING")
    slurm.run("scancel", cancelled)
    slurm.wait_for_state(node_fails, "RUNNING")
    slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=down", "reason=test")
    for job, state in (
        (completes, "COMPLETED"),
        (fails, "FAILED"),
        (cancelled, "CANCELLED"),
        (node_fails, "NODE_FAIL"),
    ):
        slurm.wait_for_state(job, state)
    slurm.run("scontrol", "update", "nodename=gpu-node-4", "state=resume")
    slurm.wait_for_nodes("idle")

    argv = SACCT_COMMAND.replace("YYYY-MM-DD", start).split()
    out = slurm.run(*argv, env={"TZ": "UTC"}).stdout
    records = list(parse_sacct(out.encode().splitlines(), ParseOptions(cluster="x", timezone="UTC"), "live"))
    events = [record for record in records if isinstance(record, JobEvent)]
    assert len(events) == len(records), [record for record in records if not isinstance(record, JobEvent)]
    final = {event.job_id: event for event in events if event.state.is_terminal}
    assert {job: final[job].state for job in (completes, fails, cancelled, node_fails)} == {
        completes: JobState.COMPLETED,
        fails: JobState.FAILED,
        cancelled: JobState.CANCELLED,
        node_fails: JobState.NODE_FAIL,
    }
    assert final[completes].gpus == 8 and final[completes].nodes == ("gpu-node-1",)
    assert final[fails].gpus == 2 and final[fails].exit_code == "1:0"
    assert final[node_fails].nodes == ("gpu-node-4",) and final[node_fails].start_ms is not None
    assert {final[job].cluster for job in final} == {"faultstream"}
    running = {event.job_id for event in events if event.state is JobState.RUNNING}
    assert {completes, fails, cancelled, node_fails} <= running


def test_stop_leaves_nothing_running(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A running job outlives slurmd under proctrack/linuxproc; stop() ends it too."""
    folder = tmp_path_factory.mktemp("slurm-stop")
    slurm = Slurm(folder, cluster="stoptest", nodes=2, gpus_per_node=0)
    with slurm:
        job = slurm.sbatch("sleep 300", job_name="left-running")
        slurm.wait_for_state(job, "RUNNING")
        pids = [daemon.pid for daemon in slurm.daemons]
        assert len(pids) == 6  # munged, mariadbd, slurmdbd, slurmctld, two slurmd
        assert marked_processes(str(slurm.folder))
    print(slurm.timings, slurm.leftovers)
    assert marked_processes(str(slurm.folder)) == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
