"""A fleet inventory: which nodes exist (and their GPUs), whether or not they ever failed.

Fleet-relative figures (MTBF, failures per 1,000 node-days) need the nodes that did *not* fail: a
history of failures alone names only failing nodes. Three formats are read, told apart by their
content:

* ``scontrol show nodes --oneliner``: one ``NodeName=... Gres=gpu:a100:8(S:0-1) ...`` line a node;
  the GPU count and model come from ``Gres`` (``gpu:8``: 8 GPUs, no model);
* a CSV whose header starts with ``node`` (``node[,gpus][,model][,...]``; other columns are kept out);
* a plain list of node names, one a line.

Blank lines and lines starting with ``#`` are skipped. An inventory is configuration, not data: a
line that cannot be read is an error naming its line (:class:`InventoryError`), never a guess.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["InventoryError", "InventoryNode", "parse_inventory"]

_NODE_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_GRES_GPU_RE: Final = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


class InventoryError(ValueError):
    """An inventory file that cannot be read; the message names the file, line and fault."""


@dataclass(frozen=True, slots=True)
class InventoryNode:
    """One node of the fleet: its name, GPUs (None: not said) and GPU model ("" when not said)."""

    node: str
    gpus: int | None = None
    model: str = ""


def _gres(text: str) -> tuple[int | None, str]:
    """GPU count and model of a Slurm ``Gres`` value (``gpu:a100:8(S:0-1),nic:2``)."""
    found = _GRES_GPU_RE.findall(re.sub(r"\([^)]*\)", "", text))
    if not found:
        return None, ""
    models = {model for model, _ in found if model}
    return sum(int(count) for _, count in found), ",".join(sorted(models))


def parse_inventory(text: str, source: str) -> list[InventoryNode]:
    """The nodes an inventory names, in its order (a node named twice: its first line).

    Raises
    ------
    InventoryError
        A line that is not a node name, a CSV row without a node or with a bad GPU count, or an
        inventory that names no node at all.

    Examples
    --------
    >>> [n.node for n in parse_inventory("gpu-node-1\\ngpu-node-2\\n# spare\\n", "nodes.txt")]
    ['gpu-node-1', 'gpu-node-2']
    >>> parse_inventory("node,gpus,model\\ngpu-node-1,8,H100\\n", "nodes.csv")
    [InventoryNode(node='gpu-node-1', gpus=8, model='H100')]
    >>> parse_inventory("NodeName=gpu-node-7 Arch=x86_64 CoresPerSocket=32 Gres=gpu:a100:8(S:0-1) State=IDLE",
    ...                 "scontrol.txt")
    [InventoryNode(node='gpu-node-7', gpus=8, model='a100')]
    """
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)]
    lines = [(number, line) for number, line in lines if line and not line.startswith("#")]
    if not lines:
        raise InventoryError(f"{source}: no node in the inventory")
    first = lines[0][1]
    if first.startswith("NodeName="):
        nodes = _from_scontrol(lines, source)
    elif re.match(r"^\s*node\s*(,|$)", first, re.IGNORECASE) and "," in first:
        nodes = _from_csv(lines, source)
    else:
        nodes = []
        for number, line in lines:
            if not _NODE_RE.match(line):
                raise InventoryError(f"{source}:{number}: {line[:80]!r} is not a node name")
            nodes.append(InventoryNode(line))
    first_lines: dict[str, InventoryNode] = {}
    for node in nodes:
        first_lines.setdefault(node.node, node)
    return list(first_lines.values())


def _from_scontrol(lines: list[tuple[int, str]], source: str) -> list[InventoryNode]:
    nodes = []
    for number, line in lines:
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z]+)=(\S*)", line))
        name = fields.get("NodeName", "")
        if not _NODE_RE.match(name):
            raise InventoryError(f"{source}:{number}: no NodeName= in {line[:80]!r}")
        gpus, model = _gres(fields.get("Gres", ""))
        nodes.append(InventoryNode(name, gpus, model))
    return nodes


def _from_csv(lines: list[tuple[int, str]], source: str) -> list[InventoryNode]:
    reader = csv.reader(io.StringIO("\n".join(line for _, line in lines)))
    header = [name.strip().lower() for name in next(reader)]
    column = {name: header.index(name) for name in ("node", "gpus", "model") if name in header}
    nodes = []
    for (number, _), row in zip(lines[1:], reader, strict=False):
        name = row[column["node"]].strip() if len(row) > column["node"] else ""
        if not _NODE_RE.match(name):
            raise InventoryError(f"{source}:{number}: {name[:80]!r} is not a node name")
        gpus: int | None = None
        if "gpus" in column and len(row) > column["gpus"] and row[column["gpus"]].strip():
            text = row[column["gpus"]].strip()
            if not text.isdigit():
                raise InventoryError(f"{source}:{number}: gpus must be a whole number, got {text!r}")
            gpus = int(text)
        model = row[column["model"]].strip() if "model" in column and len(row) > column["model"] else ""
        nodes.append(InventoryNode(name, gpus, model))
    return nodes
