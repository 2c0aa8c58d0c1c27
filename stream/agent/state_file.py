"""Small JSON state files written atomically: the agent's cursor and its spool's delivery marks.

A file is written to a temporary name beside it, flushed to disk, then renamed over the old one,
so a crash (``kill -9``, power loss) leaves either the old content or the new, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["StateFileError", "read_state", "write_state"]


class StateFileError(ValueError):
    """A state file exists but cannot be read as the JSON object it should hold."""


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` as JSON, atomically (write, fsync, rename, fsync the folder).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_state(folder / "cursor.json", {"inode": 12, "offset": 340})
    >>> read_state(folder / "cursor.json")
    {'inode': 12, 'offset': 340}
    """
    temporary = path.with_name(path.name + ".tmp")
    data = json.dumps(state, sort_keys=True).encode()
    with temporary.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    # The rename itself is made durable by syncing the folder that holds the name.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_state(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no such file.

    Raises
    ------
    StateFileError
        When the file holds something else (naming the file, so an operator can remove it).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        state = json.loads(data)
    except ValueError as exc:
        raise StateFileError(f"{path}: not a JSON state file ({exc}); remove it to start afresh") from None
    if not isinstance(state, dict):
        raise StateFileError(f"{path}: not a JSON object; remove it to start afresh")
    return state
