"""Slurm host lists: ``node[001-004,007],login1`` <-> a list of node names.

Follows Slurm's rules: ranges keep the zero padding of their first bound
(``node[08-11]`` -> ``node08 .. node11``), several bracket groups in one name expand as a
cartesian product, left to right (``rack[1-2]-n[1-2]`` -> ``rack1-n1, rack1-n2, rack2-n1, rack2-n2``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import product
from typing import Final

__all__ = ["compress_hostlist", "expand_hostlist"]

#: Values sacct prints for a job that has no nodes.
_EMPTY: Final = frozenset({"", "none assigned", "(null)", "none"})
#: A guard against ``node[1-999999999]`` exhausting memory.
MAX_HOSTS: Final = 1_000_000

_RANGE_RE: Final = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_TRAILING_NUMBER_RE: Final = re.compile(r"^(.*?)(\d+)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(spec: str, whole: str) -> list[str]:
    """Expand the inside of one bracket group: ``001-004,007``."""
    out: list[str] = []
    for item in spec.split(","):
        match = _RANGE_RE.match(item)
        if match is None:
            raise ValueError(f"bad range {item!r} in host list {whole!r}")
        low_text, high_text = match.group(1), match.group(2)
        if high_text is None:
            out.append(low_text)
            continue
        low, high = int(low_text), int(high_text)
        if high < low:
            raise ValueError(f"descending range {item!r} in host list {whole!r}")
        if high - low >= MAX_HOSTS:
            raise ValueError(f"range {item!r} in host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(low_text)
        out.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return out


def _expand_one(name: str, whole: str) -> list[str]:
    """Expand one comma-free host expression, which may hold several bracket groups."""
    if "[" not in name:
        if "]" in name:
            raise ValueError(f"unbalanced ']' in host list {whole!r}")
        return [name]
    pieces: list[list[str]] = []
    rest = name
    while "[" in rest:
        before, _, after = rest.partition("[")
        spec, closed, rest = after.partition("]")
        if not closed:
            raise ValueError(f"unbalanced '[' in host list {whole!r}")
        pieces.append([before])
        pieces.append(_expand_ranges(spec, whole))
    if "]" in rest:
        raise ValueError(f"unbalanced ']' in host list {whole!r}")
    pieces.append([rest])
    total = 1
    for piece in pieces:
        total *= len(piece)
    if total > MAX_HOSTS:
        raise ValueError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in product(*pieces)]


def expand_hostlist(s: str) -> list[str]:
    """Expand a Slurm host list into node names, in the order Slurm lists them.

    Parameters
    ----------
    s
        A host list such as ``node[001-004,007]`` or ``a[1-3],b05,c[07-08]``. ``None assigned``,
        ``(null)`` and the empty string expand to no node.

    Returns
    -------
    list[str]
        The node names; zero padding is kept. Duplicates are kept as written.

    Raises
    ------
    ValueError
        On unbalanced or nested brackets, a malformed or descending range, or more than
        ``MAX_HOSTS`` names.

    Examples
    --------
    >>> expand_hostlist("node[001-003,007]")
    ['node001', 'node002', 'node003', 'node007']
    >>> expand_hostlist("a[1-2],b05,c[07-08]")
    ['a1', 'a2', 'b05', 'c07', 'c08']
    >>> expand_hostlist("gpu[1-2]-ib[0-1]")
    ['gpu1-ib0', 'gpu1-ib1', 'gpu2-ib0', 'gpu2-ib1']
    >>> expand_hostlist("None assigned")
    []
    """
    text = s.strip()
    if text.lower() in _EMPTY:
        return []
    nodes: list[str] = []
    for part in _split_top_level(text):
        part = part.strip()
        if not part:
            raise ValueError(f"empty host name in host list {s!r}")
        nodes.extend(_expand_one(part, s))
        if len(nodes) > MAX_HOSTS:
            raise ValueError(f"host list {s!r} names more than {MAX_HOSTS} hosts")
    return nodes


def _format_ranges(numbers: list[int], width: int) -> str:
    spans: list[str] = []
    start = prev = numbers[0]
    for number in numbers[1:]:
        if number == prev + 1:
            prev = number
            continue
        spans.append(_span(start, prev, width))
        start = prev = number
    spans.append(_span(start, prev, width))
    return ",".join(spans)


def _span(low: int, high: int, width: int) -> str:
    if low == high:
        return f"{low:0{width}d}"
    return f"{low:0{width}d}-{high:0{width}d}"


def compress_hostlist(nodes: Iterable[str]) -> str:
    """Compress node names into a Slurm host list, the inverse of :func:`expand_hostlist`.

    Names are grouped by the text before their trailing number and by zero-padded width;
    groups appear in the order their first name appears, numbers inside a group are sorted and
    de-duplicated. ``expand_hostlist(compress_hostlist(nodes))`` gives back the same set of names.

    Parameters
    ----------
    nodes
        Node names (no commas or brackets).

    Returns
    -------
    str
        The host list; ``""`` for no node.

    Raises
    ------
    ValueError
        If a name is empty or contains ``,``, ``[`` or ``]``.

    Examples
    --------
    >>> compress_hostlist(["node001", "node002", "node003", "node007", "login"])
    'node[001-003,007],login'
    >>> compress_hostlist(["n9", "n10", "n11"])
    'n[9-11]'
    >>> compress_hostlist(["gpu05"])
    'gpu05'
    """
    # (prefix, width) -> numbers; width 0 means "not zero-padded".
    groups: dict[tuple[str, int], set[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, int] | str] = []
    for name in nodes:
        if not name or any(char in name for char in ",[]"):
            raise ValueError(f"cannot put node name {name!r} in a host list")
        match = _TRAILING_NUMBER_RE.match(name)
        if match is None:
            if name not in plain:
                plain[name] = None
                order.append(name)
            continue
        prefix, digits = match.group(1), match.group(2)
        width = len(digits) if digits[0] == "0" and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    # An unpadded number as wide as a padded group prints the same inside it (100 in [001-100]).
    for (prefix, width), numbers in list(groups.items()):
        if width == 0:
            continue
        natural = groups.get((prefix, 0))
        if natural:
            moved = {number for number in natural if len(str(number)) == width}
            numbers |= moved
            natural -= moved
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        numbers_set = groups[item]
        if not numbers_set:
            continue
        prefix, width = item
        ordered = sorted(numbers_set)
        if len(ordered) == 1:
            parts.append(f"{prefix}{ordered[0]:0{width}d}")
        else:
            parts.append(f"{prefix}[{_format_ranges(ordered, width)}]")
    return ",".join(parts)
