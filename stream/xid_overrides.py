"""XID catalog override files: TOML, one ``[xid.CODE]`` table per code changed or added.

Read for ``FAULTSTREAM_XID_CATALOG_FILE`` (the worker and the replay) and ``faultstream diff
--catalog``; the detection core applies the overrides (:class:`~detectors.xid_catalog.XidOverride`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from detectors.xid_catalog import XidCategory, XidOverride
from detectors.xid_nvidia import XIDS
from schemas.outputs import Severity

__all__ = ["load_xid_overrides"]

_OVERRIDE_KEYS = {"name", "category", "severity", "hardware", "action"}


def load_xid_overrides(path: Path) -> tuple[XidOverride, ...]:
    """Read a catalog override file: TOML, one ``[xid.CODE]`` table per code changed or added.

    Each table sets any of ``severity`` (info, warn, critical), ``category`` (an XID family such
    as memory or bus), ``hardware`` (true/false), ``action`` and ``name``; a code outside
    NVIDIA's catalog needs ``category`` and ``severity``.

    Raises
    ------
    ValueError
        When it cannot be read, is not TOML, or a table, key or value cannot be used; the message
        names the file.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not TOML: {exc}") from None
    extra = sorted(set(data) - {"xid"})
    if extra or not isinstance(data.get("xid"), dict) or not data["xid"]:
        raise ValueError(f'{path}: expected [xid.CODE] tables only (e.g. [xid.13] severity = "critical")')
    families = ", ".join(c.value for c in XidCategory if c is not XidCategory.UNKNOWN)
    overrides = []
    for code_text, entry in data["xid"].items():
        where = f"{path}: [xid.{code_text}]"
        if not code_text.isdigit() or not isinstance(entry, dict):
            raise ValueError(f"{where}: the table name must be a whole XID code")
        unknown = sorted(set(entry) - _OVERRIDE_KEYS)
        if unknown:
            raise ValueError(
                f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_OVERRIDE_KEYS))})"
            )
        values: dict[str, Any] = {}
        try:
            if "severity" in entry:
                values["severity"] = Severity(entry["severity"])
            if "category" in entry:
                values["category"] = XidCategory(entry["category"])
                if values["category"] is XidCategory.UNKNOWN:
                    raise ValueError
        except ValueError:
            raise ValueError(
                f"{where}: severity must be info, warn or critical; category one of {families}"
            ) from None
        if "hardware" in entry and not isinstance(entry["hardware"], bool):
            raise ValueError(f"{where}: hardware must be true or false")
        for key in ("name", "action"):
            if key in entry:
                if not isinstance(entry[key], str):
                    raise ValueError(f"{where}: {key} must be a string")
                values[key] = entry[key]
        if "hardware" in entry:
            values["hardware"] = entry["hardware"]
        if not values:
            raise ValueError(f"{where}: sets nothing (keys: {', '.join(sorted(_OVERRIDE_KEYS))})")
        code = int(code_text)
        if code not in XIDS and ("category" not in values or "severity" not in values):
            raise ValueError(
                f"{where}: XID {code} is not in NVIDIA's catalog: a new entry needs a category and a severity"
            )
        overrides.append(XidOverride(code=code, source=str(path), **values))
    return tuple(overrides)
