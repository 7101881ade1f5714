"""Dashboard lint rules in Python, after the rules of Grafana's dashboard-linter.

No Grafana and no linter binary can be installed on these machines, so the rules that matter
to us are written here against the classic dashboard JSON. Each rule takes one dashboard
document and returns its problems as readable lines ([] when it passes):

- one `datasource` variable of type prometheus, first; every panel and target reads it;
- a hidden `cluster` variable right after it (kubernetes-mixin order);
- every panel has a description and a unit from the SDK's unit list;
- every rate()/irate()/increase()/resets() takes `[$__rate_interval]`;
- counters (`*_total`) only inside rate()/irate()/increase()/resets();
- every selector is filtered by job, or reads a recording rule (`a:b:c`, built on job-filtered
  selectors: tests/rules checks those);
- panel ids unique; grid positions inside the 24 columns, never overlapping.

PromQL is read with the parser of tests/support/promql_names.py, on the queries with their
variables substituted (`dashboards.queries`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dashboards.queries import panel_queries
from dashboards.sdk import GRID_COLUMNS, UNITS
from tests.support.promql_names import Aggregation, Binary, Call, Node, Selector, Unary, parse

Document = Mapping[str, Any]
RANGE_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})
"""The functions a counter may appear in: they read its increases, not its raw value."""
_RANGE_CALL = re.compile(r"\b(rate|irate|increase|resets)\s*\(")
LINT_VALUES = {"node": "lint-node", "device": "lint-device"}
"""Values for the variables a dashboard opens without (its selectors), so its queries parse."""


def panels(document: Document) -> Iterator[Mapping[str, Any]]:
    """Every panel, rows and their nested panels included."""
    for panel in document.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def _variables(document: Document) -> list[Mapping[str, Any]]:
    variables: list[Mapping[str, Any]] = document.get("templating", {}).get("list", [])
    return variables


def datasource_variable(document: Document) -> list[str]:
    variables = _variables(document)
    sources = [v for v in variables if v.get("type") == "datasource"]
    problems = []
    if len(sources) != 1:
        problems.append(f"{len(sources)} datasource variables; want exactly one")
    elif sources[0].get("name") != "datasource" or sources[0].get("query") != "prometheus":
        problems.append("the datasource variable must be `datasource`, of type prometheus")
    elif variables[0] is not sources[0]:
        problems.append("the datasource variable must come first")
    for owner in [*(p for p in panels(document) if p.get("type") != "row"), *variables[1:]]:
        refs = [owner.get("datasource")] if owner.get("type") != "textbox" else []
        refs += [t.get("datasource") for t in owner.get("targets") or []]
        for ref in refs:
            if ref != {"type": "prometheus", "uid": "${datasource}"}:
                problems.append(
                    f"{owner.get('title') or owner.get('name')!r} reads {ref}, not ${{datasource}}"
                )
    return problems


def cluster_variable(document: Document) -> list[str]:
    variables = _variables(document)
    if len(variables) < 2 or variables[1].get("name") != "cluster":
        return ["the `cluster` variable must come right after `datasource`"]
    if variables[1].get("hide") != 2:
        return ["the `cluster` variable must be hidden by default (hide: 2)"]
    return []


def units_and_descriptions(document: Document) -> list[str]:
    problems = []
    for panel in panels(document):
        if panel.get("type") == "row":
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in UNITS:
            problems.append(f"panel {panel.get('title')!r}: unit {unit!r} is not one of the SDK's units")
        if not str(panel.get("description", "")).strip():
            problems.append(f"panel {panel.get('title')!r}: no description")
    return problems


def rate_interval(document: Document) -> list[str]:
    problems = []
    for query in panel_queries(document, LINT_VALUES):
        for match in _RANGE_CALL.finditer(query.raw):
            inner = _balanced(query.raw, match.end() - 1)
            if not inner.rstrip().endswith("[$__rate_interval]"):
                problems.append(
                    f"panel {query.panel!r}: {match.group(1)}() over {inner!r}, not [$__rate_interval]"
                )
    return problems


def counters_under_rate(document: Document) -> list[str]:
    problems = []
    for query in panel_queries(document, LINT_VALUES):
        for selector, inside in _selectors(parse(query.expr), None):
            if selector.name and selector.name.endswith("_total") and inside not in RANGE_FUNCTIONS:
                problems.append(f"panel {query.panel!r}: counter {selector.name} outside rate()/increase()")
    return problems


def job_filter(document: Document) -> list[str]:
    problems = []
    for query in panel_queries(document, LINT_VALUES):
        for selector, _ in _selectors(parse(query.expr), None):
            if selector.name and ":" in selector.name:
                continue  # a recording rule: its own selectors are job-filtered (tests/rules)
            jobs = [m for m in selector.matchers if m.label == "job" and m.op in ("=", "=~") and m.value]
            if not jobs:
                problems.append(
                    f"panel {query.panel!r}: {selector.name or 'a selector'} is not filtered by job"
                )
    return problems


def unique_ids(document: Document) -> list[str]:
    seen: dict[int, str] = {}
    problems = []
    for panel in panels(document):
        panel_id = panel.get("id")
        if not isinstance(panel_id, int) or panel_id <= 0:
            problems.append(f"panel {panel.get('title')!r}: id {panel_id!r} is not a positive integer")
        elif panel_id in seen:
            problems.append(f"panels {seen[panel_id]!r} and {panel.get('title')!r} share id {panel_id}")
        else:
            seen[panel_id] = str(panel.get("title"))
    return problems


def grid_positions(document: Document) -> list[str]:
    problems = []
    placed: list[tuple[str, int, int, int, int]] = []
    for panel in panels(document):
        title = str(panel.get("title"))
        pos = panel.get("gridPos") or {}
        x, y, w, h = (pos.get(k) for k in ("x", "y", "w", "h"))
        if not all(isinstance(v, int) for v in (x, y, w, h)):
            problems.append(f"panel {title!r}: gridPos {pos} is incomplete")
            continue
        assert isinstance(x, int) and isinstance(y, int) and isinstance(w, int) and isinstance(h, int)
        if x < 0 or y < 0 or w <= 0 or h <= 0 or x + w > GRID_COLUMNS:
            problems.append(f"panel {title!r}: gridPos {pos} is outside the {GRID_COLUMNS}-column grid")
        for other, ox, oy, ow, oh in placed:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                problems.append(f"panels {other!r} and {title!r} overlap")
        placed.append((title, x, y, w, h))
    return problems


RULES: dict[str, Callable[[Document], list[str]]] = {
    "datasource-variable": datasource_variable,
    "cluster-variable": cluster_variable,
    "units-and-descriptions": units_and_descriptions,
    "rate-interval": rate_interval,
    "counters-under-rate": counters_under_rate,
    "job-filter": job_filter,
    "unique-ids": unique_ids,
    "grid-positions": grid_positions,
}


def _balanced(text: str, open_at: int) -> str:
    """The text between the parenthesis at `open_at` and its match."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return text[open_at + 1 :]


def _selectors(node: Node, inside: str | None) -> Iterator[tuple[Selector, str | None]]:
    """Each selector with the function directly around it (None at the top or under operators)."""
    if isinstance(node, Selector):
        yield node, inside
    elif isinstance(node, Call):
        for arg in node.args:
            yield from _selectors(arg, node.func)
    elif isinstance(node, Aggregation):
        for arg in node.args:
            yield from _selectors(arg, None)
    elif isinstance(node, Binary):
        yield from _selectors(node.lhs, None)
        yield from _selectors(node.rhs, None)
    elif isinstance(node, Unary):
        yield from _selectors(node.expr, None)
