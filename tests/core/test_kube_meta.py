"""Object metadata helpers (gpuhealth.kube.meta).

Aspects: resourceVersion order (numeric where both are numbers, else only equal or not);
the resourceVersion of a plain-dict object, never raising on malformed ones; RFC 3339
times (Time and MicroTime) as epoch seconds, None for anything else.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.meta import is_newer, parse_rfc3339, resource_version, rv_number


def test_numeric_resource_versions_compare_as_numbers() -> None:
    assert is_newer("10", "9")
    assert not is_newer("9", "10")
    assert not is_newer("10", "10")
    assert is_newer("abc", "abd")  # opaque: only "different" can be told
    assert not is_newer("abc", "abc")


@given(st.integers(min_value=0), st.integers(min_value=0))
def test_is_newer_is_integer_order(a: int, b: int) -> None:
    assert is_newer(str(a), str(b)) == (a > b)
    assert rv_number(str(a)) == a


@pytest.mark.parametrize(
    ("obj", "rv"),
    [
        ({"metadata": {"resourceVersion": "42"}}, "42"),
        ({"metadata": {"resourceVersion": ""}}, None),
        ({"metadata": {"resourceVersion": 42}}, None),
        ({"metadata": []}, None),
        ({}, None),
        ([1], None),
        (None, None),
    ],
)
def test_resource_version_of_an_object(obj: Any, rv: str | None) -> None:
    assert resource_version(obj) == rv


def test_rfc3339_time_and_micro_time() -> None:
    assert parse_rfc3339("2026-11-30T10:00:00Z") == datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp()
    assert parse_rfc3339("2026-11-30T10:00:00.250000Z") == pytest.approx(
        datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp() + 0.25
    )
    assert parse_rfc3339("2026-11-30T12:00:00+02:00") == datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp()


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)))
def test_rfc3339_round_trips(moment: datetime) -> None:
    text = moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert parse_rfc3339(text) == pytest.approx(moment.timestamp(), abs=1e-6)


@given(st.one_of(st.text(), st.integers(), st.none(), st.lists(st.integers())))
def test_rfc3339_never_raises(value: Any) -> None:
    parsed = parse_rfc3339(value)
    assert parsed is None or isinstance(parsed, float)
