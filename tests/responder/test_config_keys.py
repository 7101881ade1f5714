"""Every key the responder's configuration file accepted before its keys were declared on the
settings' own fields (responder.config) still lands on the same attribute with the same meaning.

Aspects: the key -> attribute pairs of the earlier hand-kept table, kept here as data, and the
table's rung keys still those the ladder declares; a rung added since brings its own key
(`Rung.key`, setting its `Rung.setting`), read from the ladder; each key given a value other than
its default moves exactly that attribute to the parsed value; the file accepts no key beyond these
(a key added to a settings class without a test is caught here).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from responder.config import ConfigError, apply
from responder.ladder import KNOWN, LADDER, with_reset
from responder.migrate.plan import Mode
from responder.settings import ResponderSettings

BASE = ResponderSettings(token="t", identity="replica", prometheus_url="http://prometheus:9090")

EARLIER: tuple[tuple[str, str, Any, Any], ...] = (
    # (key path in the file, attribute path in ResponderSettings, a value in the file, parsed)
    ("policy.probe_timeout", "reconciler.policy.probe_timeout_seconds", "11m", 660.0),
    ("policy.canary_timeout", "reconciler.policy.canary_timeout_seconds", "21m", 1260.0),
    ("policy.stability", "reconciler.policy.stability_seconds", "31m", 1860.0),
    ("policy.ramp", "reconciler.policy.ramp_seconds", "61m", 3660.0),
    ("policy.requested_wait", "reconciler.policy.requested_wait_seconds", "6m", 360.0),
    ("policy.backoff", "reconciler.policy.backoff_seconds", "2h", 7200.0),
    ("policy.max_backoff", "reconciler.policy.max_backoff_seconds", "100h", 360000.0),
    ("policy.deferred_max_age", "reconciler.policy.deferred_max_age_seconds", "2h", 7200.0),
    ("policy.ramp_pods", "ramp_pods", 3, 3),
    ("breaker.window", "reconciler.policy.breaker.window_seconds", "11m", 660.0),
    ("breaker.rate_fraction", "reconciler.policy.breaker.rate_fraction", 0.09, 0.09),
    ("breaker.rate_floor", "reconciler.policy.breaker.rate_floor", 6, 6),
    ("breaker.capacity_fraction", "reconciler.policy.breaker.capacity_fraction", 0.2, 0.2),
    ("breaker.capacity_floor", "reconciler.policy.breaker.capacity_floor", 5, 5),
    ("new_quarantines.burst", "reconciler.bucket.burst", 21, 21),
    ("new_quarantines.per_hour", "reconciler.bucket.per_hour", 121, 121.0),
    ("escalation.enabled", "reconciler.escalation.enabled", False, False),
    ("escalation.cards", "reconciler.escalation.cards", 4, 4),
    ("escalation.window", "reconciler.escalation.window_seconds", "5m", 300.0),
    ("escalation.lost_cards", "reconciler.escalation.lost_cards", 3, 3),
    ("migration.checkpoint_timeout", "migrator.migration.checkpoint_timeout_seconds", "11m", 660.0),
    ("migration.lease_margin", "migrator.migration.lease_margin_seconds", "2m", 120.0),
    ("migration.lease_cap", "migrator.migration.lease_cap_seconds", "2h", 7200.0),
    ("migration.replacement_timeout", "migrator.migration.replacement_timeout_seconds", "16m", 960.0),
    ("migration.default_mode", "migrator.default_mode", "immediate", Mode.IMMEDIATE),
    ("migration.namespace_modes", "migrator.modes", {"a": "immediate"}, {"a": Mode.IMMEDIATE}),
    ("migration.node_in_flight", "migrator.node_in_flight", 2, 2),
    ("migration.node_per_hour", "migrator.node_per_hour", 5, 5),
    ("migration.namespace_evictions_per_hour", "migrator.namespace_evictions_per_hour", 21, 21),
    ("checks.namespace", "checks.namespace", "ns", "ns"),
    ("checks.probe_image", "checks.probe.image", "img:1", "img:1"),
    ("checks.probe_level", "checks.probe.diag.level", 3, 3),
    ("checks.probe_hostengine", "checks.probe.diag.hostengine", "dcgm.svc:5555", "dcgm.svc:5555"),
    ("checks.probe_wait", "checks.probe.diag.wait_seconds", "2m", 120.0),
    ("checks.judge_image", "checks.probe.diag.judge_image", "judge:1", "judge:1"),
    ("checks.canary_image", "checks.canary.image", "canary:1", "canary:1"),
    ("checks.canary_command", "checks.canary.command", ["run", "it"], ("run", "it")),
    ("checks.runtime_class", "checks.runtime_class", "", ""),
    ("checks.device_plugin_route", "checks.device_plugin_route", "visible-devices", "visible-devices"),
    ("hold.enabled", "hold.enabled", False, False),
    ("hold.image", "hold.image", "pause:2", "pause:2"),
    ("hold.priority_class", "hold.priority_class", "", ""),
    ("hold.fill_timeout", "hold.fill_timeout_seconds", "2m", 120.0),
    ("hold.refill", "hold.refill_seconds", "2m", 120.0),
    ("hold.ramp_fill", "hold.ramp_fill_seconds", "3m", 180.0),
    ("intake.expiry", "intake.expiry_seconds", "2d", 172800.0),
    ("intake.cluster", "intake.cluster", "eu-west-1", "eu-west-1"),
    ("intake.cluster_label", "intake.cluster_label", "k8s_cluster", "k8s_cluster"),
    ("reset.enabled", "reconciler.policy.ladder", True, with_reset(LADDER)),
    ("reset.timeout", "reconciler.policy.reset_timeout_seconds", "16m", 960.0),
    ("reset.group", "reset.group", "example.com", "example.com"),
    ("reset.version", "reset.version", "v2", "v2"),
    ("reset.kind", "reset.kind", "Reset", "Reset"),
    ("reset.plural", "reset.plural", "resets", "resets"),
    ("reset.namespace", "reset.namespace", "ops", "ops"),
    ("reset.node_field", "reset.node_field", "spec.node", "spec.node"),
    ("reset.uuids_field", "reset.uuids_field", "spec.uuids", "spec.uuids"),
    ("reset.complete_condition", "reset.complete_condition", "Done", "Done"),
    ("reset.succeeded_reason", "reset.succeeded_reason", "Ok", "Ok"),
)
"""The earlier table: these keys keep their attributes and meanings, whatever is added."""

POLICY = "reconciler.policy"
"""Where a rung's length setting lives in ResponderSettings (`PolicySettings` extends `LadderSettings`)."""


