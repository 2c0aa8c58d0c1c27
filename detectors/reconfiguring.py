"""A restored detection core under a changed configuration: the thresholds change in place, the
settings that shape its state cannot.

A worker restored from a checkpoint continues its partition's detector state. When it runs with
another configuration than the one the checkpoint was made under (a threshold found with
``faultstream diff`` and deployed), the state goes on and the new thresholds judge what comes from
then on: a storm needs the new ``storm_min_events`` from the next XID, an open incident resolves
after the new quiet period from its next evidence, the lemon statistics are compared with the new
threshold at the next evaluation. Nothing decided before is decided again.

Some settings shape the state itself, and cannot change under it: the MTTF windows and job-size
buckets (partial rows are stored by window and bucket), the lateness and the attribution window
(the fleet stage's horizons and every held record rely on them), the periods and windows of the
fleet's baselines and references (decided period by period), the GPUs of a node, the ECC trend's
sample window and the lemon window. A change of one of those is refused
(:class:`ConfigurationRefused`), naming each, so that the operator either restores the value or
starts the detectors afresh.

>>> from detectors.core import CoreConfig, DetectionCore
>>> core = DetectionCore(CoreConfig())
>>> reconfigure(core, CoreConfig(storm_min_events=5))
['storm_min_events: 10 -> 5']
>>> core.config.storm_min_events, core._storm_template.anomaly_detector.min_events
(5, 5)
>>> reconfigure(core, CoreConfig(storm_min_events=5, windows_s=(3600,)))
Traceback (most recent call last):
...
detectors.reconfiguring.ConfigurationRefused: windows_s: (3600, 86400) -> (3600,)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    from detectors.core import CoreConfig, DetectionCore
    from detectors.ecc_trend import EccTrendScorer
    from detectors.fleet import FleetConfig, FleetCore
    from detectors.xid_burst import XidSpreadScorer, XidStormScorer

__all__ = ["FIXED_FIELDS", "ConfigurationRefused", "config_differences", "reconfigure", "reconfigure_fleet"]

#: Core configuration fields that shape the state a core holds (``lemon.window_ms``: the lemon
#: detector's own).
FIXED_FIELDS: Final = frozenset(
    {
        "windows_s",
        "size_buckets",
        "allowed_lateness_ms",
        "attribution_before_ms",
        "attribution_after_ms",
        "gpus_per_node",
        "storm_baseline_period_ms",
        "ecc_reference_period_ms",
        "ecc_reference_window_ms",
        "ecc_trend_window",
        "lemon.window_ms",
    }
)


class ConfigurationRefused(ValueError):
    """A configuration change that the restored state cannot take: each field, old -> new."""


def _flat(config: CoreConfig) -> dict[str, Any]:
    plain: dict[str, Any] = {}
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if spec.name == "lemon":
            plain.update(
                {f"lemon.{inner.name}": getattr(value, inner.name) for inner in dataclasses.fields(value)}
            )
        else:
            plain[spec.name] = value
    return plain


def config_differences(before: CoreConfig, after: CoreConfig) -> list[tuple[str, Any, Any]]:
    """``(field, old, new)`` for each field that differs (the lemon detector's as ``lemon.<field>``).

    >>> from detectors.core import CoreConfig
    >>> config_differences(CoreConfig(), CoreConfig(storm_min_events=3))
    [('storm_min_events', 10, 3)]
    """
    old, new = _flat(before), _flat(after)
    return [(name, old[name], new[name]) for name in old if old[name] != new[name]]


def _describe(changes: Iterable[tuple[str, Any, Any]]) -> list[str]:
    return [f"{name}: {_shown(old)} -> {_shown(new)}" for name, old, new in changes]


def _shown(value: Any) -> str:
    bounds = getattr(value, "bounds", None)
    return repr(bounds) if bounds is not None else repr(value)


def reconfigure(core: DetectionCore, config: CoreConfig) -> list[str]:
    """Apply ``config`` to a core restored under another: its thresholds change in place, its
    state goes on. Return what changed, ``name: old -> new`` (empty: nothing).

    Raises
    ------
    ConfigurationRefused
        When a field of :data:`FIXED_FIELDS` differs (nothing is changed then).
    """
    changes = config_differences(core.config, config)
    fixed = [change for change in changes if change[0] in FIXED_FIELDS]
    if fixed:
        raise ConfigurationRefused("; ".join(_describe(fixed)))
    if not changes:
        return []
    for model in (core._storm_template, *core._storms.values()):
        storm = cast("XidStormScorer", model.anomaly_detector)
        storm.window_hours = config.storm_window_hours
        storm.min_events = config.storm_min_events
    for model in (core._spread_template, *core._spreads.values()):
        scorer = cast("XidSpreadScorer", model.anomaly_detector)
        scorer.window_hours = config.spread_window_hours
        scorer.min_events = config.spread_min_events
        scorer.min_gpus = config.spread_min_gpus
        scorer.min_bursts = config.spread_min_bursts
    ecc = core._ecc
    ecc.keep_interval_ms = config.ecc_keep_interval_ms
    for model in (ecc._trend_template, *ecc._trends.values()):
        model.threshold = config.ecc_trend_threshold
        cast("EccTrendScorer", model.anomaly_detector).floor_per_day = config.ecc_trend_floor_per_day
    core._incidents.quiet_period_ms = config.quiet_period_ms
    core._incidents.quiet_period_by_kind = dict(config.quiet_period_by_kind_ms)
    core.config = config
    if core.fleet is not None:
        reconfigure_fleet(core.fleet, config.fleet_config())
    return _describe(changes)


def reconfigure_fleet(fleet: FleetCore, config: FleetConfig) -> None:
    """Apply a fleet configuration whose fixed fields are unchanged (:func:`reconfigure` checked
    the core configuration it comes from) to a fleet stage restored under another."""
    fleet.config = config
    fleet._lemons.config = config.lemon
