"""`faultstream explain` with a store: a pasted line's job context and its owner's incident.

The commands run in processes of their own: chdb opens one store path per process, and the test
session's process has its own (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "stream.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"faultstream {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def test_with_a_store_a_line_shows_its_job_context_and_the_owners_incident(tmp_path: Path) -> None:
    """The issue's case: a user's debug jobs crash on every node with XID 13. Replayed into a
    store, a pasted line of one of them names the job and its owner, and the incident addressed
    to the owner; the same code on a node without a job in the store says so."""
    header = "JobID|JobIDRaw|JobName|User|Partition|Cluster|State|Submit|Start|End|NNodes|NodeList|AllocTRES|ExitCode"
    jobs, lines = [header], []
    for n in range(12):
        node, job_id = f"node{n % 6 + 1:04d}", str(500 + n)
        start, end = (
            f"2024-03-0{1 + n // 6}T{n % 6 * 2 + 1:02d}:00:00",
            f"2024-03-0{1 + n // 6}T{n % 6 * 2 + 1:02d}:30:00",
        )
        jobs.append(
            f"{job_id}|{job_id}|debug|dbg|dev|c1|FAILED|{start}|{start}|{end}|1|{node}|gres/gpu=8,node=1|1:0"
        )
        lines.append(f"{end[:14]}28:00+00:00 {node} kernel: NVRM: Xid (PCI:0000:07:00): 13, pid=77, name=python, "
                     "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address")  # fmt: skip
    (tmp_path / "sacct.txt").write_text("\n".join(jobs) + "\n")
    (tmp_path / "kernel.log").write_text("\n".join(lines) + "\n")
    store = f"chdb://{tmp_path / 'store'}"
    cli(
        "replay",
        str(tmp_path / "sacct.txt"),
        str(tmp_path / "kernel.log"),
        "--clickhouse",
        store,
        "--no-progress",
    )
    quiet = "2024-03-01T05:00:00+00:00 node0009 kernel: NVRM: Xid (PCI:0000:07:00): 13, pid=1, name=python, x"
    out = cli("explain", "--year", "2024", "--clickhouse", store, "--json", lines[7], quiet)
    crashed, idle = json.loads(out)
    [job] = crashed["jobs"]
    assert (job["job_id"], job["user"], job["name"], job["partition"], job["state"], job["gpus"]) == (
        "507",
        "dbg",
        "debug",
        "dev",
        "FAILED",
        8,
    )
    [incident] = crashed["owner_incidents"]
    assert incident["owner"] == "dbg"
    assert "Application errors follow user dbg's jobs (partition dev)" in incident["summary"]
    assert idle["jobs"] == [] and idle["owner_incidents"] == []
    text = cli("explain", "--year", "2024", "--clickhouse", store, lines[7])
    assert "jobs:         507 of dbg (debug, partition dev, 1 node(s), 8 GPUs" in text
    assert "verdict:      application-class, and the errors follow user dbg: not the node's" in text
    assert "owner:" in text and "to user dbg" in text
