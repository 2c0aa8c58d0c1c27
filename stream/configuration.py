"""One configuration surface: settings from a TOML file under the environment, checked, fingerprinted.

Every setting of :class:`~stream.settings.Settings` — the detector tunables too — can be given
three ways, the later winning: a TOML file (``--config FILE`` or ``FAULTSTREAM_CONFIG_FILE``),
the ``FAULTSTREAM_*`` environment, a command's own flags. In the file a setting is named as its
field (its variable without ``FAULTSTREAM_``, lower case); a table prefixes its keys, so

.. code-block:: toml

    storm_min_events = 5
    xid_catalog_file = "/etc/faultstream/xid-overrides.toml"

    [lemon]
    threshold = 9.0          # lemon_threshold

sets ``storm_min_events``, ``xid_catalog_file`` and ``lemon_threshold``. ``faultstream diff
--set`` takes the same names.

:func:`check_configuration` lists every problem of a configuration, one line each (a name that is
no setting, a value of the wrong type, one out of its range, settings that contradict each other,
an XID catalog file that cannot be used); ``faultstream config --check`` prints them.

:func:`fingerprint` names the effective detector configuration (every detector setting and the
catalog overrides) in 12 hex digits: the worker and the replay print it at start, every incident
version is stored with it, and a worker restarted with another configuration says what changed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from stream.settings import CONFIG_FILE_VARIABLE, DETECTOR_SETTINGS, ENV_PREFIX, Settings, SettingsError

if TYPE_CHECKING:
    from detectors.core import CoreConfig
    from detectors.xid_catalog import XidOverride

__all__ = [
    "CONFIG_FILE_VARIABLE",
    "check_configuration",
    "describe",
    "fingerprint",
    "read_config_file",
]


def _field_types() -> dict[str, str]:
    return {spec.name: str(spec.type) for spec in dataclasses.fields(Settings)}


def read_config_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The settings a TOML file gives (field name -> value), and its problems (one line each): a
    name that is no setting, a value of the wrong type. Raises :class:`SettingsError` when the
    file cannot be read or is not TOML."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"configuration file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"configuration file {path}: not TOML ({exc})") from None
    types = _field_types()
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in _flattened(document):
        where = f"{path}: {key}"
        if key not in types:
            close = difflib.get_close_matches(key, types, n=1)
            hint = f" (did you mean {close[0]}?)" if close else " (faultstream config lists them)"
            problems.append(f"{where}: no such setting{hint}")
            continue
        kind = types[key]
        if kind == "int" and (type(value) is not int):
            problems.append(f"{where} = {value!r}: expected an integer")
        elif kind == "float" and (type(value) not in (int, float)):
            problems.append(f"{where} = {value!r}: expected a number")
        elif kind == "str" and not isinstance(value, str):
            problems.append(f"{where} = {value!r}: expected a string")
        else:
            values[key] = float(value) if kind == "float" else value
    return values, problems


def _flattened(document: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(name, value)`` of a TOML document, a table's keys prefixed with its name and ``_``."""
    out: list[tuple[str, Any]] = []
    for key, value in document.items():
        name = f"{prefix}{key}".lower().replace("-", "_").replace(".", "_")
        if isinstance(value, dict):
            out.extend(_flattened(value, f"{name}_"))
        else:
            out.append((name, value))
    return out


def check_configuration(
    environ: Mapping[str, str], config_file: Path | None = None
) -> tuple[Settings | None, list[str]]:
    """Every problem of the configuration the environment (and ``config_file``, else the file
    the environment names) makes, one line each, and the settings when there is none."""
    path = config_file or (Path(environ[CONFIG_FILE_VARIABLE]) if environ.get(CONFIG_FILE_VARIABLE) else None)
    problems: list[str] = []
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values, problems = read_config_file(path)
        except SettingsError as exc:
            return None, [str(exc)]
    env = {key: value for key, value in environ.items() if key != CONFIG_FILE_VARIABLE}
    try:
        settings = Settings.from_env(env, file_values=values, check=False)
    except SettingsError as exc:
        return None, [*problems, str(exc)]
    problems.extend(settings.detector_problems())
    if settings.xid_catalog_file:
        try:
            settings.xid_overrides()
        except (SettingsError, ValueError) as exc:
            problems.append(f"{ENV_PREFIX}XID_CATALOG_FILE={settings.xid_catalog_file!r}: {exc}")
    return (None if problems else settings), problems


def _plain(value: Any) -> Any:
    """A configuration value as JSON can say it, the same for equal values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {spec.name: _plain(getattr(value, spec.name)) for spec in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if hasattr(value, "bounds"):  # SizeBuckets
        return _plain(value.bounds)
    return value


def detector_configuration(config: CoreConfig, overrides: tuple[XidOverride, ...] = ()) -> dict[str, Any]:
    """What decides the detectors' results, by name: the core configuration's fields (the
    lemon detector's as ``lemon.<field>``) and the catalog overrides (``xid.<code>``)."""
    plain: dict[str, Any] = {}
    for spec in dataclasses.fields(config):
        value = _plain(getattr(config, spec.name))
        if isinstance(value, dict):
            plain.update({f"{spec.name}.{key}": item for key, item in value.items()})
        else:
            plain[spec.name] = value
    for override in overrides:
        plain[f"xid.{override.code}"] = _plain(override)
    return plain


def fingerprint(config: CoreConfig, overrides: tuple[XidOverride, ...] = ()) -> str:
    """12 hex digits naming a detector configuration: equal configurations, equal fingerprints.

    >>> from detectors.core import CoreConfig
    >>> fingerprint(CoreConfig()) == fingerprint(CoreConfig()), len(fingerprint(CoreConfig()))
    (True, 12)
    >>> fingerprint(CoreConfig()) == fingerprint(CoreConfig(storm_min_events=5))
    False
    """
    text = orjson.dumps(detector_configuration(config, overrides), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()[:12]


def describe(settings: Settings, named: str) -> str:
    """The start line's account of a detector configuration: its fingerprint ``named`` (made once
    by the caller, which also stores it) and the detector settings that differ from their defaults.

    >>> describe(Settings(storm_min_events=5), "7a42bfff128d")
    '7a42bfff128d (storm_min_events=5)'
    >>> describe(Settings(), "6e22e36d3d51")
    '6e22e36d3d51 (the defaults)'
    """
    defaults = Settings()
    changed = [
        f"{name}={getattr(settings, name)}"
        for name in DETECTOR_SETTINGS
        if getattr(settings, name) != getattr(defaults, name)
    ]
    return f"{named} ({', '.join(changed) or 'the defaults'})"
