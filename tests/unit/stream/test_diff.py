"""The what-if comparison: two incident lists -> added, removed, changed; the two configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.core import CoreConfig
from detectors.xid_catalog import XidCategory
from schemas.outputs import Incident, IncidentKind, IncidentStatus, Severity
from stream.diff import Change, IncidentCollector, Variant, diff_incidents, load_xid_overrides
from stream.settings import SettingsError

HOUR = 3_600_000


def incident(
    first_h: float,
    last_h: float | None = None,
    *,
    severity: str = "warn",
    kind: IncidentKind = IncidentKind.XID_STORM,
    node: str = "n1",
    gpu: str = "0000:07:00",
    version: int = 2,
) -> Incident:
    first, last = int(first_h * HOUR), int((first_h if last_h is None else last_h) * HOUR)
    return Incident(
        incident_id=f"inc-{kind}-{node}-{gpu}-{first}",
        kind=kind,
        severity=Severity(severity),
        status=IncidentStatus.RESOLVED,
        cluster="c",
        node=node,
        gpu=gpu,
        first_evidence_ms=first,
        last_evidence_ms=last,
        detected_ms=first,
        detector="test",
        score=1.0,
        action="",
        summary="",
        evidence={},
        evidence_count=1,
        version=version,
    )


def changes(diff) -> list[tuple[str, str, tuple[str, ...]]]:  # type: ignore[no-untyped-def]
    return [(c.change.value, c.either.node, c.differences) for c in diff.changes]


def test_the_same_incidents_give_no_difference() -> None:
    same = [incident(1), incident(5, 6, node="n2"), incident(2, kind=IncidentKind.LEMON_NODE, gpu="")]
    diff = diff_incidents(same, list(reversed(same)))
    assert not diff.differs
    assert diff.counts() == {Change.ADDED: 0, Change.REMOVED: 0, Change.CHANGED: 0, Change.UNCHANGED: 3}


def test_nothing_against_nothing() -> None:
    diff = diff_incidents([], [])
    assert diff.changes == () and not diff.differs
    assert set(diff.counts().values()) == {0}


def test_an_incident_only_in_the_candidate_is_added_and_one_only_in_the_base_removed() -> None:
    diff = diff_incidents([incident(1, node="gone")], [incident(3, node="new")])
    assert changes(diff) == [("removed", "gone", ()), ("added", "new", ())]
    assert diff.changes[0].candidate is None and diff.changes[1].base is None
    assert diff.counts()[Change.ADDED] == diff.counts()[Change.REMOVED] == 1


def test_a_severity_change_of_the_same_incident_is_a_change() -> None:
    diff = diff_incidents([incident(1)], [incident(1, severity="critical")])
    [change] = diff.changes
    assert change.change is Change.CHANGED and change.differences == ("severity",)
    assert change.base is not None and change.base.severity is Severity.WARN
    assert change.candidate is not None and change.candidate.severity is Severity.CRITICAL


def test_an_earlier_first_evidence_is_the_same_incident_changed_not_one_removed_and_one_added() -> None:
    # A lower storm floor opens the storm two minutes earlier: another id, the same storm.
    base, candidate = incident(10, 12), incident(10 - 2 / 60, 12)
    assert base.incident_id != candidate.incident_id
    [change] = diff_incidents([base], [candidate]).changes
    assert change.change is Change.CHANGED and change.differences == ("first_evidence",)
    assert change.first_evidence_ms == candidate.first_evidence_ms


def test_incidents_of_other_subjects_or_kinds_never_pair() -> None:
    diff = diff_incidents([incident(1, 3)], [incident(1, 3, gpu="0000:87:00"), incident(1, 3, node="n9")])
    assert sorted(c.change.value for c in diff.changes) == ["added", "added", "removed"]
    other_kind = diff_incidents([incident(1)], [incident(1, kind=IncidentKind.GPU_MEMORY)])
    assert sorted(c.change.value for c in other_kind.changes) == ["added", "removed"]


def test_an_incident_split_in_two_keeps_the_first_and_adds_the_second() -> None:
    # A shorter quiet period resolves the incident between two bursts: the second burst is new.
    diff = diff_incidents([incident(1, 9)], [incident(1, 2), incident(8, 9)])
    assert [(c.change.value, c.differences) for c in diff.changes] == [("unchanged", ()), ("added", ())]


def test_a_later_incident_that_does_not_overlap_is_removed_and_added() -> None:
    diff = diff_incidents([incident(1, 2)], [incident(5, 6)])
    assert sorted(c.change.value for c in diff.changes) == ["added", "removed"]


def test_changes_come_in_time_order_and_are_counted_per_kind() -> None:
    base = [incident(5), incident(1, kind=IncidentKind.LEMON_NODE, gpu="")]
    candidate = [incident(5, severity="critical"), incident(3, node="n2")]
    diff = diff_incidents(base, candidate)
    assert [c.first_evidence_ms // HOUR for c in diff.changes] == [1, 3, 5]
    assert diff.counts_by_kind() == {
        "lemon_node": {Change.ADDED: 0, Change.REMOVED: 1, Change.CHANGED: 0, Change.UNCHANGED: 0},
        "xid_storm": {Change.ADDED: 1, Change.REMOVED: 0, Change.CHANGED: 1, Change.UNCHANGED: 0},
    }


def test_the_collector_keeps_each_incidents_newest_version() -> None:
    from detectors.core import Emitted

    sink = IncidentCollector()
    sink.add(object())
    sink.add_emitted(Emitted(incidents=[incident(1, version=4), incident(1, version=2), incident(2)]))
    assert {i.incident_id: i.version for i in sink.incidents.values()} == {
        incident(1).incident_id: 4,
        incident(2).incident_id: 2,
    }


# -- the configurations ------------------------------------------------------------------------


def test_settings_are_named_as_variables_or_fields_and_tunables_by_their_field() -> None:
    variant = Variant.build(
        "candidate",
        [
            "FAULTSTREAM_QUIET_PERIOD_SECONDS=7200",
            "gpus_per_node=4",
            "storm_min_events=10",
            "lemon.threshold=5.5",
        ],
        environ={},
    )
    config = variant.core_config()
    assert config.quiet_period_ms == 2 * HOUR and config.gpus_per_node == 4
    assert config.storm_min_events == 10 and config.lemon.threshold == 5.5
    assert Variant.build("base", [], environ={}).core_config() == CoreConfig()


def test_the_environment_is_the_base_and_an_assignment_overrides_it() -> None:
    env = {"FAULTSTREAM_QUIET_PERIOD_SECONDS": "60"}
    assert Variant.build("base", [], environ=env).core_config().quiet_period_ms == 60_000
    changed = Variant.build("c", ["quiet_period_seconds=120"], environ=env)
    assert changed.core_config().quiet_period_ms == 120_000


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("storm_min_events", "is not NAME=VALUE"),
        ("no_such_thing=3", "unknown setting 'no_such_thing'"),
        ("FAULTSTREAM_KAFKA_BOOTSTRAP=h:1", "does not change what the detectors decide"),
        ("storm_min_events=many", "expected int"),
        ("FAULTSTREAM_QUIET_PERIOD_SECONDS=soon", "expected int"),
        ("windows_seconds=-5", "not a list of positive integer seconds"),
        ("storm_baseline_period_seconds=1", "storm baseline period must be longer"),
        ("lemon_trim_share=1.5", r"FAULTSTREAM_LEMON_TRIM_SHARE=1.5: must be >= 0 and < 1"),
    ],
)
def test_a_bad_assignment_is_refused_with_a_message_that_names_it(assignment: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Variant.build("candidate", [assignment], environ={})


def test_the_closest_setting_is_offered_when_a_name_is_unknown() -> None:
    with pytest.raises(
        SettingsError, match=r"did you mean storm_min_events\? settings that change detection"
    ):
        Variant.build("candidate", ["storm_min_event=10"], environ={})


# -- catalog override files --------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return path


def test_a_catalog_file_changes_a_code_and_adds_a_new_one(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[xid.13]\nseverity = "critical"\nhardware = true\n\n'
        '[xid.999]\nname = "A code from a newer driver"\ncategory = "memory"\nseverity = "warn"\n'
        'action = "check the memory"\n',
    )
    thirteen, new = load_xid_overrides(path)
    assert (thirteen.code, thirteen.severity, thirteen.hardware, thirteen.category) == (
        13,
        Severity.CRITICAL,
        True,
        None,
    )
    assert (new.code, new.category, new.severity, new.name) == (
        999,
        XidCategory.MEMORY,
        Severity.WARN,
        "A code from a newer driver",
    )
    assert new.source == str(path)
    assert Variant.build("c", [], [path], environ={}).xid_overrides == (thirteen, new)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[xid.13\n", "not TOML"),
        ('severity = "critical"\n', r"expected \[xid.CODE\] tables"),
        ('[xid.abc]\nseverity = "warn"\n', "whole XID code"),
        ('[xid.13]\nseverity = "page"\n', "severity must be info, warn or critical"),
        ('[xid.13]\ncategory = "unknown"\n', "category one of"),
        ('[xid.13]\nhardware = "yes"\n', "hardware must be true or false"),
        ('[xid.13]\nseverity = "warn"\ncolour = "red"\n', "unknown key 'colour'"),
        ("[xid.13]\n", "sets nothing"),
        ('[xid.999]\nseverity = "warn"\n', "needs a category and a severity"),
    ],
)
def test_a_bad_catalog_file_is_refused_with_the_file_and_the_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as error:
        load_xid_overrides(path)
    assert str(path) in str(error.value)


def test_a_missing_catalog_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.toml: No such file"):
        load_xid_overrides(tmp_path / "nope.toml")


def test_a_catalog_file_setting_is_the_base_s_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, '[xid.13]\nseverity = "critical"\n')
    base = Variant.build("base", [], environ={"FAULTSTREAM_XID_CATALOG_FILE": str(path)})
    assert [o.code for o in base.xid_overrides] == [13]
    candidate = Variant.build("candidate", ["storm_min_events=5"], environ={}, start=base)
    assert [o.code for o in candidate.xid_overrides] == [13]  # not twice


# -- environment files -------------------------------------------------------------------------


def test_an_env_file_gives_its_faultstream_variables_and_ignores_the_rest(tmp_path: Path) -> None:
    from stream.diff import read_env_file

    path = tmp_path / "prod.env"
    path.write_text(
        "# production\n\nCLICKHOUSE_ADMIN_PASSWORD=secret\nFAULTSTREAM_QUIET_PERIOD_SECONDS=600\n"
        "export FAULTSTREAM_KAFKA_BOOTSTRAP=kafka:9092\n"
    )
    assert read_env_file(path) == {
        "FAULTSTREAM_QUIET_PERIOD_SECONDS": "600",
        "FAULTSTREAM_KAFKA_BOOTSTRAP": "kafka:9092",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FAULTSTREAM_QUIET_PERIOD_SECOND=600\n", r":1: unknown setting FAULTSTREAM_QUIET_PERIOD_SECOND"),
        ("# ok\nFAULTSTREAM_QUIET_PERIOD_SECONDS\n", r":2: expected NAME=VALUE"),
    ],
)
def test_a_bad_env_file_line_is_refused_with_its_number(tmp_path: Path, text: str, message: str) -> None:
    from stream.diff import read_env_file

    path = tmp_path / "bad.env"
    path.write_text(text)
    with pytest.raises(SettingsError, match=message):
        read_env_file(path)


def test_env_files_come_over_the_environment_and_assignments_over_both(tmp_path: Path) -> None:
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    first.write_text("FAULTSTREAM_QUIET_PERIOD_SECONDS=60\nFAULTSTREAM_GPUS_PER_NODE=4\n")
    second.write_text("FAULTSTREAM_QUIET_PERIOD_SECONDS=120\n")
    env = {"FAULTSTREAM_QUIET_PERIOD_SECONDS": "30", "FAULTSTREAM_ALLOWED_LATENESS_SECONDS": "10"}
    variant = Variant.build("c", [], environ=env, env_files=[first, second])
    config = variant.core_config()
    assert (config.quiet_period_ms, config.gpus_per_node, config.allowed_lateness_ms) == (120_000, 4, 10_000)
    assert variant.assignments == (f"env {first}", f"env {second}")
    overridden = Variant.build("c", ["gpus_per_node=2"], environ=env, env_files=[first])
    assert overridden.core_config().gpus_per_node == 2


def test_the_candidate_starts_from_the_base_and_its_own_changes_win(tmp_path: Path) -> None:
    catalog = write(tmp_path, '[xid.13]\nseverity = "warn"\n')
    base = Variant.build(
        "base", ["quiet_period_seconds=60", "storm_min_events=5", "lemon.threshold=9"], [catalog], environ={}
    )
    env = tmp_path / "candidate.env"
    env.write_text("FAULTSTREAM_QUIET_PERIOD_SECONDS=120\n")
    candidate = Variant.build("candidate", ["storm_min_events=7"], environ={}, env_files=[env], start=base)
    config = candidate.core_config()
    # The candidate's env file wins over the base's --set; what it does not change is the base's.
    assert (config.quiet_period_ms, config.storm_min_events, config.lemon.threshold) == (120_000, 7, 9.0)
    assert candidate.xid_overrides == base.xid_overrides
    assert candidate.assignments == (f"env {env}", "storm_min_events=7")
    unchanged = Variant.build("candidate", [], environ={"FAULTSTREAM_QUIET_PERIOD_SECONDS": "5"}, start=base)
    assert unchanged.core_config() == base.core_config()
