"""Rule what-if on history: the same files replayed under two configurations, incidents compared.

``faultstream diff`` runs the deterministic core over the files twice, in memory (no store):
once with the *base* configuration (the environment, as ``faultstream replay`` would run) and
once with the *candidate* (the base with some settings, detector tunables or catalog entries
changed). Because the core is deterministic, every difference between the two incident lists is
the change's doing. :func:`diff_incidents` pairs the two lists and says which incidents the change
adds, removes or changes (severity, first evidence).

Pairing: incidents of the same subject (cluster, kind, node, GPU) are the same incident when
their ids are equal (same first evidence) or, failing that, when their evidence spans overlap
(a lower threshold that opens a storm earlier moves its first evidence, hence its id).
"""

from __future__ import annotations

import os
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from detectors.core import CoreConfig, DetectionCore, Emitted
from detectors.lemon import LemonConfig
from detectors.xid_catalog import XidCategory, XidOverride
from detectors.xid_nvidia import XIDS
from schemas.outputs import Incident, Severity
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.replay import ReplaySummary, run_files
from stream.settings import ENV_PREFIX, Settings, SettingsError

__all__ = [
    "DETECTION_SETTINGS",
    "Change",
    "IncidentChange",
    "IncidentCollector",
    "IncidentDiff",
    "Replayed",
    "Variant",
    "diff_incidents",
    "load_xid_overrides",
    "read_env_file",
    "replay_in_memory",
    "tunables",
]


# -- comparing two incident lists (pure) ------------------------------------------------------


class Change(StrEnum):
    """What a candidate configuration did to one incident."""

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"
    UNCHANGED = "unchanged"


#: The order summaries list the changes in.
CHANGES = (Change.ADDED, Change.REMOVED, Change.CHANGED, Change.UNCHANGED)

_Subject = tuple[str, str, str, str]


def _subject(incident: Incident) -> _Subject:
    return (incident.cluster, incident.kind.value, incident.node, incident.gpu)


@dataclass(frozen=True, slots=True)
class IncidentChange:
    """One incident of either run, paired with its counterpart in the other run if there is one.

    Attributes
    ----------
    change
        Added (candidate only), removed (base only), changed or unchanged (both).
    base, candidate
        The incident's last version in each run (None where it is absent).
    differences
        For a changed incident, what differs: ``severity``, ``first_evidence``.
    """

    change: Change
    base: Incident | None
    candidate: Incident | None
    differences: tuple[str, ...] = ()

    @property
    def either(self) -> Incident:
        """The candidate's incident, else the base's (every change has at least one)."""
        incident = self.candidate or self.base
        assert incident is not None
        return incident

    @property
    def first_evidence_ms(self) -> int:
        """The earlier first evidence of the two: when the change first shows."""
        return min(i.first_evidence_ms for i in (self.base, self.candidate) if i is not None)

    def sort_key(self) -> tuple[int, str, str, str, str]:
        """Time, then kind and where."""
        cluster, kind, node, gpu = _subject(self.either)
        return (self.first_evidence_ms, kind, cluster, node, gpu)


def _overlap(a: Incident, b: Incident) -> bool:
    return a.first_evidence_ms <= b.last_evidence_ms and b.first_evidence_ms <= a.last_evidence_ms


def _compare(base: Incident, candidate: Incident) -> IncidentChange:
    differences = tuple(
        name
        for name, differs in (
            ("severity", base.severity is not candidate.severity),
            ("first_evidence", base.first_evidence_ms != candidate.first_evidence_ms),
        )
        if differs
    )
    return IncidentChange(Change.CHANGED if differences else Change.UNCHANGED, base, candidate, differences)


def _pair(base: list[Incident], candidate: list[Incident]) -> Iterator[IncidentChange]:
    """Pair the incidents of one subject: equal ids first, then overlapping evidence spans in time
    order; the rest were added or removed."""
    by_id = {incident.incident_id: incident for incident in candidate}
    unpaired_base: list[Incident] = []
    paired: set[str] = set()
    for incident in base:
        twin = by_id.get(incident.incident_id)
        if twin is None:
            unpaired_base.append(incident)
        else:
            paired.add(twin.incident_id)
            yield _compare(incident, twin)
    rest = sorted((i for i in candidate if i.incident_id not in paired), key=lambda i: i.first_evidence_ms)
    for incident in sorted(unpaired_base, key=lambda i: i.first_evidence_ms):
        twin = next((other for other in rest if _overlap(incident, other)), None)
        if twin is None:
            yield IncidentChange(Change.REMOVED, incident, None)
        else:
            rest.remove(twin)
            yield _compare(incident, twin)
    for incident in rest:
        yield IncidentChange(Change.ADDED, None, incident)


