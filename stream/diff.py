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

import difflib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from pathlib import Path

from detectors.core import CoreConfig, DetectionCore, Emitted
from detectors.xid_catalog import XidOverride
from schemas.outputs import Incident
from stream.inputs.parsers import Format
from stream.inputs.parsers.options import ParseOptions
from stream.replay import ReplaySummary, run_files
from stream.settings import DETECTOR_SETTINGS, ENV_PREFIX, Settings, SettingsError
from stream.xid_overrides import load_xid_overrides

__all__ = [
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
    >>> from schemas.outputs import IncidentKind, IncidentStatus, Severity
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


def _setting_name(name: str) -> str | None:
    """The settings field a ``--set`` name means (``FAULTSTREAM_STORM_MIN_EVENTS``,
    ``storm_min_events``, or the dotted form ``lemon.threshold``), None if it names no setting."""
    field_name = name.lower().removeprefix(ENV_PREFIX.lower()).replace(".", "_")
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
    xid_overrides
        Catalog entries changed or added (the settings' ``xid_catalog_file`` and ``--catalog``
        files).
    assignments
        The environment files, ``NAME=VALUE`` texts and catalog files that made it from where it
        started (the environment, or the variant it started from), for the summary.
    """

    label: str
    settings: Settings
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

        The settings are read from ``environ`` (default: the process environment, with the
        configuration file it names), or from ``start``'s settings when given, then the
        ``FAULTSTREAM_*`` variables of ``env_files`` in order (:func:`read_env_file`), then the
        assignments: settings that change what the detectors decide
        (:data:`~stream.settings.DETECTOR_SETTINGS`), named as everywhere else. Catalog overrides
        are ``start``'s with these files' on top.

        Raises
        ------
        SettingsError
            For an assignment without ``=``, an unknown name, a setting that does not change
            detection, or a value of the wrong type or out of its range.
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
        for text in texts:
            name, sep, value = text.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not name:
                raise SettingsError(f"{label}: {text!r} is not NAME=VALUE")
            setting = _setting_name(name)
            if setting is None:
                close = difflib.get_close_matches(name.lower().replace(".", "_"), DETECTOR_SETTINGS, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                raise SettingsError(
                    f"{label}: unknown setting {name!r} ({hint}settings that change detection: "
                    f"{', '.join(DETECTOR_SETTINGS)})"
                )
            if setting not in DETECTOR_SETTINGS:
                raise SettingsError(
                    f"{label}: {ENV_PREFIX}{setting.upper()} does not change what the detectors "
                    f"decide; diff compares incidents (settings it takes: {', '.join(DETECTOR_SETTINGS)})"
                )
            env[ENV_PREFIX + setting.upper()] = value
        try:
            settings = Settings.from_env(env)
            overrides = [] if start is None else list(start.xid_overrides)
            if start is None or settings.xid_catalog_file != start.settings.xid_catalog_file:
                overrides.extend(settings.xid_overrides())
        except SettingsError as exc:
            raise SettingsError(f"{label}: {exc}") from None
        catalog_files = tuple(catalogs)
        for path in catalog_files:
            overrides.extend(load_xid_overrides(path))
        return cls(
            label,
            settings,
            tuple(overrides),
            tuple(f"env {path}" for path in files)
            + texts
            + tuple(f"catalog {path}" for path in catalog_files),
        )

    def core_config(self) -> CoreConfig:
        """The core configuration of this variant's settings."""
        return self.settings.core_config()

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
