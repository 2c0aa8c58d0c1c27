"""Slurm host list expansion and compression."""

from __future__ import annotations

import random
import re

import pytest

from stream.inputs.parsers.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("node001", ["node001"]),
        ("node[001-004,007]", ["node001", "node002", "node003", "node004", "node007"]),
        ("a[1-3],b05,c[07-08]", ["a1", "a2", "a3", "b05", "c07", "c08"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("gpu[1-2]-ib[0-1]", ["gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1"]),
        ("rack[1-2]n[3,5]x", ["rack1n3x", "rack1n5x", "rack2n3x", "rack2n5x"]),
        (
            "learnnode[1273,1405,1529,1666]",
            ["learnnode1273", "learnnode1405", "learnnode1529", "learnnode1666"],
        ),
        (" n[1 - 2] , m3 ", ["n1", "n2", "m3"]),
        ("None assigned", []),
        ("(null)", []),
        ("", []),
    ],
)
def test_expand(hostlist: str, expected: list[str]) -> None:
    assert expand_hostlist(hostlist) == expected


def test_expand_big_node_list_of_the_gcm_sample() -> None:
    nodes = expand_hostlist(
        "node[1820-1822,1838-1844,1873-1879,1892-1900,1910-1917,1960-1966,1990-1995,2003-2008,2017-2032,"
        "2038-2044,2123-2137,2140-2147,2156-2179,2286-2303,2369-2375,2401-2410,2466-2475,2562-2573,"
        "2675-2682,2684-2706,2775-2782,2863-2873,2920-2929,2984-2999]"
    )
    assert len(nodes) == 256
    assert len(set(nodes)) == 256
    assert nodes[:4] == ["node1820", "node1821", "node1822", "node1838"]
    assert nodes[-1] == "node2999"
    assert "node2683" not in nodes
    assert "node2684" in nodes


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [
        ("node[1-", "unbalanced '['"),
        ("node1-2]", "unbalanced ']'"),
        ("node[[1-2]]", "nested"),
        ("node[4-2]", "descending"),
        ("node[a-b]", "bad range"),
        ("node[]", "bad range"),
        ("a,,b", "empty host name"),
        ("node[1-2]]", "unbalanced ']'"),
    ],
)
def test_expand_rejects_malformed_lists(hostlist: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        expand_hostlist(hostlist)


def test_expand_refuses_absurd_ranges() -> None:
    with pytest.raises(ValueError, match="more than"):
        expand_hostlist(f"n[0-{MAX_HOSTS}]")
    with pytest.raises(ValueError, match="more than"):
        expand_hostlist("n[0-9999]-[0-9999]")


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([], ""),
        (["gpu05"], "gpu05"),
        (["node001", "node002", "node003", "node007", "login"], "node[001-003,007],login"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["node099", "node100", "node101"], "node[099-101]"),
        (["n3", "n1", "n2", "n2"], "n[1-3]"),
        (["n007", "n7"], "n007,n7"),
        (["gpu1-ib0", "gpu1-ib1", "gpu2-ib0"], "gpu1-ib[0-1],gpu2-ib0"),
        (["b2", "a1", "b1", "a3"], "b[1-2],a[1,3]"),
    ],
)
def test_compress(nodes: list[str], expected: str) -> None:
    assert compress_hostlist(nodes) == expected


@pytest.mark.parametrize("bad", ["", "a,b", "n[1]"])
def test_compress_rejects_names_that_cannot_be_listed(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot put node name"):
        compress_hostlist(["ok1", bad])


def test_compress_then_expand_gives_back_the_same_nodes() -> None:
    rng = random.Random(20240115)
    for _ in range(300):
        nodes = set()
        for _ in range(rng.randint(1, 40)):
            prefix = rng.choice(["node", "gpu", "r1-n", "login", "x"])
            width = rng.choice([0, 2, 3, 4])
            number = rng.randint(0, 1200)
            nodes.add(f"{prefix}{number:0{width}d}" if prefix != "login" else "login")
        compressed = compress_hostlist(sorted(nodes))
        assert set(expand_hostlist(compressed)) == nodes, compressed
        assert len(expand_hostlist(compressed)) == len(nodes), compressed
