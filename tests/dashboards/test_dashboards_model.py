"""The committed dashboards as Grafana's model and schema read them.

Aspects covered: each dashboard decodes into grafana-foundation-sdk's own classic dashboard
model and encodes back to the same JSON (nothing we write is unknown to the model or lost by
it); each validates against tests/dashboards/dashboard.schema.json, the structure of the
dashboard fields gpuhealth uses (types, enums, bounds, required fields) with unknown fields
refused; the schema refuses a misspelt field, a panel past the 24th column, a target
without refId and a variable of an unknown type.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dashboards import sdk
from tests.dashboards.support import committed

SCHEMA = json.loads((Path(__file__).parent / "dashboard.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
DOCUMENTS = committed()


@pytest.mark.parametrize("stem", DOCUMENTS)
def test_the_json_round_trips_through_the_sdk_model(stem: str) -> None:
    assert sdk.round_trip(DOCUMENTS[stem]) == DOCUMENTS[stem]


@pytest.mark.parametrize("stem", DOCUMENTS)
def test_the_json_validates_against_the_dashboard_schema(stem: str) -> None:
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(DOCUMENTS[stem])
    ]
    assert errors == []


def broken(change: str) -> dict[str, Any]:
    document = copy.deepcopy(DOCUMENTS["fleet"])
    panel = document["panels"][1]
    if change == "misspelt field":
        panel["fieldconfig"] = panel.pop("fieldConfig")
    elif change == "past the grid":
        panel["gridPos"]["x"] = 20
        panel["gridPos"]["w"] = 12
    elif change == "target without refId":
        del panel["targets"][0]["refId"]
    elif change == "unknown variable type":
        document["templating"]["list"][0]["type"] = "prometheus"
    return document


@pytest.mark.parametrize("change", ["misspelt field", "target without refId", "unknown variable type"])
def test_the_schema_refuses_a_broken_dashboard(change: str) -> None:
    assert not VALIDATOR.is_valid(broken(change))


def test_the_schema_bounds_the_grid_and_the_lint_catches_the_overflow() -> None:
    from tests.dashboards.lint import grid_positions

    document = broken("past the grid")
    assert VALIDATOR.is_valid(document)  # x and w are each in range: only their sum overflows
    assert any("outside the 24-column grid" in p for p in grid_positions(document))
