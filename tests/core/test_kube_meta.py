"""Object metadata helpers (gpuhealth.kube.meta).

Aspects: resourceVersion order (numeric where both are numbers, else only equal or not);
the resourceVersion of a plain-dict object, never raising on malformed ones; RFC 3339
times (Time and MicroTime) as epoch seconds, None for anything else; the one strict parser
(`strict_rfc3339`): what the formatters write reads back, `T`/`t`, `Z`/`z` and `+hh:mm` offsets
name the same instant, any fraction of a second; a time without an offset is `NoTimeZone`,
anything else that is not an RFC 3339 date-time a ValueError naming it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.meta import (
    NoTimeZone,
    is_newer,
    parse_rfc3339,
    resource_version,
    rfc3339,
    rfc3339_seconds,
    rv_number,
    strict_rfc3339,
)


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


MOMENTS = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))


@given(MOMENTS)
def test_what_the_formatters_write_the_strict_parser_reads_back(moment: datetime) -> None:
    seconds = moment.timestamp()
    assert strict_rfc3339(rfc3339(seconds)).timestamp() == pytest.approx(seconds, abs=1e-6)
    assert strict_rfc3339(rfc3339_seconds(seconds)).timestamp() == int(seconds // 1)
    assert rfc3339_seconds(seconds).endswith("Z") and rfc3339(seconds)[-8] == "."


@given(
    MOMENTS,
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
    st.sampled_from(["T", "t"]),
    st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
)
def test_an_instant_reads_the_same_in_any_offset_and_spelling(
    moment: datetime, offset_minutes: int, t: str, utc: str
) -> None:
    here = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    sign = "+" if offset_minutes >= 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    local = here.strftime(f"%Y-%m-%d{t}%H:%M:%S.%f") + f"{sign}{hours:02d}:{minutes:02d}"
    assert strict_rfc3339(local).timestamp() == pytest.approx(moment.timestamp(), abs=1e-6)
    in_utc = moment.strftime(f"%Y-%m-%d{t}%H:%M:%S") + utc
    assert strict_rfc3339(in_utc).timestamp() == int(moment.timestamp() // 1)


@given(st.integers(min_value=0, max_value=999_999_999), st.integers(min_value=1, max_value=9))
def test_any_fraction_of_a_second_reads_to_the_microsecond(nanos: int, digits: int) -> None:
    fraction = str(nanos).zfill(9)[:digits]
    parsed = strict_rfc3339(f"2026-11-30T10:00:00.{fraction}Z")
    assert parsed.microsecond == int(fraction.ljust(6, "0")[:6])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2026-11-30T10:00:00", NoTimeZone),
        ("2026-11-30t10:00:00.5", NoTimeZone),
        ("2026-11-30", ValueError),
        ("1777000000", ValueError),
        ("2026-11-30 10:00:00Z", ValueError),
        ("2026-11-30T10:00Z", ValueError),
        ("2026-13-30T10:00:00Z", ValueError),
        ("2026-11-30T10:00:00+25:00", ValueError),
        ("", ValueError),
        ("yesterday", ValueError),
    ],
)
def test_the_strict_parser_refuses_what_is_not_rfc3339(text: str, error: type[Exception]) -> None:
    with pytest.raises(error, match="has no time zone" if error is NoTimeZone else "is not an RFC 3339 time"):
        strict_rfc3339(text)
    assert parse_rfc3339(text) is None


@given(st.text())
def test_the_strict_parser_raises_only_value_errors(text: str) -> None:
    try:
        parsed = strict_rfc3339(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert parsed.tzinfo is not None