@dataclass(frozen=True, slots=True)
class IncidentDiff:
    """Every incident of two runs, each marked added, removed, changed or unchanged, in time order."""

    changes: tuple[IncidentChange, ...]

    def counts(self) -> dict[Change, int]:
        """Incidents per change, every change named (0 included)."""
        counted = Counter(change.change for change in self.changes)
        return {change: counted[change] for change in CHANGES}

    def counts_by_kind(self) -> dict[str, dict[Change, int]]:
        """Incidents per incident kind and change, for the kinds that appear in either run."""
        table: dict[str, Counter[Change]] = {}
        for change in self.changes:
            table.setdefault(change.either.kind.value, Counter())[change.change] += 1
        return {kind: {c: counted[c] for c in CHANGES} for kind, counted in sorted(table.items())}

    @property
    def differs(self) -> bool:
        """Whether any incident was added, removed or changed."""
        return any(change.change is not Change.UNCHANGED for change in self.changes)


def diff_incidents(base: Iterable[Incident], candidate: Iterable[Incident]) -> IncidentDiff:
    """Compare the incidents of a base run with those of a candidate run of the same history.

    Parameters
    ----------
    base, candidate
        Each run's incidents, one (the last) version per incident id.

    Returns
    -------
    IncidentDiff
        Every incident of either run, paired where the two runs have the same incident.

    Examples
    --------
    >>> from schemas.outputs import IncidentKind, IncidentStatus
    >>> def incident(first, last, severity="warn", gpu="0"):
    ...     return Incident(f"inc-{gpu}-{first}", IncidentKind.XID_STORM, Severity(severity),
    ...         IncidentStatus.RESOLVED, "c", "n1", gpu, first, last, first, "xid_burst", 1.0, "", "",
    ...         {}, 1, 2)
    >>> diff = diff_incidents([incident(10, 50), incident(0, 0, gpu="1")], [incident(20, 50, "critical")])
    >>> [(c.change.value, c.differences) for c in diff.changes]
    [('removed', ()), ('changed', ('severity', 'first_evidence'))]
    """
    base_by: dict[_Subject, list[Incident]] = {}
    candidate_by: dict[_Subject, list[Incident]] = {}
    for incident in base:
        base_by.setdefault(_subject(incident), []).append(incident)
    for incident in candidate:
        candidate_by.setdefault(_subject(incident), []).append(incident)
    changes = [
        change
        for subject in base_by.keys() | candidate_by.keys()
        for change in _pair(base_by.get(subject, []), candidate_by.get(subject, []))
    ]
    return IncidentDiff(tuple(sorted(changes, key=IncidentChange.sort_key)))


# -- the two configurations -------------------------------------------------------------------

#: The settings that change what the detectors decide (the rest say where data goes).
DETECTION_SETTINGS = (
    "allowed_lateness_seconds",
    "quiet_period_seconds",
    "attribution_before_seconds",
    "attribution_after_seconds",
    "gpus_per_node",
    "windows_seconds",
    "size_buckets",
    "ecc_keep_interval_seconds",
)

#: CoreConfig fields filled from settings: set through the setting, not directly.
_FROM_SETTINGS = frozenset(
    {
        "windows_s",
        "size_buckets",
        "allowed_lateness_ms",
        "quiet_period_ms",
        "attribution_before_ms",
        "attribution_after_ms",
        "gpus_per_node",
        "ecc_keep_interval_ms",
    }
)

_NUMBER_TYPES = {"int": int, "float": float}


