"""A settings field's key in a configuration file, declared on the field itself.

A settings dataclass says which file key sets a field, and how the key's value is read, in the
field's metadata (`key`); `declared` walks a settings tree and gives every key with the
attribute path it sets, so a configuration loader keeps no table of its own. A field holding a
settings class whose module carries no keys (or one class used twice, as two checks' specs) names
its inner keys on the holding field instead (`inner`). The value readers (`duration`,
`fraction`, ...) raise `Invalid` with what is wrong; the loader puts the file and key path in
front. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gpuhealth.durations import DurationError, parse_duration

KEY = "gpuhealth.yaml_key"
"""Metadata entry: the field's `(key path, reader)`."""
INNER = "gpuhealth.yaml_inner"
"""Metadata entry: `{inner attribute path: (key path, reader)}` for a field holding settings."""

Reader = Callable[[Any], Any]
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""An object name (RFC 1123 subdomain); its 253-character limit is the API server's to enforce."""


class Invalid(ValueError):
    """A value's problem, before the file and key path are put in front of it."""


def key(path: str, read: Reader) -> dict[str, Any]:
    """Field metadata: the file key `section.name` sets this field, its value read by `read`."""
    return {KEY: (path, read)}


def inner(**keys: tuple[str, Reader]) -> dict[str, Any]:
    """Field metadata for a field holding settings: `attribute=("section.name", read)` per key,
    the attribute dotted (`diag.level`) to reach into the held settings' own settings."""
    return {INNER: {attribute.replace("__", "."): spec for attribute, spec in keys.items()}}


@dataclass(frozen=True, slots=True)
class Declared:
    """One key of the file and where its value goes."""

    section: str
    name: str
    attribute: tuple[str, ...]
    """The attribute path from the walked tree's root."""
    read: Reader


def declared(settings: object, at: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every key declared in the settings tree under `settings` (an instance: each held settings
    object is walked as the class it is), in field order."""
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        path = (*at, f.name)
        own = f.metadata.get(KEY)
        if own is not None:
            yield _declared(own, path)
        for attribute, spec in f.metadata.get(INNER, {}).items():
            yield _declared(spec, (*path, *attribute.split(".")))
        value = getattr(settings, f.name, None)
        if own is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from declared(value, path)


def _declared(spec: tuple[str, Reader], attribute: tuple[str, ...]) -> Declared:
    section, _, name = spec[0].partition(".")
    return Declared(section, name, attribute, spec[1])


def sections(settings: object, order: tuple[str, ...]) -> dict[str, dict[str, Declared]]:
    """The keys under `settings` by section, the sections in `order` (the document's shape);
    a key of a section not in `order`, or a key declared twice, is a defect of the declarations."""
    out: dict[str, dict[str, Declared]] = {s: {} for s in order}
    for d in declared(settings):
        if d.section not in out or d.name in out[d.section]:
            raise ValueError(f"key {d.section}.{d.name} of {'.'.join(d.attribute)}: unknown or repeated")
        out[d.section][d.name] = d
    return out


# ----- readers ------------------------------------------------------------------------------------


def duration(value: Any) -> float:
    """A duration with its unit (`90s`, not `90`: a bare number in a file is too easily minutes
    in the writer's head), longer than zero."""
    try:
        seconds = parse_duration(value, bare_seconds=False)
    except DurationError as exc:
        raise Invalid(str(exc)) from None
    if seconds <= 0:
        raise Invalid(f"{value!r} must be longer than zero")
    return seconds


def fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise Invalid(f"{value!r} must be a fraction above 0 and at most 1 (e.g. 0.08 for 8 %)")
    return float(value)


def whole(low: int) -> Reader:
    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise Invalid(f"{value!r} must be a whole number of at least {low}")
        return value

    return read


def rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise Invalid(f"{value!r} must be a number above 0")
    return float(value)


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"{value!r} must be a non-empty string")
    return value


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"{value!r} must be true or false")
    return value


def argv(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"{value!r} must be a non-empty list of strings (the argv)")
    return tuple(value)


def object_name(what: str) -> Reader:
    """An object's name, or empty: `what` says what it names and what empty means."""

    def read(value: Any) -> str:
        if not isinstance(value, str) or (value and not _DNS_SUBDOMAIN.fullmatch(value)):
            raise Invalid(f"{value!r} must be {what}")
        return value

    return read


def choice(values: tuple[str, ...]) -> Reader:
    """One of `values`."""

    def read(value: Any) -> str:
        if value not in values:
            raise Invalid(f"{value!r} must be one of {', '.join(values)}")
        return str(value)

    return read
