"""The fleet inventory into the store's ``fleet_inventory`` table (``replay --inventory``, the worker's
``FAULTSTREAM_INVENTORY_FILE``): the nodes fleet-wide figures count, failing or not."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client

from schemas.ddl import INSERT_COLUMNS
from stream.inputs.parsers.inventory import InventoryNode, parse_inventory

__all__ = ["read_inventory", "write_inventory"]


def read_inventory(path: Path) -> list[InventoryNode]:
    """The nodes of an inventory file.

    Raises
    ------
    FileNotFoundError
        No such file.
    stream.inputs.parsers.inventory.InventoryError
        A line that cannot be read (named), or no node.
    """
    return parse_inventory(path.read_text(encoding="utf-8", errors="replace"), str(path))


def write_inventory(
    client: Client, database: str, cluster: str, nodes: list[InventoryNode], source: str
) -> int:
    """Write the inventory's nodes (a node written again replaces its row); returns how many."""
    loaded = datetime.now(UTC)
    columns = INSERT_COLUMNS["fleet_inventory"]
    data = [
        [{"cluster": cluster, "node": n.node, "gpus": n.gpus, "model": n.model, "source": source,
          "loaded": loaded}[name] for name in columns]
        for n in nodes
    ]  # fmt: skip
    if data:
        client.insert(f"{database}.fleet_inventory", data, column_names=list(columns))
    return len(data)
