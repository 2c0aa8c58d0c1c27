"""One configuration surface: a TOML file under the environment, every problem named, a fingerprint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from detectors.core import CoreConfig
from stream.cli.main import main
from stream.configuration import check_configuration, detector_configuration, fingerprint
from stream.settings import DETECTOR_SETTINGS, Settings, SettingsError


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "faultstream.toml"
    path.write_text(text)
    return path


def test_a_file_sets_any_setting_a_table_prefixes_its_keys_and_the_environment_wins(tmp_path: Path) -> None:
    path = toml(tmp_path, 'storm_min_events = 5\nkafka_bootstrap = "k:1"\n[lemon]\nthreshold = 9\n')
    settings = Settings.from_env({"FAULTSTREAM_CONFIG_FILE": str(path), "FAULTSTREAM_STORM_MIN_EVENTS": "7"})
    assert (settings.storm_min_events, settings.kafka_bootstrap, settings.lemon_threshold) == (7, "k:1", 9.0)
    config = settings.core_config()
    assert (config.storm_min_events, config.lemon.threshold) == (7, 9.0)
    assert Settings.from_env({"FAULTSTREAM_CONFIG_FILE": str(path)}, storm_min_events=3).storm_min_events == 3


def test_every_detector_tunable_is_a_setting_and_the_defaults_are_the_core_s() -> None:
    assert Settings().core_config() == CoreConfig()
    names = {name.split(".")[-1] for name in detector_configuration(CoreConfig())}
    assert {"storm_min_events", "threshold", "trim_share", "ecc_trend_threshold"} <= names
    assert {"storm_min_events", "lemon_threshold", "lemon_trim_share", "quiet_period_by_kind"} <= set(
        DETECTOR_SETTINGS
    )


def test_check_lists_every_problem_one_line_each(tmp_path: Path) -> None:
    path = toml(
        tmp_path,
        'storm_min_event = 3\ngpus_per_node = "8"\nstorm_min_events = 0\nlemon_trim_share = 2.0\n'
        'allowed_lateness_seconds = 90000\nxid_catalog_file = "/nonexistent/x.toml"\n',
    )
    settings, problems = check_configuration({}, path)
    assert settings is None
    assert problems == [
        f"{path}: storm_min_event: no such setting (did you mean storm_min_events?)",
        f"{path}: gpus_per_node = '8': expected an integer",
        "FAULTSTREAM_STORM_MIN_EVENTS=0: must be >= 1",
        "FAULTSTREAM_LEMON_TRIM_SHARE=2.0: must be >= 0 and < 1",
        "the detector settings are refused: the storm baseline period must be longer than the allowed "
        "lateness plus the attribution window after a job's end",
        "FAULTSTREAM_XID_CATALOG_FILE='/nonexistent/x.toml': /nonexistent/x.toml: No such file or directory",
    ]


def test_a_contradiction_alone_is_named_as_one(tmp_path: Path) -> None:
    _, problems = check_configuration({"FAULTSTREAM_ALLOWED_LATENESS_SECONDS": "90000"})
    assert problems == [
        "the detector settings contradict each other: the storm baseline period must be longer than the "
        "allowed lateness plus the attribution window after a job's end"
    ]


def test_a_file_that_is_not_toml_or_absent_is_one_clear_problem(tmp_path: Path) -> None:
    assert check_configuration({}, toml(tmp_path, "storm_min_events = \n"))[1][0].endswith(
        "not TOML (Invalid value (at line 1, column 20))"
    )
    assert "No such file" in check_configuration({}, tmp_path / "absent.toml")[1][0]
    with pytest.raises(SettingsError, match="no such setting"):
        Settings.from_env({"FAULTSTREAM_CONFIG_FILE": str(toml(tmp_path, "colour = 1\n"))})


def test_the_fingerprint_follows_the_detector_configuration_only() -> None:
    base = fingerprint(CoreConfig())
    assert base == fingerprint(Settings(kafka_bootstrap="elsewhere:1").core_config())
    assert base != fingerprint(Settings(storm_min_events=5).core_config())
    before, after = (
        detector_configuration(CoreConfig()),
        detector_configuration(CoreConfig(storm_min_events=5)),
    )
    assert {name: (before[name], after[name]) for name in before if before[name] != after[name]} == {
        "storm_min_events": (10, 5)
    }


def test_config_check_prints_the_problems_or_the_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = toml(tmp_path, "storm_min_events = 0\n")
    assert main(["config", "--check", str(bad)]) == 1
    assert capsys.readouterr().out == "FAULTSTREAM_STORM_MIN_EVENTS=0: must be >= 1\n"
    good = tmp_path / "good.toml"
    good.write_text("storm_min_events = 5\n")
    assert main(["--config", str(good), "config", "--check"]) == 0
    assert capsys.readouterr().out == (
        f"configuration OK: detector fingerprint {fingerprint(CoreConfig(storm_min_events=5))}\n"
    )
    assert "FAULTSTREAM_CONFIG_FILE" not in os.environ  # --config is the command's, not the process's
