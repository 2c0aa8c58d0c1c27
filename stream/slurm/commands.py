"""Running Slurm's client commands (``sacct``, ``scontrol``, ``sinfo``): a time limit, a clear error.

A command that hangs (a slurmctld or slurmdbd that does not answer) is killed after its time limit;
one that exits non-zero is an error carrying its first line of stderr. The callers retry with
backoff and say so; nothing here sleeps or retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SlurmCommandError", "SlurmCommands"]


class SlurmCommandError(Exception):
    """A Slurm command failed, timed out or could not be started; the message says which."""


@dataclass(frozen=True)
class SlurmCommands:
    """Where the Slurm client commands are and how they run.

    ``bin_dir`` empty: found on ``PATH``. ``environment`` is added to this process's (``SLURM_CONF``
    for a controller whose configuration is not in the default place). Times are read and written
    in UTC (``TZ=UTC``): sacct prints naive local times.
    """

    bin_dir: str = ""
    timeout_s: float = 60.0
    environment: Mapping[str, str] | None = None

    def program(self, name: str) -> str:
        """The path (or bare name, found on PATH) of one client command."""
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    async def run(self, name: str, arguments: Sequence[str]) -> str:
        """Run ``name arguments`` and return its standard output.

        Raises
        ------
        SlurmCommandError
            It could not start, ran past ``timeout_s`` (then it is killed), or exited non-zero.
        """
        command = [self.program(name), *arguments]
        environment = {**os.environ, **(self.environment or {}), "TZ": "UTC"}
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
                env=environment,
            )
        except OSError as exc:
            raise SlurmCommandError(f"{name}: cannot run {command[0]!r}: {exc.strerror or exc}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise SlurmCommandError(f"{name}: no answer in {self.timeout_s:g} s (killed)") from None
        if process.returncode != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            first = lines[0] if lines else "(nothing on stderr)"
            raise SlurmCommandError(f"{name}: exit status {process.returncode}: {first}")
        return out.decode("utf-8", "replace")
