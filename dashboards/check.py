"""Does every panel of the dashboards show data? Asked of a live Prometheus.

The strongest test of a dashboard: a query that returns nothing is a defect (a wrong name, a
label no series carries, a job filter that matches no target). `panels_without_data` runs
every panel query of the given dashboard JSON documents the way Grafana would (range queries
over the time range, instant queries at its end, variables substituted) and says which came
back empty. It also checks that every series with a `device` label gets a legend naming its
node, since GPU indexes repeat on every node. Used by tests/dashboards and, later, by the
demo's end-to-end tests.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from dashboards.queries import PanelQuery, panel_queries
from gpuhealth.testing.loopback import http_json


def panels_without_data(
    prometheus_url: str,
    documents: Iterable[Mapping[str, Any]],
    values: Mapping[str, str] | None = None,
    *,
    start: float,
    end: float | None = None,
    step: float = 1.0,
) -> list[str]:
    """One line per panel query that returns no finite sample between `start` and `end` (Unix
    seconds; `end` defaults to now), or whose per-device series' legend omits `{{node}}`.

    `values` sets the variables (`node`, `device`, `__rate_interval`...);
    the others keep the value the dashboard opens with. [] when every panel shows data.
    """
    end = time.time() if end is None else end
    problems: list[str] = []
    for document in documents:
        for query in panel_queries(document, values):
            series = _run(prometheus_url, query, start, end, step)
            where = f"{query.dashboard} / {query.panel} ({query.ref})"
            if not any(_has_finite_sample(s) for s in series):
                problems.append(f"{where}: no data for {query.expr}")
                continue
            if any("device" in s["metric"] for s in series) and "{{node}}" not in query.legend:
                problems.append(
                    f"{where}: per-device series, but the legend {query.legend!r} omits {{{{node}}}}"
                )
    return problems


def _run(base_url: str, query: PanelQuery, start: float, end: float, step: float) -> list[dict[str, Any]]:
    if query.instant:
        params = {"query": query.expr, "time": f"{end:.3f}"}
        answer = http_json(f"{base_url}/api/v1/query?{urllib.parse.urlencode(params)}")
    else:
        params = {"query": query.expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        answer = http_json(f"{base_url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
    data = answer["data"]
    result: list[dict[str, Any]] = data["result"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return result


def _has_finite_sample(series: Mapping[str, Any]) -> bool:
    samples = series.get("values") or ([series["value"]] if "value" in series else [])
    return any(math.isfinite(float(value)) for _, value in samples)
