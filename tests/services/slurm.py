"""A real single-host Slurm (Debian's 22.05 packages) with accounting, started by tests on 127.0.0.1.

Everything runs from one temporary folder, as root, on free ports, and is stopped by PID:

* ``munged`` with its own key, socket, pid, log and seed files, run with ``--force`` (it refuses
  a socket under pytest's 0700 temporary folders otherwise). ``AuthInfo=socket=...`` points
  Slurm's RPCs at it and ``AccountingStoragePass=socket=...`` the connections to slurmdbd: Slurm
  22.05 authenticates those with the accounting password's options, not ``AuthInfo``;
* MariaDB from a fresh datadir (``mariadb-install-db``), TCP on 127.0.0.1 only, with a user and a
  database of its own for slurmdbd;
* ``slurmdbd`` (``accounting_storage/mysql``), so ``sacct`` answers from a real database;
* ``slurmctld`` and one ``slurmd`` per node: Debian's build runs several slurmd on one host
  (``NodeName=gpu-node-N NodeAddr=127.0.0.1 Port=<its own>``, ``slurmd -N gpu-node-N``; the host
  name is left to default to the node name, so ``sinfo -o %n`` shows ``gpu-node-N`` as on a real
  cluster rather than ``localhost`` for all), each node with one CPU (one job at a time, so a test
  knows where its jobs run) and ``gres/gpu`` backed by empty files standing for ``/dev/nvidia*``
  (Slurm drops a GPU without ``File=``), so ``AllocTRES`` says ``gres/gpu=N`` as on a GPU cluster.

Optionally ``JobCompType=jobcomp/script``: a script of the caller's, or (``jobcomp=True``) one that
writes the environment slurmctld gives it to ``jobcomp/<JOBID>_<JOBSTATE>.env``
(:meth:`Slurm.jobcomp_env`).

Client commands (``sbatch``, ``sacct``, ...) find this cluster through ``SLURM_CONF``:
:meth:`Slurm.run` sets it, and :attr:`Slurm.env` holds it for a test's own subprocesses.

Stopping sends SIGTERM to slurmd, slurmctld, slurmdbd, mariadbd and munged in that order, killing
any that has not exited after a few seconds; then the processes left behind by this instance
(slurmstepd and job processes outlive slurmd with ``proctrack/linuxproc``) are found by a
variable only this instance sets in their environment, and ended by PID the same way.

A missing package fails the test with the packages to install: ``tests/setup`` installs them as
root on Debian.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import pytest

from tests.services.worker import free_port, stop_process

#: The Debian packages the service needs (slurmdbd brings slurm-wlm-mysql-plugin).
PACKAGES = "munge slurmctld slurmd slurm-client slurmdbd mariadb-server"

#: The columns the tests read from ``sacct -P``.
SACCT_FIELDS = (
    "JobID,JobIDRaw,State,Submit,Start,End,NodeList,NNodes,AllocTRES,ExitCode,JobName,User,Partition,Cluster"
)

#: Set in every process this service starts, hence in slurmstepd and the jobs: how the leftovers
#: of one instance are told from anything else on the machine.
MARKER = "FAULTSTREAM_TEST_SLURM"

_BINARIES = {
    "munged": "munge",
    "munge": "munge",
    "mariadb-install-db": "mariadb-server",
    "mariadbd": "mariadb-server",
    "mariadb": "mariadb-server",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sacctmgr": "slurm-client",
    "sbatch": "slurm-client",
    "sacct": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
}
_MYSQL_PLUGIN = "/usr/lib/*/slurm-wlm/accounting_storage_mysql.so"

T = TypeVar("T")


def binaries() -> dict[str, str]:
    """The path of every program the service runs; the test fails naming the packages if any is missing."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = {name: shutil.which(name, path=path) for name in _BINARIES}
    missing = sorted({_BINARIES[name] for name, where in found.items() if where is None})
    if not list(Path("/").glob(_MYSQL_PLUGIN.lstrip("/"))):
        missing.append("slurmdbd (its slurm-wlm-mysql-plugin)")
    if missing:
        pytest.fail(
            f"the Slurm test service lacks {', '.join(missing)}: "
            f"apt-get install -y --no-install-recommends {PACKAGES} (tests/setup does, as root)",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("the Slurm test service runs munged, MariaDB and Slurm's daemons as root", pytrace=False)
    return {name: str(where) for name, where in found.items()}


class Daemon:
    """One foreground daemon with its log file; stopped by PID."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.log_path = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace: float = 5) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
        stop_process(self.process, grace)


class Slurm:
    """A Slurm cluster on this host: munged, MariaDB, slurmdbd, slurmctld and ``nodes`` slurmd.

    Parameters
    ----------
    folder
        Where everything lives (configs, state, spool, logs, the database); created if missing.
    cluster
        ``ClusterName`` (Slurm wants it lower case).
    nodes
        How many nodes, named ``gpu-node-1`` ... on one host, each its own slurmd.
    gpus_per_node
        ``Gres=gpu:N`` of each node (0: no GRES).
    jobcomp
        ``True``: ``jobcomp/script`` with a script recording its environment (:meth:`jobcomp_env`);
        a path: that script as ``JobCompLoc``; ``False``: no job completion plugin.
    min_job_age
        ``MinJobAge``: seconds a finished job stays in slurmctld's memory (sacct keeps it).

    Use it as a context manager (``with Slurm(folder) as slurm:``), or call :meth:`start` and
    :meth:`stop`. :attr:`timings` holds how long each step took, in seconds.
    """

    def __init__(
        self,
        folder: Path,
        *,
        cluster: str = "faultstream",
        nodes: int = 4,
        gpus_per_node: int = 8,
        jobcomp: bool | str | Path = False,
        min_job_age: int = 2,
        timeout: float = 60,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {nodes}")
        self.folder = Path(folder).resolve()
        self.cluster = cluster.lower()
        self.node_names = [f"gpu-node-{n}" for n in range(1, nodes + 1)]
        self.gpus_per_node = gpus_per_node
        self.min_job_age = min_job_age
        self.timeout = timeout
        self.conf = self.folder / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.folder)}
        self.jobcomp_dir = self.folder / "jobcomp"
        self._jobcomp = jobcomp
        self.daemons: list[Daemon] = []
        self.timings: dict[str, float] = {}
        #: The command lines of the processes :meth:`stop` found left behind by slurmd (jobs, slurmstepd).
        self.leftovers: list[str] = []
        self._bin: dict[str, str] = {}

    # --- start

    def __enter__(self) -> Slurm:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the whole stack; return when every node is idle (a failure stops what started).

        The ports are picked free just before the daemons bind them; another process of a busy
        machine (the suite runs two pytest processes) may take one in between. A start that fails
        so ("Address already in use") is tried again from an empty folder, with new ports, twice.
        """
        for attempt in range(1, 4):
            try:
                self._start_once()
                return
            except BaseException as error:
                logs = "".join(
                    path.read_text(errors="replace") for path in (self.folder / "log").glob("*.out")
                )
                collided = "Address already in use" in f"{error}{logs}"
                if not collided or attempt == 3:
                    raise
                shutil.rmtree(self.folder)
                self.folder.mkdir(parents=True)

    def _start_once(self) -> None:
        self._bin = binaries()
        started = time.monotonic()
        try:
            self._timed("layout", self._layout)
            self._timed("munged", self._start_munged)
            self._timed("mariadb", self._start_mariadb)
            self._timed("slurmdbd", self._start_slurmdbd)
            self._timed("slurmctld", self._start_slurmctld)
            self._timed("slurmd", self._start_slurmd)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - started

    def _timed(self, step: str, action: Callable[[], None]) -> None:
        began = time.monotonic()
        action()
        self.timings[step] = time.monotonic() - began

    def _layout(self) -> None:
        for sub in ("etc", "munge", "mysql", "log", "state", "jobs", "dev"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        # munged wants its socket's folder searchable by all, its key readable by it alone.
        (self.folder / "munge").chmod(0o755)
        for name in self.node_names:
            (self.folder / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self.mysql_socket = self.folder / "mysql" / "mysqld.sock"
        for path in (self.munge_socket, self.mysql_socket):
            if len(str(path)) > 100:
                raise ValueError(f"{path} is too long for a Unix socket: use a shorter folder")
        self.mysql_port = free_port()
        self.dbd_port = free_port()
        self.ctld_port = free_port()
        self.slurmd_ports = {name: free_port() for name in self.node_names}
        self.devices = [self.folder / "dev" / f"nvidia{index}" for index in range(self.gpus_per_node)]
        for device in self.devices:
            device.touch()
        if self._jobcomp is True:
            self.jobcomp_dir.mkdir(exist_ok=True)
            script = self.folder / "etc" / "jobcomp.sh"
            script.write_text(
                "#!/bin/sh\n# jobcomp/script: record the environment slurmctld gives this script.\n"
                f'env > "{self.jobcomp_dir}/$JOBID"_"$JOBSTATE".env.tmp\n'
                f'mv "{self.jobcomp_dir}/$JOBID"_"$JOBSTATE".env.tmp "{self.jobcomp_dir}/$JOBID"_"$JOBSTATE".env\n'
            )
            script.chmod(0o755)
            self.jobcomp_script: Path | None = script
        elif self._jobcomp:
            self.jobcomp_script = Path(self._jobcomp).resolve()
        else:
            self.jobcomp_script = None

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        daemon = Daemon(name, argv, self.folder / "log" / f"{name}.out", self.env, self.folder)
        self.daemons.append(daemon)
        return daemon

    def _wait(self, what: str, ready: Callable[[], T | None], timeout: float | None = None) -> T:
        """Poll ``ready`` until it returns something; fail if a daemon exits or time runs out."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for daemon in self.daemons:
                if not daemon.alive():
                    raise AssertionError(
                        f"{daemon.name} exited (code {daemon.process.returncode}) while waiting for {what}:\n"
                        f"{daemon.log()[-3000:]}"
                    )
            result = ready()
            if result is not None:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not ready in {timeout or self.timeout:.0f} s\n{self.logs_tail()}"
                )
            time.sleep(0.1)

    def _start_munged(self) -> None:
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o400)
        munge = self.folder / "munge"
        self._daemon(
            "munged",
            [
                self._bin["munged"], "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.folder / 'log' / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}",
            ],
        )  # fmt: skip

        def encodes() -> bool | None:
            if not self.munge_socket.exists():
                return None
            check = subprocess.run(
                [self._bin["munge"], "-n", "-S", str(self.munge_socket)],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip
            return True if check.returncode == 0 else None

        self._wait("munged", encodes)

    def _start_mariadb(self) -> None:
        mysql = self.folder / "mysql"
        my_cnf = mysql / "my.cnf"
        my_cnf.write_text(
            f"""[mysqld]
datadir={mysql / "data"}
socket={self.mysql_socket}
pid-file={mysql / "mariadbd.pid"}
log-error={self.folder / "log" / "mariadbd.err"}
port={self.mysql_port}
bind-address=127.0.0.1
user=root
skip-name-resolve
performance_schema=OFF
innodb_buffer_pool_size=64M
innodb_log_file_size=8M
innodb_lock_wait_timeout=900
innodb_flush_log_at_trx_commit=0
"""
        )
        install = subprocess.run(
            [self._bin["mariadb-install-db"], f"--defaults-file={my_cnf}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, timeout=120, check=False, cwd=self.folder,
        )  # fmt: skip
        assert install.returncode == 0, (
            f"mariadb-install-db:\n{install.stdout[-2000:]}{install.stderr[-2000:]}"
        )
        self._daemon("mariadbd", [self._bin["mariadbd"], f"--defaults-file={my_cnf}"])
        self.db_password = secrets.token_hex(12)
        self._wait("mariadbd", lambda: True if self._sql("SELECT 1", check=False) else None)
        grants = "".join(
            f"CREATE USER 'slurm'@'{host}' IDENTIFIED BY '{self.db_password}';"
            f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{host}';"
            for host in ("127.0.0.1", "localhost")
        )
        self._sql(f"CREATE DATABASE slurm_acct_db;{grants}")

    def _sql(self, statements: str, *, check: bool = True) -> bool:
        """Run SQL as MariaDB's root over the Unix socket."""
        result = subprocess.run(
            [self._bin["mariadb"], "--no-defaults", f"--socket={self.mysql_socket}", "-uroot", "-e", statements],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if check:
            assert result.returncode == 0, f"mariadb -e {statements!r}:\n{result.stderr}"
        return result.returncode == 0

    def _start_slurmdbd(self) -> None:
        self._write_configs()
        self._daemon("slurmdbd", [self._bin["slurmdbd"], "-D"])
        self._wait("slurmdbd", lambda: True if _listening(self.dbd_port) else None)
        clusters = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster").stdout.split()
        if self.cluster not in clusters:
            self.run("sacctmgr", "-i", "add", "cluster", self.cluster)

    def _write_configs(self) -> None:
        etc = self.folder / "etc"
        log = self.folder / "log"
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(
            f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
LogFile={log / "slurmdbd.log"}
PidFile={self.folder / "state" / "slurmdbd.pid"}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.mysql_port}
StorageUser=slurm
StoragePass={self.db_password}
StorageLoc=slurm_acct_db
"""
        )
        dbd.chmod(0o600)
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        node_lines = "".join(
            f"NodeName={name} NodeAddr=127.0.0.1 Port={self.slurmd_ports[name]} "
            f"CPUs=1 RealMemory=1000{gres} State=UNKNOWN\n"
            for name in self.node_names
        )
        jobcomp = (
            f"JobCompType=jobcomp/script\nJobCompLoc={self.jobcomp_script}\n" if self.jobcomp_script else ""
        )
        self.conf.write_text(
            f"""ClusterName={self.cluster}
SlurmctldHost={socket.gethostname().split(".")[0]}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.folder / "state"}
SlurmdSpoolDir={self.folder / "spool" / "%n"}
SlurmctldPidFile={self.folder / "state" / "slurmctld.pid"}
SlurmdPidFile={self.folder / "state" / "slurmd-%n.pid"}
SlurmctldLogFile={log / "slurmctld.log"}
SlurmdLogFile={log / "slurmd-%n.log"}
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
MailProg=/bin/true
ReturnToService=1
MinJobAge={self.min_job_age}
KillWait=2
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.dbd_port}
AccountingStoragePass=socket={self.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
{jobcomp}GresTypes=gpu
{node_lines}PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        devices = ""
        if self.gpus_per_node:
            last = self.gpus_per_node - 1
            files = f"{self.folder / 'dev'}/nvidia" + (f"[0-{last}]" if last else "0")
            devices = "".join(f"NodeName={name} Name=gpu File={files}\n" for name in self.node_names)
        (etc / "gres.conf").write_text(devices)

    def _start_slurmctld(self) -> None:
        self._daemon("slurmctld", [self._bin["slurmctld"], "-D", "-f", str(self.conf)])
        self._wait(
            "slurmctld", lambda: True if self.run("scontrol", "ping", check=False).returncode == 0 else None
        )

    def _start_slurmd(self) -> None:
        for name in self.node_names:
            self._daemon(f"slurmd-{name}", [self._bin["slurmd"], "-D", "-f", str(self.conf), "-N", name])
        self.wait_for_nodes("idle", self.node_names)

    # --- outages

    def stop_daemon(self, name: str) -> None:
        """Stop ``slurmdbd`` or ``slurmctld`` (an outage a test makes); :meth:`start_daemon` brings
        it back."""
        for daemon in [d for d in self.daemons if d.name == name and d.alive()]:
            daemon.stop()
            self.daemons.remove(daemon)

    def freeze_daemon(self, name: str, frozen: bool = True) -> None:
        """SIGSTOP (``frozen``) or SIGCONT a running daemon: it keeps its sockets open and answers
        nothing, as a hung slurmdbd or slurmctld does."""
        for daemon in [d for d in self.daemons if d.name == name and d.alive()]:
            daemon.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def start_daemon(self, name: str) -> None:
        """Start ``slurmdbd`` or ``slurmctld`` again after :meth:`stop_daemon`; returns once it answers."""
        if name == "slurmdbd":
            self._daemon("slurmdbd", [self._bin["slurmdbd"], "-D"])
            self._wait("slurmdbd", lambda: True if _listening(self.dbd_port) else None)
        elif name == "slurmctld":
            self._start_slurmctld()
        else:
            raise ValueError(f"cannot restart {name!r}: slurmdbd or slurmctld")

    # --- client commands

    def run(
        self,
        *command: str,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (sbatch, scontrol, sacct, sinfo, squeue, scancel, sacctmgr) with
        ``SLURM_CONF`` set (and ``env`` added); with ``check``, a non-zero exit fails the test
        with its stderr."""
        argv = [self._bin.get(command[0], command[0]), *command[1:]]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, input=input,
            env={**self.env, **(env or {})}, cwd=self.folder / "jobs",
        )  # fmt: skip
        if check:
            assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}"
        return result

    def sbatch(self, script: str, **options: str | int | bool) -> str:
        """Submit ``script`` (``#!/bin/sh`` is added if it has no ``#!`` line); return the job id.

        Options are sbatch's long options: ``job_name="x"`` is ``--job-name=x``, ``no_requeue=True``
        is ``--no-requeue``; ``False`` leaves one out. Output goes to ``jobs/<id>.out`` unless
        ``output`` says otherwise."""
        if not script.startswith("#!"):
            script = "#!/bin/sh\n" + script
        argv = ["sbatch", "--parsable"]
        options.setdefault("output", str(self.folder / "jobs" / "%j.out"))
        for key, value in options.items():
            option = "--" + key.replace("_", "-")
            if value is True:
                argv.append(option)
            elif value is not False:
                argv.append(f"{option}={value}")
        out = self.run(*argv, input=script).stdout.strip()
        return out.split(";")[0]

    def sacct(self, *options: str, fields: str = SACCT_FIELDS) -> list[dict[str, str]]:
        """``sacct -P --noconvert -o fields`` with ``options``: its rows as dictionaries."""
        out = self.run("sacct", "-P", "--noconvert", "-o", fields, *options).stdout
        lines = out.splitlines()
        if not lines:
            return []
        header = lines[0].split("|")
        return [dict(zip(header, line.split("|"), strict=True)) for line in lines[1:] if line]

    def wait_for_state(self, job_id: str, states: str | Iterable[str], timeout: float = 60) -> dict[str, str]:
        """Wait until sacct has a record of ``job_id`` (allocation only, every record a requeued
        job has: ``--duplicates``) in one of ``states`` (``CANCELLED`` matches ``CANCELLED by 0``);
        return the latest such record."""
        wanted = {states} if isinstance(states, str) else set(states)
        seen: list[dict[str, str]] = []

        def reached() -> dict[str, str] | None:
            nonlocal seen
            seen = self.sacct("-X", "--duplicates", "-j", job_id)
            matching = [row for row in seen if row["State"].split()[0] in wanted]
            return matching[-1] if matching else None

        try:
            return self._wait(f"job {job_id} in {sorted(wanted)}", reached, timeout)
        except AssertionError as error:
            raise AssertionError(
                f"job {job_id} never reached {sorted(wanted)}; sacct said {seen}\n{error}"
            ) from None

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo -N -o %T`` says it (``idle``, ``allocated``, ``down*``...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T").stdout
        return dict(line.split("|", 1) for line in out.splitlines() if line)

    def wait_for_nodes(
        self, state: str, nodes: Iterable[str] | None = None, timeout: float | None = None
    ) -> None:
        """Wait until every node of ``nodes`` (default: all) is in ``state`` (e.g. ``idle``)."""
        names = list(nodes or self.node_names)

        def arrived() -> bool | None:
            result = self.run("sinfo", "-h", "-N", "-o", "%N|%T", check=False)
            if result.returncode != 0:
                return None
            states = dict(line.split("|", 1) for line in result.stdout.splitlines() if line)
            return True if all(states.get(name) == state for name in names) else None

        self._wait(f"nodes {', '.join(names)} {state}", arrived, timeout)

    def reasons(self) -> dict[str, str]:
        """``sinfo -R``: the nodes that are down, drained or failing, with their reasons."""
        out = self.run("sinfo", "-R", "-h", "-o", "%n|%E").stdout
        return dict(line.split("|", 1) for line in out.splitlines() if line)

    def jobcomp_env(self, job_id: str, state: str, timeout: float = 30) -> dict[str, str]:
        """The environment the ``jobcomp=True`` script received for ``job_id`` ending in ``state``."""
        path = self.jobcomp_dir / f"{job_id}_{state}.env"
        self._wait(
            f"jobcomp script for job {job_id} {state}", lambda: True if path.exists() else None, timeout
        )
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

    # --- logs and stop

    def logs_tail(self, chars: int = 1500) -> str:
        """The end of every log, for failure messages."""
        parts = []
        for log in sorted((self.folder / "log").glob("*")):
            text = log.read_text(errors="replace")[-chars:]
            if text.strip():
                parts.append(f"--- {log.name}\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop slurmd, slurmctld, slurmdbd, mariadbd and munged by PID (reverse order of start),
        then whatever this instance's jobs left running; nothing of it is left."""
        began = time.monotonic()
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons = []
        left = marked_processes(str(self.folder))
        self.leftovers = [_command_line(pid) for pid in left]
        for signum, grace in ((signal.SIGTERM, 1), (signal.SIGKILL, 5)):
            for pid in left:
                _signal(pid, signum)
            deadline = time.monotonic() + grace
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = [pid for pid in left if _running(pid)]
        assert not left, f"processes of the Slurm test service survived SIGKILL: {left}"
        self.timings["stop"] = time.monotonic() - began


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def marked_processes(folder: str) -> list[int]:
    """The processes (not zombies) whose environment holds ``MARKER=folder``."""
    wanted = f"{MARKER}={folder}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0") and _running(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
