"""The one module that imports grafana-foundation-sdk (pinned ==0.0.21 in pyproject.toml).

The SDK's 0.0.x builder API still moves between releases (a README's `.min_val` is `.min` in
0.0.21), so the dashboards are described in our own small frozen dataclasses (`Dashboard`,
`Row`, `Panel`, `Query`, the variables) and only `build` turns them into the SDK's builders.
An SDK upgrade touches this file alone. What comes out is the classic dashboard JSON (schema
version 42 in 0.0.21) that Grafana's file provisioning and the sidecar read; the v2 format
would be refused by file provisioning.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

# 0.0.21 warns, as its classic-dashboard modules load, that the v2 model is preferred; v2 is
# what file provisioning refuses, so the classic model is the one we want.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import (
        bargauge,
        heatmap,
        prometheus,
        stat,
        statetimeline,
        table,
        timeseries,
    )
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common, units
    from grafana_foundation_sdk.models import dashboard as models
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

PanelKind = Literal["timeseries", "stat", "heatmap", "state-timeline", "table", "bargauge"]

GRID_COLUMNS = 24
"""Grafana's grid is 24 columns wide."""

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
"""Every panel and query variable reads the Prometheus data source the `datasource` variable picks."""

UNITS: frozenset[str] = frozenset(
    value for name, value in vars(units).items() if not name.startswith("_") and isinstance(value, str)
)
"""Every unit id the SDK knows (its `models.units` constants): what a panel's `unit` may be."""


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    expr: str
    legend: str = ""
    """Legend template (`{{node}} {{device}}`); empty for Grafana's default."""
    instant: bool = False
    """An instant query at the end of the range (tables, bar gauges), else a range query."""
    table: bool = False
    """Format the result as a table (one row per series) instead of time series."""


@dataclass(frozen=True)
class Panel:
    kind: PanelKind
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 12
    height: int = 8
    stacked: bool = False
    """Stack the series of a time series panel (counts that add up)."""
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]
    repeat: str = ""
    """A variable's name: Grafana repeats the row once per selected value (empty: one row)."""


@dataclass(frozen=True)
class QueryVariable:
    """A variable whose options are label values read from Prometheus."""

    name: str
    label: str
    query: str
    """`label_values(selector, label)`."""
    description: str
    hidden: bool = False
    include_all: bool = False
    all_value: str = ""
    multi: bool = False
    """Several values may be selected at once (a repeated row gets one each)."""


@dataclass(frozen=True)
class TextVariable:
    """A free-text variable with a default (a PromQL selector the operator sets)."""

    name: str
    label: str
    default: str
    description: str


Variable = QueryVariable | TextVariable


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[Variable, ...]
    """Shown after the `datasource` variable, which every dashboard gets first."""
    rows: tuple[Row, ...]
    time_from: str = "now-6h"
    refresh: str = "30s"
    links: tuple[str, ...] = field(default=("gpuhealth",))
    """Tags of the dashboards linked from the top bar (the dashboards of this product)."""


