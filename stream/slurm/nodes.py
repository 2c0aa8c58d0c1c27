"""Slurm's nodes as remediation sees and changes them, through ``scontrol`` and ``sinfo``.

Every change is checked by reading the node back: a drain counts as done only when Slurm shows the
node draining or drained with faultstream's reason, so the audit never says "drained" of a node
that is not.
"""

from __future__ import annotations

import re
from typing import Final

from stream.slurm.commands import SlurmCommandError, SlurmCommands
from stream.slurm.policy import NodeView

__all__ = ["drain", "fleet_size", "node_view", "parse_node_line", "resume"]

#: Base states and flags that take a node out of scheduling.
_OUT_OF_SERVICE: Final = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
#: ``scontrol show node`` appends ``[user@time]`` to a reason.
_REASON_STAMP_RE: Final = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")


def parse_node_line(line: str) -> NodeView:
    """A node's view from its ``scontrol show node --oneliner`` line.

    >>> view = parse_node_line("NodeName=gpu-node-1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 "
    ...                        "Reason=faultstream inc-1: gpu_bus [root@2025-03-04T10:00:00]")
    >>> view.drained, view.reason, view.drained_by_faultstream
    (True, 'faultstream inc-1: gpu_bus', True)
    >>> parse_node_line("NodeName=gpu-node-2 State=MIXED CPUTot=8").drained
    False
    """
    state = re.search(r"(?:^|\s)State=(\S+)", line)
    flags = set(re.split(r"[+*~#!%$@^-]", state.group(1).upper())) if state else set()
    reason = ""
    if " Reason=" in line or line.startswith("Reason="):
        reason = line.split("Reason=", 1)[1]
        reason = _REASON_STAMP_RE.sub("", reason).strip()
        if reason == "(null)":
            reason = ""
    return NodeView(known=True, drained=bool(flags & _OUT_OF_SERVICE), reason=reason)


async def node_view(commands: SlurmCommands, node: str) -> NodeView:
    """What Slurm says of ``node`` now; ``known`` False for a name Slurm does not have.

    Raises
    ------
    SlurmCommandError
        scontrol failed otherwise (no controller, a time-out).
    """
    try:
        output = await commands.run("scontrol", ["show", "node", node, "--oneliner"])
    except SlurmCommandError as exc:
        if "not found" in str(exc).lower():
            return NodeView(known=False)
        raise
    for line in output.splitlines():
        if line.startswith(f"NodeName={node} "):
            return parse_node_line(line)
    return NodeView(known=False)


async def fleet_size(commands: SlurmCommands) -> int:
    """How many nodes this Slurm has (``sinfo``: each node once, whatever its partitions)."""
    output = await commands.run("sinfo", ["--noheader", "--Node", "--format=%N"])
    return len({line.strip() for line in output.splitlines() if line.strip()})


async def drain(commands: SlurmCommands, node: str, reason: str) -> NodeView:
    """Drain ``node`` with ``reason`` and return its view read back.

    Raises
    ------
    SlurmCommandError
        scontrol failed, or the node read back is not drained with that reason.
    """
    await commands.run("scontrol", ["update", f"nodename={node}", "state=drain", f"reason={reason}"])
    view = await node_view(commands, node)
    if not view.drained or view.reason != reason:
        raise SlurmCommandError(
            f"scontrol: node {node} reads back {'drained' if view.drained else 'not drained'} with reason "
            f"{view.reason!r} after the drain"
        )
    return view


async def resume(commands: SlurmCommands, node: str) -> NodeView:
    """Resume ``node`` and return its view read back.

    Raises
    ------
    SlurmCommandError
        scontrol failed, or the node is still drained.
    """
    await commands.run("scontrol", ["update", f"nodename={node}", "state=resume"])
    view = await node_view(commands, node)
    if view.drained:
        raise SlurmCommandError(f"scontrol: node {node} is still drained or down after the resume")
    return view
