"""The dashboard lint rules (tests/dashboards/lint.py) on the committed dashboards.

Aspects covered: every committed dashboard passes every rule (one prometheus `datasource`
variable first, the hidden `cluster` variable next, units from the SDK's list and a
description on every panel, `[$__rate_interval]` in every rate, counters only under rate,
every selector filtered by job or a recording rule, unique panel ids, grid positions inside
24 columns without overlaps); and each rule catches the mistake it is for in a copy of a
dashboard broken on purpose, so a passing rule is evidence.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.dashboards.lint import RULES
from tests.dashboards.support import committed

DOCUMENTS = committed()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("stem", DOCUMENTS)
def test_every_dashboard_passes_every_rule(stem: str, rule: str) -> None:
    assert RULES[rule](DOCUMENTS[stem]) == []


def first_target(document: dict[str, Any]) -> dict[str, Any]:
    target: dict[str, Any] = next(p for p in document["panels"] if p.get("targets"))["targets"][0]
    return target


def second_datasource(d: dict[str, Any]) -> None:
    d["templating"]["list"].append({**d["templating"]["list"][0], "name": "other"})


def visible_cluster(d: dict[str, Any]) -> None:
    d["templating"]["list"][1]["hide"] = 0


def no_unit(d: dict[str, Any]) -> None:
    d["panels"][1]["fieldConfig"]["defaults"]["unit"] = "seconds"


def fixed_rate_window(d: dict[str, Any]) -> None:
    first_target(d)["expr"] = 'sum(rate(gpuhealth_exporter_watch_events_total{job="gpuhealth-exporter"}[5m]))'


def raw_counter(d: dict[str, Any]) -> None:
    first_target(d)["expr"] = 'sum(gpuhealth_exporter_watch_events_total{job="gpuhealth-exporter"})'


def no_job(d: dict[str, Any]) -> None:
    first_target(d)["expr"] = 'max(gpuhealth_breaker_tripped{cluster="$cluster"})'


def duplicate_id(d: dict[str, Any]) -> None:
    d["panels"][2]["id"] = d["panels"][1]["id"]


def overlap(d: dict[str, Any]) -> None:
    d["panels"][2]["gridPos"] = dict(d["panels"][1]["gridPos"], x=6)


BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "datasource-variable": (second_datasource, "2 datasource variables"),
    "cluster-variable": (visible_cluster, "hidden by default"),
    "units-and-descriptions": (no_unit, "'seconds' is not one of the SDK's units"),
    "rate-interval": (fixed_rate_window, "not [$__rate_interval]"),
    "counters-under-rate": (raw_counter, "counter gpuhealth_exporter_watch_events_total outside rate()"),
    "job-filter": (no_job, "gpuhealth_breaker_tripped is not filtered by job"),
    "unique-ids": (duplicate_id, "share id"),
    "grid-positions": (overlap, "overlap"),
}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_catches_its_mistake(rule: str) -> None:
    assert set(BREAKAGES) == set(RULES)
    document = copy.deepcopy(DOCUMENTS["pipeline"])
    breakage, message = BREAKAGES[rule]
    breakage(document)
    problems = RULES[rule](document)
    assert any(message in p for p in problems), problems
