"""Settings checks (gpuhealth.fields): the class, field and unit named in every refusal.

Aspects: `positive` refuses zero, negatives, NaN, infinities, booleans and non-numbers;
`within` checks both bounds, included; `whole=True` refuses fractions; fuzzed so a check
either passes or raises SettingsError, nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth import fields
from gpuhealth.fields import SettingsError


@dataclass(frozen=True)
class Knobs:
    period_seconds: object = 1.0
    count: object = 1


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, True, "5", None])
def test_positive_refuses_what_would_spin_or_is_not_a_number(bad: object) -> None:
    with pytest.raises(SettingsError, match=r"^Knobs\.period_seconds must be .*seconds, got "):
        fields.positive(Knobs(period_seconds=bad), "period_seconds", "seconds")


def test_within_checks_both_bounds_included_and_whole_numbers() -> None:
    fields.within(Knobs(count=0), "count", "items", 0, 9, whole=True)
    fields.within(Knobs(count=9), "count", "items", 0, 9, whole=True)
    with pytest.raises(SettingsError, match=r"Knobs\.count must be 0-9 items, got 10"):
        fields.within(Knobs(count=10), "count", "items", 0, 9, whole=True)
    with pytest.raises(SettingsError, match=r"Knobs\.count must be at least 1 items, got 0"):
        fields.within(Knobs(count=0), "count", "items", 1, whole=True)
    with pytest.raises(SettingsError, match=r"Knobs\.count must be a whole number of items, got 2.5"):
        fields.within(Knobs(count=2.5), "count", "items", 0, whole=True)


@given(st.one_of(st.floats(), st.integers(), st.booleans(), st.text(max_size=3), st.none()))
def test_a_check_passes_or_raises_settings_error(value: object) -> None:
    try:
        fields.positive(Knobs(period_seconds=value), "period_seconds", "seconds")
    except SettingsError:
        return
    assert isinstance(value, int | float) and math.isfinite(value) and value > 0
