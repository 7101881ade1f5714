"""The replay engine's inputs from the shipped configuration: the rules' timings from
`rules/config.yaml` (or another rules config), the names of the alerts those rules define, and
the responder's decisions from its defaults (or a `responder-config.yaml`).

Here, not in `responder.replay`: the responder and the rules are services that never import each
other; this layer, above them, joins the two for `gpuhealth backtest` and the fleet benchmark.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import yaml

from responder.config import load
from responder.replay.alerting import RuleTimings
from responder.replay.engine import ReplaySettings
from responder.settings import ResponderSettings
from rules.render import DEFAULT_CONFIG, Settings, load_config, render, unknown_window


def rule_timings(path: Path = DEFAULT_CONFIG) -> RuleTimings:
    """What the alerting model needs from a rules configuration (the shipped one by default)."""
    return timings_of(load_config(path))


def timings_of(settings: Settings) -> RuleTimings:
    device, node, dcgm, route = settings.device, settings.node, settings.dcgm, settings.alertmanager
    return RuleTimings(
        evaluation_interval=float(settings.evaluation_interval.seconds),
        heartbeat_limit=float(device.heartbeat_limit.seconds),
        unhealthy_for=float(device.unhealthy_for.seconds),
        event_window=float(device.event_window.seconds),
        unknown_window=partial(unknown_window, device),
        unknown_repeat_window=float(device.unknown_repeat_window.seconds),
        flapping_episodes=device.flapping_episodes,
        flapping_window=float(device.flapping_window.seconds),
        fatal_xids=frozenset(device.fatal_xids),
        health_watches=frozenset(dcgm.health_watches),
        health_failed_for=float(dcgm.health_failed_for.seconds),
        lease_age_limit=float(node.lease_age_limit.seconds),
        unreachable_for=float(node.unreachable_for.seconds),
        group_wait=float(route.responder_group_wait.seconds),
        group_interval=float(route.responder_group_interval.seconds),
    )


def alert_names(settings: Settings) -> frozenset[str]:
    """Every alert the rules rendered from `settings` define (read from the rendered rule files,
    so a renamed or added alert is never missed)."""
    names: set[str] = set()
    for path, text in render(settings).items():
        if not path.startswith("prometheus/"):
            continue
        for group in (yaml.safe_load(text) or {}).get("groups", ()):
            names.update(rule["alert"] for rule in group.get("rules", ()) if "alert" in rule)
    return frozenset(names)


def replay_settings(config: Path | None = None) -> ReplaySettings:
    """The responder's decision settings: shipped defaults, or those of a responder-config.yaml."""
    # The settings tree requires what a running responder needs to serve (a token, its identity,
    # Prometheus' URL); a replay serves nothing, so these placeholders are never used.
    settings = ResponderSettings(token="replay", identity="replay", prometheus_url="http://replay.invalid")
    if config is not None:
        settings = load(config, settings)
    return ReplaySettings(
        policy=settings.reconciler.policy, bucket=settings.reconciler.bucket, intake=settings.intake
    )
