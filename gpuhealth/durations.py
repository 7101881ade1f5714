"""The one duration grammar: command-line flags, scenario files and the rules config read it.

A duration is a bare number of seconds (where the caller allows it) or amounts with units
in Prometheus' order, largest first, each unit at most once: `500ms`, `90s`, `2m`, `1m30s`,
`1h30m`, `1d`, `1.5s`. Prometheus itself takes only whole amounts; we take decimals too,
since scenario files speak of fractions of a second, and `whole_seconds` refuses what a
Prometheus rule could not carry. Pure: no I/O.
"""

from __future__ import annotations

import math
import re

UNIT_SECONDS: dict[str, float] = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

_AMOUNT = r"\d+(?:\.\d+)?"
_GRAMMAR = re.compile(
    "".join(f"(?:(?P<{unit}>{_AMOUNT}){unit})?" for unit in UNIT_SECONDS) + "$",
)

EXAMPLES = "e.g. 30s, 2m, 1m30s, 500ms, 1h"


class DurationError(ValueError):
    """Not a duration; the message says why and shows the grammar by example."""


def parse_duration(value: object, *, bare_seconds: bool = True) -> float:
    """Seconds in `value`: a number (when `bare_seconds`) or a string in the grammar above.

    Refuses booleans, negatives, NaN and infinities, empty strings and units out of order.
    """
    if isinstance(value, bool):
        raise DurationError(f"{value!r} is not a duration ({EXAMPLES})")
    if isinstance(value, int | float):
        if not bare_seconds:
            raise DurationError(f"write a unit, e.g. '{value}s' or '{value}m', not {value!r}")
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        match = _GRAMMAR.match(text) if text else None
        if match is None or not any(match.groups()):
            if bare_seconds and _is_number(text):
                seconds = float(text)
            else:
                raise DurationError(f"{value!r} is not a duration ({EXAMPLES})")
        else:
            seconds = sum(
                float(amount) * UNIT_SECONDS[unit] for unit, amount in match.groupdict().items() if amount
            )
    else:
        raise DurationError(f"{value!r} is not a duration ({EXAMPLES})")
    if not math.isfinite(seconds):
        raise DurationError(f"{value!r} is not a finite duration")
    if seconds < 0:
        raise DurationError(f"{value!r} is negative")
    return seconds


def whole_seconds(value: object, *, bare_seconds: bool = False) -> int:
    """`parse_duration`, refusing fractions of a second (Prometheus durations are whole)."""
    seconds = parse_duration(value, bare_seconds=bare_seconds)
    if seconds != int(seconds):
        raise DurationError(f"{value!r} is not a whole number of seconds")
    return int(seconds)


def format_duration(seconds: float) -> str:
    """`seconds` written in the grammar (Prometheus syntax for whole seconds): 90 -> `1m30s`."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot write {seconds!r} as a duration")
    if seconds == 0:
        return "0s"
    millis = round(seconds * 1000)
    parts = []
    for unit, unit_seconds in UNIT_SECONDS.items():
        size = round(unit_seconds * 1000)
        amount, millis = divmod(millis, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