def tunables() -> dict[str, type]:
    """The detector tunables ``--set`` accepts besides settings, with their types.

    Numeric fields of :class:`~detectors.core.CoreConfig` that no setting fills, and of its
    :class:`~detectors.lemon.LemonConfig` as ``lemon.<field>``.

    >>> tunables()["storm_min_events"], tunables()["lemon.threshold"]
    (<class 'int'>, <class 'float'>)
    """
    found: dict[str, type] = {}
    for spec in fields(CoreConfig):
        kind = _NUMBER_TYPES.get(str(spec.type))
        if kind is not None and spec.name not in _FROM_SETTINGS:
            found[spec.name] = kind
    for spec in fields(LemonConfig):
        kind = _NUMBER_TYPES.get(str(spec.type))
        if kind is not None:
            found[f"lemon.{spec.name}"] = kind
    return found


def _setting_name(name: str) -> str | None:
    """The settings field a ``--set`` name means (``FAULTSTREAM_QUIET_PERIOD_SECONDS`` or
    ``quiet_period_seconds``), None if it names no setting."""
    field_name = name.lower().removeprefix(ENV_PREFIX.lower())
    known = {spec.name for spec in fields(Settings)}
    return field_name if field_name in known else None


@dataclass(frozen=True, slots=True)
class Variant:
    """One of the two configurations a diff replays under.

    Attributes
    ----------
    label
        ``base`` or ``candidate``.
    settings
        The settings (the environment with this variant's settings assigned).
    tunables
        Detector tunables set on top of the settings' core configuration.
    xid_overrides
        Catalog entries changed or added.
    assignments
        The environment files, ``NAME=VALUE`` texts and catalog files that made it from where it
        started (the environment, or the variant it started from), for the summary.
    """

    label: str
    settings: Settings
    tunables: Mapping[str, int | float] = field(default_factory=dict)
    xid_overrides: tuple[XidOverride, ...] = ()
    assignments: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        label: str,
        assignments: Iterable[str],
        catalogs: Iterable[Path] = (),
        environ: Mapping[str, str] | None = None,
        env_files: Iterable[Path] = (),
        start: Variant | None = None,
    ) -> Variant:
        """The variant made by ``NAME=VALUE`` assignments and catalog override files.

        The settings are read from ``environ`` (default: the process environment), or from
        ``start``'s settings when given, then the ``FAULTSTREAM_*`` variables of ``env_files`` in
        order (:func:`read_env_file`), then the assignments. Tunables and catalog overrides are
        ``start``'s with these on top.

        Raises
        ------
        SettingsError
            For an assignment without ``=``, an unknown name, a setting that does not change
            detection, or a value of the wrong type.
        ValueError
            For a catalog file that cannot be used (:func:`load_xid_overrides`).
        """
        env = dict(os.environ if environ is None else environ)
        if start is not None:
            # Every field is an int, float or str, whose str() reads back as the same value.
            env.update(
                (ENV_PREFIX + spec.name.upper(), str(getattr(start.settings, spec.name)))
                for spec in fields(Settings)
            )
        files = tuple(env_files)
        for path in files:
            env.update(read_env_file(path))
        texts = tuple(assignments)
        tuned: dict[str, int | float] = {} if start is None else dict(start.tunables)
        known_tunables = tunables()
        for text in texts:
            name, sep, value = text.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not name:
                raise SettingsError(f"{label}: {text!r} is not NAME=VALUE")
            setting = _setting_name(name)
            if setting is not None:
                if setting not in DETECTION_SETTINGS:
                    raise SettingsError(
                        f"{label}: {ENV_PREFIX}{setting.upper()} does not change what the detectors "
                        f"decide; diff compares incidents (settings it takes: "
                        f"{', '.join(DETECTION_SETTINGS)})"
                    )
                env[ENV_PREFIX + setting.upper()] = value
            elif name.lower() in known_tunables:
                kind = known_tunables[name.lower()]
                try:
                    tuned[name.lower()] = kind(value)
                except ValueError:
                    raise SettingsError(f"{label}: {name}={value!r}: expected {kind.__name__}") from None
            else:
                raise SettingsError(
                    f"{label}: unknown setting {name!r}: use a FAULTSTREAM_* setting that changes "
                    f"detection ({', '.join(DETECTION_SETTINGS)}) or a detector tunable "
                    f"({', '.join(sorted(known_tunables))})"
                )
        overrides: list[XidOverride] = [] if start is None else list(start.xid_overrides)
        catalog_files = tuple(catalogs)
        for path in catalog_files:
            overrides.extend(load_xid_overrides(path))
        variant = cls(
            label,
            Settings.from_env(env),
            tuned,
            tuple(overrides),
            tuple(f"env {path}" for path in files)
            + texts
            + tuple(f"catalog {path}" for path in catalog_files),
        )
        variant.core_config()  # a bad combination fails before hours of replay, not after
        return variant

    def core_config(self) -> CoreConfig:
        """The core configuration: the settings', with the tunables set."""
        config = self.settings.core_config()
        # Field names and types were checked against the dataclasses when the variant was built.
        core: dict[str, Any] = {k: v for k, v in self.tunables.items() if not k.startswith("lemon.")}
        lemon: dict[str, Any] = {k[6:]: v for k, v in self.tunables.items() if k.startswith("lemon.")}
        try:
            if lemon:
                core["lemon"] = replace(config.lemon, **lemon)
            return replace(config, **core)
        except ValueError as exc:
            raise SettingsError(f"{self.label}: {exc}") from None

    def core(self) -> DetectionCore:
        """A fresh detection core of this configuration."""
        return DetectionCore(self.core_config(), xid_overrides=self.xid_overrides)


