"""The panel queries of a dashboard JSON, with its variables substituted as Grafana would.

Shared by the tests (promtool parses every query, the lint rules read them) and by
`dashboards.check`, which runs them against a live Prometheus. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "6h"}
"""Grafana's built-in range variables, at values Grafana would pick for a 6-hour dashboard
scraped every 15 s (callers running a short test pass their own)."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


class UnknownVariable(ValueError):
    """A query names a variable that the dashboard does not define and that is no built-in."""


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    """The dashboard's UID."""
    panel_id: int
    panel: str
    """The panel's title."""
    ref: str
    """The target's refId (A, B, ...)."""
    expr: str
    """The PromQL with every variable substituted."""
    raw: str
    """The PromQL as the JSON holds it."""
    legend: str
    instant: bool


def variable_defaults(document: Mapping[str, Any]) -> dict[str, str]:
    """Each variable's value as the dashboard opens: a text box's default, "" for the rest
    (`cluster` then matches series without the label; tests pass `node` and `device`)."""
    values: dict[str, str] = {}
    for variable in document.get("templating", {}).get("list", []):
        current = variable.get("current") or {}
        value = current.get("value", variable.get("query", "") if variable.get("type") == "textbox" else "")
        values[variable["name"]] = value if isinstance(value, str) else ""
    return values


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with `$name` and `${name}` replaced by `values` (built-ins included)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise UnknownVariable(f"${name} is not a variable of the dashboard")

    return _VARIABLE.sub(replace, expr)


def panel_queries(
    document: Mapping[str, Any], values: Mapping[str, str] | None = None
) -> Iterator[PanelQuery]:
    """Every target of every panel (rows' nested panels included), variables substituted.

    `values` overrides the defaults of `variable_defaults` (and may set built-ins such as
    `__rate_interval`)."""
    merged = {**variable_defaults(document), **(values or {})}
    for panel in _panels(document):
        for target in panel.get("targets") or []:
            raw = target.get("expr", "")
            yield PanelQuery(
                dashboard=document.get("uid", ""),
                panel_id=panel.get("id", 0),
                panel=panel.get("title", ""),
                ref=target.get("refId", ""),
                expr=substitute(raw, merged),
                raw=raw,
                legend=target.get("legendFormat", ""),
                instant=bool(target.get("instant")),
            )


def _panels(document: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in document.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []
