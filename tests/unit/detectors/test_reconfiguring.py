"""A core restored under a changed configuration: thresholds change in place, the state goes on."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from detectors.core import CoreConfig, DetectionCore
from detectors.lemon import LemonConfig
from detectors.reconfiguring import FIXED_FIELDS, ConfigurationRefused, config_differences, reconfigure
from schemas.outputs import IncidentKind
from schemas.records import XidEvent

MIN = 60_000
T0 = 1_704_067_200_000


def xids(core: DetectionCore, start: int, count: int) -> list[IncidentKind]:
    """Feed ``count`` XID 13s of one GPU a minute apart; the kinds of the incidents made."""
    for i in range(count):
        core.process(XidEvent(ts_ms=start + i * MIN, cluster="c", node="n1", xid=13, pci_bus_id="0000:07:00"))
    return [incident.kind for incident in core.drain().incidents]


def test_a_lowered_storm_threshold_judges_what_comes_after_the_restore() -> None:
    core = DetectionCore(CoreConfig())  # storms need 10 XIDs within the hour
    assert IncidentKind.XID_STORM not in xids(core, T0, 6)
    restored: DetectionCore = pickle.loads(pickle.dumps(core))
    assert reconfigure(restored, CoreConfig(storm_min_events=8)) == ["storm_min_events: 10 -> 8"]
    # The seventh and eighth XID of the same burst: 8 within the hour now make a storm.
    assert IncidentKind.XID_STORM in xids(restored, T0 + 6 * MIN, 2)
    unchanged: DetectionCore = pickle.loads(pickle.dumps(core))
    assert IncidentKind.XID_STORM not in xids(unchanged, T0 + 6 * MIN, 2)


def test_the_quiet_periods_and_the_lemon_threshold_change_in_place() -> None:
    core = DetectionCore(CoreConfig())
    new = CoreConfig(
        quiet_period_ms=2 * 3_600_000, lemon=LemonConfig(threshold=11.0), ecc_trend_threshold=7.5
    )
    changes = reconfigure(core, new)
    assert changes == [
        "quiet_period_ms: 3600000 -> 7200000",
        "ecc_trend_threshold: 6.0 -> 7.5",
        "lemon.threshold: 8.0 -> 11.0",
    ]
    assert core._incidents.quiet_period_ms == 2 * 3_600_000
    assert core.fleet is not None and core.fleet._lemons.config.threshold == 11.0
    assert core._ecc._trend_template.threshold == 7.5


@pytest.mark.parametrize(
    "changed",
    [
        CoreConfig(windows_s=(3600,)),
        CoreConfig(allowed_lateness_ms=60_000),
        CoreConfig(gpus_per_node=4),
        CoreConfig(lemon=LemonConfig(window_ms=7 * 86_400_000)),
    ],
)
def test_a_setting_that_shapes_the_state_is_refused_and_nothing_changes(changed: CoreConfig) -> None:
    core = DetectionCore(CoreConfig())
    with pytest.raises(ConfigurationRefused) as refused:
        reconfigure(core, dataclasses.replace(changed, storm_min_events=3))
    [(name, _old, _new)] = [d for d in config_differences(CoreConfig(), changed)]
    assert name in FIXED_FIELDS and name in str(refused.value)
    assert core.config == CoreConfig()  # not half applied


def test_the_same_configuration_changes_nothing() -> None:
    core = DetectionCore(CoreConfig())
    assert reconfigure(core, CoreConfig()) == []
