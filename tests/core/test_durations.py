"""The one duration grammar (gpuhealth.durations).

Aspects: amounts with units largest first, decimals, bare seconds where allowed; every
malformed value refused with DurationError (never another exception); formatting and
parsing round-trip.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.durations import DurationError, format_duration, parse_duration, whole_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        (" 10m ", 600),
        (3, 3.0),
        ("3", 3.0),
        (0, 0.0),
    ],
)
def test_good_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "-5s",
        -1,
        True,
        None,
        math.nan,
        math.inf,
        "5 s",
        [1],
        "30s1m",
        "1m1m",
        "soon",
        "inf",
        "nan",
        "1e400",
    ],
)
def test_bad_durations_are_refused(bad: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(bad)


def test_bare_numbers_need_a_unit_where_the_caller_says_so() -> None:
    with pytest.raises(DurationError, match="write a unit"):
        parse_duration(120, bare_seconds=False)
    with pytest.raises(DurationError):
        parse_duration("120", bare_seconds=False)
    assert parse_duration("2m", bare_seconds=False) == 120


def test_whole_seconds_refuse_fractions() -> None:
    assert whole_seconds("1m30s") == 90
    with pytest.raises(DurationError, match="whole number"):
        whole_seconds("1500ms")


@given(st.integers(min_value=0, max_value=10 * 365 * 86400 * 1000))
def test_format_and_parse_round_trip(millis: int) -> None:
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds), bare_seconds=False) == pytest.approx(seconds)


@given(st.one_of(st.text(max_size=12), st.floats(), st.integers(), st.none(), st.booleans()))
def test_junk_raises_only_duration_error(value: object) -> None:
    try:
        seconds = parse_duration(value)
    except DurationError:
        return
    assert math.isfinite(seconds) and seconds >= 0
