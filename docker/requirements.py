"""Print the runtime requirements of the worker image, one per line, from ``pyproject.toml``.

The image talks to a ClickHouse server (``http://``), so by default it leaves out the packages
that only the embedded store needs: ``chdb`` is the ClickHouse engine in-process and brings
pyarrow, about 0.6 GB of the 1 GB a full install weighs. ``--embedded true`` keeps them, for an
image that also runs ``faultstream replay`` into a ``chdb://`` store.

Run by ``docker/worker.Dockerfile`` in its build stage (plain Python 3.11, no dependencies)::

    python docker/requirements.py --embedded false > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

#: Distributions only the embedded (``chdb://``) store needs, by normalised name.
EMBEDDED_ONLY = frozenset({"chdb"})


def distribution_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement (``Foo_Bar[x]>=1`` -> ``foo-bar``)."""
    name = re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, *, embedded: bool) -> list[str]:
    """The ``[project] dependencies`` of ``pyproject``, without the embedded-only ones unless asked."""
    dependencies: list[str] = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    return [dep for dep in dependencies if embedded or distribution_name(dep) not in EMBEDDED_ONLY]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--embedded",
        choices=("true", "false"),
        default="false",
        help="keep the embedded store's packages (chdb); default false",
    )
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    for line in requirements(args.pyproject, embedded=args.embedded == "true"):
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
