"""The detection pipeline's floor per alert: the fastest each alert can reach the responder.

floor = scrape interval + evaluation interval + the alert's own `for:` + the responder route's
group_wait (GPUDeviceUnknownExpired has no `for:`: its wait is a first Unknown episode's whole
tolerance window, `device.unknown_tolerance`). The `for:` values are read from the rendered
rules, so the floors follow whatever the shipped templates say. Pure (rendering is string
work), but kept out of `demo.summary`, whose purity contract forbids what `rules.render`
imports.
"""

from __future__ import annotations

import yaml

from gpuhealth.durations import parse_duration
from rules.render import Settings as RuleSettings
from rules.render import render


def alert_floors(
    rules: RuleSettings, speed: float, *, scrape_seconds: float = 1.0, evaluation_seconds: float = 1.0
) -> dict[str, float]:
    """The pipeline's floor per alert, in scenario seconds, for rules already scaled to `speed`.

    floor = scrape interval + evaluation interval + the alert's own `for:` (read from the
    rendered rules, so it is whatever the shipped templates say) + the responder route's
    group_wait; the demo's Prometheus scrapes and evaluates every wall second.
    """
    base = scrape_seconds + evaluation_seconds + rules.alertmanager.responder_group_wait.seconds
    floors = {}
    for path, text in render(rules).items():
        if not path.startswith("prometheus/"):
            continue
        for group in (yaml.safe_load(text) or {}).get("groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    wait = parse_duration(rule["for"]) if rule.get("for") else 0.0
                    # Its wait is in the expression (a recorded duration against the episode's
                    # window, which backs off for repeats): a first episode's is the longest.
                    if rule["alert"] == "GPUDeviceUnknownExpired":
                        wait = float(rules.device.unknown_tolerance.seconds)
                    floors[str(rule["alert"])] = (base + wait) * speed
    return floors
