"""The subset of CEL that DRA device selectors use here: attribute equality joined by `&&`.

`compile_selector(expression)` turns an expression into a `Selector` (a conjunction of
comparisons) or raises `CelUnsupported` naming what it could not read; `Selector.matches`
evaluates it against one device. Pure: strings in, booleans out.

Understood terms (each side may be wrapped in parentheses, the whole may be `true`):

- `device.driver == "gpu.nvidia.com"` (or `!=`);
- `device.attributes["gpu.nvidia.com"].uuid == "GPU-..."`: an attribute by its domain and
  name; a device's unqualified attributes belong to its driver's domain, as in the real API;
- literals: single- or double-quoted strings, integers, `true`/`false`.

A comparison with an attribute the device lacks is false (real CEL raises a runtime error
that fails the allocation; failing just that device keeps the simulated scheduler simple).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class CelUnsupported(ValueError):
    """An expression outside the supported subset; the message names it."""

    def __init__(self, expression: str, why: str) -> None:
        super().__init__(f"CEL expression {expression!r} is not supported by the simulated scheduler: {why}")
        self.expression = expression


@dataclass(frozen=True, slots=True)
class Device:
    """What a selector can see of a device: its driver and its attributes, fully qualified."""

    driver: str
    attributes: dict[str, Any]
    """`<domain>/<name>` -> the attribute's value (string, int, bool or version string)."""


_Literal = str | int | bool

_ATTRIBUTE = re.compile(
    r"""^device\.attributes\[\s*(?:"([^"]*)"|'([^']*)')\s*\]\.([A-Za-z_][A-Za-z0-9_]*)$"""
)
_INT = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True, slots=True)
class _Term:
    path: str
    """`driver`, or the qualified attribute name."""
    negate: bool
    value: _Literal

    def matches(self, device: Device) -> bool:
        actual = device.driver if self.path == "driver" else device.attributes.get(self.path)
        if actual is None:
            return False
        # CEL never equates values of different types (1 != "1", true != 1).
        equal = type(actual) is type(self.value) and actual == self.value
        return equal != self.negate


@dataclass(frozen=True, slots=True)
class Selector:
    expression: str
    terms: tuple[_Term, ...]

    def matches(self, device: Device) -> bool:
        return all(term.matches(device) for term in self.terms)


def _strip_parens(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    quote: str | None = None
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and quote is None


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside quotes and parentheses."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _literal(expression: str, text: str) -> _Literal:
    text = _strip_parens(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        body = text[1:-1]
        if text[0] in body or "\\" in body:
            raise CelUnsupported(expression, f"string literal {text} with escapes")
        return body
    if text in ("true", "false"):
        return text == "true"
    if _INT.match(text):
        return int(text)
    raise CelUnsupported(expression, f"{text!r} is not a string, integer or boolean literal")


def _path(text: str) -> str | None:
    text = _strip_parens(text)
    if text == "device.driver":
        return "driver"
    match = _ATTRIBUTE.match(text)
    if match:
        domain = match.group(1) if match.group(1) is not None else match.group(2)
        return f"{domain}/{match.group(3)}"
    return None


def _term(expression: str, text: str) -> _Term | None:
    text = _strip_parens(text)
    if text == "true":
        return None
    for op in ("==", "!="):
        sides = _split_top(text, op)
        if len(sides) != 2:
            continue
        left, right = sides
        path = _path(left)
        literal_side = right
        if path is None:
            path = _path(right)
            literal_side = left
        if path is None:
            raise CelUnsupported(
                expression, f"{text.strip()!r} compares neither device.driver nor device.attributes[...]"
            )
        return _Term(path, op == "!=", _literal(expression, literal_side))
    raise CelUnsupported(expression, f"{text.strip()!r} is not an == or != comparison")


_cache: dict[str, Selector] = {}


def compile_selector(expression: str) -> Selector:
    """The expression as a conjunction of comparisons; `CelUnsupported` outside the subset."""
    cached = _cache.get(expression)
    if cached is not None:
        return cached
    if not isinstance(expression, str) or not expression.strip():
        raise CelUnsupported(str(expression), "empty expression")
    if len(_split_top(expression, "||")) > 1:
        raise CelUnsupported(expression, "|| is not supported")
    terms = []
    for part in _split_top(_strip_parens(expression), "&&"):
        term = _term(expression, part)
        if term is not None:
            terms.append(term)
    selector = Selector(expression, tuple(terms))
    _cache[expression] = selector
    return selector


def device_view(driver: str, device: dict[str, Any]) -> Device:
    """A ResourceSlice device as selectors see it: unqualified attributes in the driver's domain."""
    attributes: dict[str, Any] = {}
    for name, value in (device.get("attributes") or {}).items():
        qualified = name if "/" in name else f"{driver}/{name}"
        if not isinstance(value, dict):
            continue
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                attributes[qualified] = value[kind]
                break
    return Device(driver, attributes)
