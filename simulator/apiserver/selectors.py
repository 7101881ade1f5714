"""Label and field selectors: parse the query-string forms, render them back, and match objects.

Label selectors follow the Kubernetes grammar: comma-separated requirements `k=v`, `k==v`,
`k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist), `k>n`, `k<n`.
Field selectors support `=`, `==` and `!=` over the fields a resource declares selectable
(`\\`, `,` and `=` inside values are escaped with a backslash, as the client does).
Matching works on plain data: a labels mapping, or a mapping of field path to value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.apiserver.errors import bad_request

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")

OPERATORS = ("=", "==", "!=", "in", "notin", "exists", "!", "gt", "lt")


@dataclass(frozen=True)
class Requirement:
    """One label requirement; `values` is empty for exists/!exists, one value for =, ==, !=, gt, lt."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "=="):
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("gt", "lt"):
            if value is None:
                return False
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.op == "gt" else have < want
        return False

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        symbol = {"gt": ">", "lt": "<"}.get(self.op, self.op)
        return f"{self.key}{symbol}{self.values[0]}"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _check_key(key: str, text: str) -> str:
    if not _KEY_RE.match(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in selector {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if not _VALUE_RE.match(value):
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in selector {text!r}")
    return value


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses; ApiError 400 on unbalanced parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise bad_request(f"unable to parse requirement: nested parentheses in {text!r}")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(f"unable to parse requirement: unbalanced ')' in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise bad_request(f"unable to parse requirement: unbalanced '(' in {text!r}")
    parts.append(text[start:])
    return parts


_SET_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)$")
_EQ_RE = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<val>[^\s!=<>(),]*)$")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a labelSelector query value; ApiError 400 BadRequest when malformed."""
    if text is None or not text.strip():
        return LabelSelector()
    reqs: list[Requirement] = []
    for raw in _split_top_level(text):
        part = raw.strip()
        if not part:
            raise bad_request(f"unable to parse requirement: empty requirement in {text!r}")
        m = _SET_RE.match(part)
        if m:
            values = tuple(v.strip() for v in m.group("vals").split(","))
            if values == ("",):
                raise bad_request(
                    "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty "
                    f"in {text!r}"
                )
            key = _check_key(m.group("key"), text)
            reqs.append(Requirement(key, m.group("op"), tuple(sorted(_check_value(v, text) for v in values))))
            continue
        m = _EQ_RE.match(part)
        if m:
            op = {">": "gt", "<": "lt"}.get(m.group("op"), m.group("op"))
            key = _check_key(m.group("key"), text)
            value = m.group("val")
            if op not in ("gt", "lt"):
                value = _check_value(value, text)
            elif not re.fullmatch(r"-?\d+", value):
                raise bad_request(
                    "unable to parse requirement: for 'gt', 'lt' operators, the value must be an integer "
                    f"in {text!r}"
                )
            reqs.append(Requirement(key, op, (value,)))
            continue
        if part.startswith("!"):
            reqs.append(Requirement(_check_key(part[1:].strip(), text), "!"))
            continue
        reqs.append(Requirement(_check_key(part, text), "exists"))
    return LabelSelector(tuple(reqs))


def selector_from_label_selector_object(obj: Any) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels / matchExpressions) as a LabelSelector.

    An absent selector (None) matches nothing in policy/v1 PDBs, so callers decide what None means;
    this function is only given real selector objects. ApiError 400 on malformed ones.
    """
    if not isinstance(obj, dict):
        raise bad_request("selector must be an object")
    reqs: list[Requirement] = []
    for k, v in sorted((obj.get("matchLabels") or {}).items()):
        reqs.append(Requirement(str(k), "=", (str(v),)))
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in obj.get("matchExpressions") or []:
        if (
            not isinstance(expr, dict)
            or expr.get("operator") not in ops
            or not isinstance(expr.get("key"), str)
        ):
            raise bad_request(f"invalid matchExpressions entry {expr!r}")
        values = tuple(sorted(str(x) for x in expr.get("values") or ()))
        reqs.append(Requirement(expr["key"], ops[expr["operator"]], values))
    return LabelSelector(tuple(reqs))


# ---- field selectors ------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # "=" or "!="
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        have = fields.get(self.field, "")
        return have == self.value if self.op == "=" else have != self.value

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.field}{self.op}{escaped}"


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(r.matches(fields) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def fields(self) -> set[str]:
        return {r.field for r in self.requirements}

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _split_escaped(text: str) -> list[str]:
    """Split on unescaped commas, keeping escapes for the next step."""
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == ",":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(text: str, whole: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence in {whole!r}")
            out.append(text[i + 1])
            i += 2
            continue
        if ch in ",=":
            raise bad_request(f"invalid field selector: unescaped {ch!r} in value of {whole!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def parse_field_selector(text: str | None, allowed: Iterable[str] | None = None) -> FieldSelector:
    """Parse a fieldSelector query value; ApiError 400 when malformed or naming an unsupported field."""
    if text is None or not text.strip():
        return FieldSelector()
    allowed_set = set(allowed) if allowed is not None else None
    reqs: list[FieldRequirement] = []
    for part in _split_escaped(text):
        # Values keep their spaces (the client escapes nothing else); only empty terms are skipped.
        if not part.strip():
            continue
        for symbol in ("!=", "==", "="):
            idx = _find_unescaped(part, symbol)
            if idx >= 0:
                name = part[:idx].strip()
                value = _unescape(part[idx + len(symbol) :], text)
                op = "!=" if symbol == "!=" else "="
                break
        else:
            raise bad_request(
                f"invalid field selector: {part!r} is not of the form field=value or field!=value"
            )
        if not name:
            raise bad_request(f"invalid field selector: empty field name in {text!r}")
        if allowed_set is not None and name not in allowed_set:
            raise bad_request(f'field label not supported: "{name}"')
        reqs.append(FieldRequirement(name, op, value))
    return FieldSelector(tuple(reqs))


def _find_unescaped(text: str, symbol: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(symbol, i):
            return i
        i += 1
    return -1


def extract_fields(obj: Mapping[str, Any], paths: Iterable[str]) -> dict[str, str]:
    """The selectable field values of an object, as the strings a fieldSelector compares against."""
    out: dict[str, str] = {}
    for path in paths:
        cur: Any = obj
        for part in path.split("."):
            if not isinstance(cur, Mapping):
                cur = None
                break
            cur = cur.get(part)
        if cur is None:
            continue
        if isinstance(cur, bool):
            out[path] = "true" if cur else "false"
        elif isinstance(cur, (str, int, float)):
            out[path] = str(cur)
    return out