def build(dashboard: Dashboard) -> dict[str, Any]:
    """The classic dashboard JSON of `dashboard`, as a plain dict."""
    board = (
        builders.Dashboard(dashboard.title)
        .uid(dashboard.uid)
        .description(dashboard.description)
        .tags(list(dashboard.tags))
        .time(dashboard.time_from, "now")
        .refresh(dashboard.refresh)
        .timezone("utc")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .readonly()
        .with_variable(
            builders.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Data source")
            .type("prometheus")
            .description("The Prometheus that scrapes gpuhealth and evaluates its rules.")
        )
    )
    for link_tag in dashboard.links:
        board = board.link(
            builders.DashboardLink("gpuhealth")
            .type(models.DashboardLinkType.DASHBOARDS)
            .tags([link_tag])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    for variable in dashboard.variables:
        board = board.with_variable(_variable(variable))
    next_id = 1
    for row in dashboard.rows:
        header = builders.Row(row.title).id(next_id)
        board = board.with_row(header.repeat(row.repeat) if row.repeat else header)
        next_id += 1
        for panel in row.panels:
            board = board.with_panel(_panel(panel, next_id))
            next_id += 1
    model = board.build()
    # Our own layout, not the builder's: 0.0.21 advances its cursor only after placing a panel,
    # so a panel wider than what is left of the line overflows the 24 columns.
    for built, position in zip(model.panels or [], layout(dashboard.rows), strict=True):
        built.grid_pos = models.GridPos(h=position[3], w=position[2], x=position[0], y=position[1])
    document: dict[str, Any] = json.loads(encode(model))
    return document


def layout(rows: tuple[Row, ...]) -> list[tuple[int, int, int, int]]:
    """(x, y, w, h) of each row header and panel, in order: panels fill lines of 24 columns left to
    right and wrap when the next one does not fit; each row starts on a new line."""
    positions: list[tuple[int, int, int, int]] = []
    y = 0
    for row in rows:
        positions.append((0, y, GRID_COLUMNS, 1))
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > GRID_COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            positions.append((x, y, panel.width, panel.height))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return positions


def encode(model: object) -> str:
    """JSON text of an SDK model (or of a dict holding them): sorted keys, two-space indent."""
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def round_trip(document: dict[str, Any]) -> dict[str, Any]:
    """`document` decoded into the SDK's own dashboard model and encoded again."""
    with warnings.catch_warnings():
        # 0.0.21 flags the classic model as superseded by v2, which file provisioning refuses.
        warnings.simplefilter("ignore", DeprecationWarning)
        model = models.Dashboard.from_json(document)
    decoded: dict[str, Any] = json.loads(encode(model))
    return decoded


def _variable(variable: Variable) -> Any:
    if isinstance(variable, TextVariable):
        return (
            builders.TextBoxVariable(variable.name)
            .label(variable.label)
            .description(variable.description)
            .default_value(variable.default)
            .current(models.VariableOption(selected=True, text=variable.default, value=variable.default))
        )
    built = (
        builders.QueryVariable(variable.name)
        .label(variable.label)
        .description(variable.description)
        .datasource(common.DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"]))
        .query(variable.query)
        .definition(variable.query)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )
    if variable.hidden:
        built = built.hide(models.VariableHide.HIDE_VARIABLE)
    if variable.include_all:
        built = built.include_all(True).all_value(variable.all_value)
    if variable.multi:
        built = built.multi(True)
    return built


def _target(query: Query, ref: str) -> prometheus.Dataquery:
    target = (
        prometheus.Dataquery()
        .expr(query.expr)
        .ref_id(ref)
        .datasource(common.DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"]))
    )
    if query.legend:
        target = target.legend_format(query.legend)
    target = target.instant() if query.instant else target.range()
    if query.table:
        target = target.format(PromQueryFormat.TABLE)
    return target


_PANELS: dict[str, Any] = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "heatmap": heatmap.Panel,
    "state-timeline": statetimeline.Panel,
    "table": table.Panel,
    "bargauge": bargauge.Panel,
}


def _panel(panel: Panel, panel_id: int) -> Any:
    if panel.kind not in _PANELS:
        raise ValueError(f"panel {panel.title!r}: unknown kind {panel.kind!r}")
    if panel.unit not in UNITS:
        raise ValueError(f"panel {panel.title!r}: {panel.unit!r} is not a Grafana unit")
    if not 0 < panel.width <= GRID_COLUMNS:
        raise ValueError(f"panel {panel.title!r}: width {panel.width} outside 1..{GRID_COLUMNS}")
    built = (
        _PANELS[panel.kind]()
        .id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(common.DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"]))
        .unit(panel.unit)
        .span(panel.width)
        .height(panel.height)
        .targets([_target(q, chr(ord("A") + i)) for i, q in enumerate(panel.queries)])
    )
    if panel.min is not None:
        built = built.min(panel.min)
    if panel.max is not None:
        built = built.max(panel.max)
    if panel.kind == "timeseries":
        # A table legend names every series with its last and highest value.
        built = built.legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
        )
        if panel.stacked:
            built = built.stacking(
                common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
            ).fill_opacity(30)
    if panel.kind == "heatmap":
        built = built.calculate(True)
    return built


__all__ = [
    "DATASOURCE",
    "GRID_COLUMNS",
    "UNITS",
    "Dashboard",
    "Panel",
    "PanelKind",
    "Query",
    "QueryVariable",
    "Row",
    "TextVariable",
    "Variable",
    "build",
    "encode",
    "round_trip",
]