def _rung_rows() -> tuple[tuple[str, str, Any, Any], ...]:
    """A row for each rung (of any ladder a responder may walk) whose key the earlier table does
    not have: its key sets its setting, here to a minute more than its declared default."""
    earlier = {key for key, *_ in EARLIER}
    return tuple(
        (r.key, f"{POLICY}.{r.setting}", f"{int(r.seconds) + 60}s", float(int(r.seconds) + 60))
        for r in KNOWN.rungs
        if r.key and r.key not in earlier
    )


KEYS = EARLIER + _rung_rows()


def _at(settings: object, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), settings)


@pytest.mark.parametrize(("key", "attribute", "value", "parsed"), KEYS, ids=[k[0] for k in KEYS])
def test_each_key_sets_its_attribute_and_nothing_else(
    key: str, attribute: str, value: Any, parsed: Any
) -> None:
    section, name = key.split(".")
    assert _at(BASE, attribute) != parsed, "the sample must differ from the default"
    loaded = apply({section: {name: value}}, BASE, "f.yaml")
    assert _at(loaded, attribute) == parsed
    for _key, other, _value, _parsed in KEYS:
        nested = attribute.startswith(other + ".") or other.startswith(attribute + ".")
        if other != attribute and not nested:
            assert _at(loaded, other) == _at(BASE, other), other


def test_the_earlier_tables_rung_keys_are_those_the_ladder_declares() -> None:
    """A shipped rung's key in the earlier table sets that rung's setting: the ladder's
    declaration and the pinned table agree (a rung renamed or its key moved is caught here)."""
    rows = {key: attribute for key, attribute, *_ in EARLIER}
    for rung in KNOWN.rungs:
        if rung.key in rows:
            assert rows[rung.key] == f"{POLICY}.{rung.setting}", rung.phase
    rung_keys = {"policy.probe_timeout", "policy.canary_timeout", "policy.stability", "policy.ramp"}
    assert {r.key for r in KNOWN.rungs} >= {*rung_keys, "reset.timeout"}


def test_no_key_beyond_the_earlier_table_is_accepted() -> None:
    """Each section refuses a key it did not know, listing the keys it knows: exactly these (the
    earlier table's and the keys of rungs added since)."""
    sections: dict[str, list[str]] = {}
    for key, *_ in KEYS:
        section, name = key.split(".")
        sections.setdefault(section, []).append(name)
    for section, names in sections.items():
        with pytest.raises(ConfigError, match="unknown key") as raised:
            apply({section: {"no_such_key": 1}}, BASE, "f.yaml")
        known = str(raised.value).split("(known: ")[1].rstrip(")").split(", ")
        assert sorted(known) == sorted(names), section
    with pytest.raises(ConfigError) as raised:
        apply({"no_such_section": {}}, BASE, "f.yaml")
    assert sorted(str(raised.value).split("(known: ")[1].rstrip(")").split(", ")) == sorted(sections)
