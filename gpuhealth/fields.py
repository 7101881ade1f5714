"""Checks a settings dataclass runs on its own fields in `__post_init__`.

Every settings tree (exporter, demo, HTTP server) refuses a bad value when it is built, with
a message naming the class, the field and its unit, so a wrong flag or config is a clear error
at start-up rather than a spinning loop or a traceback later. Pure: no I/O.
"""

from __future__ import annotations

import math


class SettingsError(ValueError):
    """A settings field holds a value its component cannot run with; the message names it."""


def _number(settings: object, name: str, unit: str, *, whole: bool) -> float:
    value = getattr(settings, name)
    kind = "a whole number" if whole else "a finite number"
    ok = isinstance(value, int) if whole else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        raise SettingsError(f"{_where(settings, name)} must be {kind} of {unit}, got {value!r}")
    return float(value)


def _where(settings: object, name: str) -> str:
    return f"{type(settings).__name__}.{name}"


def positive(settings: object, name: str, unit: str, *, whole: bool = False) -> None:
    """`settings.<name>` is finite and above zero (zero would spin a loop or divide by zero)."""
    if _number(settings, name, unit, whole=whole) <= 0:
        value = getattr(settings, name)
        raise SettingsError(f"{_where(settings, name)} must be above 0 {unit}, got {value!r}")


def within(
    settings: object, name: str, unit: str, low: float, high: float = math.inf, *, whole: bool = False
) -> None:
    """`settings.<name>` is finite and between `low` and `high`, both included."""
    value = _number(settings, name, unit, whole=whole)
    if not low <= value <= high:
        bounds = f"at least {low:g}" if high == math.inf else f"{low:g}-{high:g}"
        raise SettingsError(
            f"{_where(settings, name)} must be {bounds} {unit}, got {getattr(settings, name)!r}"
        )


def one_of(settings: object, name: str, choices: tuple[str, ...]) -> None:
    """`settings.<name>` is one of `choices`."""
    value = getattr(settings, name)
    if value not in choices:
        raise SettingsError(f"{_where(settings, name)} must be one of {', '.join(choices)}, got {value!r}")