def read_env_file(path: Path) -> dict[str, str]:
    """The ``FAULTSTREAM_*`` variables of an environment file, as Docker Compose reads one.

    ``NAME=VALUE`` lines, values taken literally; blank lines and ``#`` comments skipped; other
    variables (a compose file's passwords and ports) ignored. An unknown ``FAULTSTREAM_`` name is
    refused: it is a typo that would otherwise leave the setting at its default unnoticed.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    SettingsError
        For a line that is not ``NAME=VALUE`` or an unknown ``FAULTSTREAM_`` name (with the line
        number).
    """
    found: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, value = text.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not name:
            raise SettingsError(f"{path}:{number}: expected NAME=VALUE, got {text!r}")
        if not name.startswith(ENV_PREFIX):
            continue
        if _setting_name(name) is None:
            raise SettingsError(f"{path}:{number}: unknown setting {name} (faultstream config lists them)")
        found[name] = value
    return found


_OVERRIDE_KEYS = {"name", "category", "severity", "hardware", "action"}


def load_xid_overrides(path: Path) -> tuple[XidOverride, ...]:
    """Read a catalog override file: TOML, one ``[xid.CODE]`` table per code changed or added.

    Each table sets any of ``severity`` (info, warn, critical), ``category`` (an XID family such
    as memory or bus), ``hardware`` (true/false), ``action`` and ``name``; a code outside
    NVIDIA's catalog needs ``category`` and ``severity``.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    ValueError
        When it is not TOML, or a table, key or value cannot be used; the message names the file.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
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


# -- replaying in memory ----------------------------------------------------------------------


class IncidentCollector:
    """A :class:`~stream.pipeline.RecordSink` that keeps each incident's last version and drops the rest."""

    def __init__(self) -> None:
        #: Incident id -> its latest version.
        self.incidents: dict[str, Incident] = {}

    def add(self, item: object, partition: int = 0) -> None:
        """Records and dead letters are not compared: dropped."""

    def add_emitted(self, emitted: Emitted, partition: int = 0) -> None:
        """Keep the incidents' newest versions."""
        for incident in emitted.incidents:
            known = self.incidents.get(incident.incident_id)
            if known is None or incident.version >= known.version:
                self.incidents[incident.incident_id] = incident


@dataclass(slots=True)
class Replayed:
    """One variant's run: what was read and the incidents it decided."""

    summary: ReplaySummary
    incidents: list[Incident]


def replay_in_memory(
    paths: Iterable[Path],
    variant: Variant,
    options: ParseOptions,
    fmt: Format | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Replayed:
    """Replay files through a core of ``variant`` into memory, as ``faultstream replay`` would.

    ``options`` are the parser options of both variants; the variant's ``gpus_per_node`` replaces
    theirs (it is what jobs that state no GPU count are read with).

    Raises
    ------
    DeadLetterLimitExceeded
        When too many of a file's records are bad.
    """
    sink = IncidentCollector()
    options = replace(options, gpus_per_node=variant.settings.gpus_per_node)
    summary = run_files(paths, variant.settings, variant.core(), sink, options, fmt=fmt, progress=progress)
    return Replayed(summary, list(sink.incidents.values()))
