"""Fleet inventories: the three formats, and a clear error for what cannot be read."""

from __future__ import annotations

import pytest

from stream.inputs.parsers.inventory import InventoryError, InventoryNode, parse_inventory

SCONTROL = """\
NodeName=gpu-node-1 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 AvailableFeatures=h100 Gres=gpu:h100:8(S:0-1) NodeAddr=10.0.0.1 State=IDLE
NodeName=gpu-node-2 Arch=x86_64 CoresPerSocket=32 CPUTot=64 Gres=gpu:8,nic:2 State=MIXED+DRAIN Reason=bad fan [root@2025-03-04T10:00:00]
NodeName=login1 Arch=x86_64 CPUTot=16 Gres=(null) State=IDLE
"""


def test_scontrol_show_nodes_oneliner_gives_gpus_and_model() -> None:
    assert parse_inventory(SCONTROL, "nodes.txt") == [
        InventoryNode("gpu-node-1", 8, "h100"),
        InventoryNode("gpu-node-2", 8, ""),
        InventoryNode("login1", None, ""),
    ]


def test_a_csv_with_a_node_header_and_other_columns() -> None:
    text = "node,rack,gpus,model\ngpu-node-1,r1,8,A100\ngpu-node-2,r1,,\n# retired: gpu-node-3\n"
    assert parse_inventory(text, "fleet.csv") == [
        InventoryNode("gpu-node-1", 8, "A100"),
        InventoryNode("gpu-node-2"),
    ]


def test_a_plain_list_skips_comments_and_repeats() -> None:
    assert [n.node for n in parse_inventory("# rack 1\nnode0001\n\nnode0002\nnode0001\n", "list")] == [
        "node0001",
        "node0002",
    ]


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("", "no node in the inventory"),
        ("# nothing\n", "no node in the inventory"),
        ("node0001\nnode 0002\n", "list:2: 'node 0002' is not a node name"),
        ("node,gpus\nnode0001,eight\n", "list:2: gpus must be a whole number"),
        ("node,gpus\n,8\n", "list:2: '' is not a node name"),
        ("NodeName=n1 Gres=gpu:8\nArch=x86_64\n", "list:2: no NodeName="),
    ],
)
def test_what_cannot_be_read_is_an_error_naming_its_line(text: str, fault: str) -> None:
    with pytest.raises(InventoryError, match=fault.replace("(", r"\(")):
        parse_inventory(text, "list")
