"""Every panel query is PromQL that Prometheus accepts, over series that exist.

Aspects covered: all panel queries, variables substituted, parse with `promtool check rules`
(one call for all of them, each as a recording rule's expression); every series they select
is declared (the exporter's and responder's catalogs, the recording rules of
rules/prometheus, Prometheus' and Alertmanager's own series) and every label they match or
group by exists there, `cluster` included (a scrape or external label); every recording rule
they read is one rules/prometheus records; a query whose result carries `device` has a
legend that names the node.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dashboards.queries import PanelQuery, panel_queries
from tests.dashboards.support import committed
from tests.rules.support import PROMETHEUS_DIR, run_tool
from tests.support.declared_series import declared_series, load_rules
from tests.support.promql_names import ANY, check, output_labels, usage

RULES = load_rules(sorted(PROMETHEUS_DIR.glob("*.yaml")))
SERIES = {name: labels | {"cluster"} for name, labels in declared_series(RULES).items()}
"""Declared series; `cluster` is the label a multi-cluster Prometheus adds to every series."""
VALUES = {"node": "gpu-node-0", "device": "GPU-0"}
QUERIES: list[PanelQuery] = [q for doc in committed().values() for q in panel_queries(doc, VALUES)]


def test_there_are_queries_on_every_dashboard() -> None:
    assert {q.dashboard for q in QUERIES} == {doc["uid"] for doc in committed().values()}
    assert len(QUERIES) > 40


def test_every_query_parses_with_promtool(promtool: str, tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:query:{i}", "expr": q.expr} for i, q in enumerate(QUERIES)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run_tool([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, f"promtool refused a panel query:\n{result.stdout}\n{result.stderr}"
    assert f"SUCCESS: {len(QUERIES)} rules found" in result.stdout


def test_every_query_reads_declared_series_and_labels() -> None:
    problems = [f"{q.dashboard} / {q.panel}: {p}" for q in QUERIES for p in check(q.expr, SERIES)]
    assert problems == []


def test_every_recording_rule_read_is_recorded_by_the_rules() -> None:
    recorded = {rule.name for rule in RULES if rule.recording}
    read = {name for q in QUERIES for name in usage(q.expr).metric_names if ":" in name}
    assert read, "the dashboards read no recording rule"
    assert read <= recorded, f"not recorded by rules/prometheus: {sorted(read - recorded)}"


def test_per_device_series_have_the_node_in_their_legend() -> None:
    missing = [
        f"{q.dashboard} / {q.panel} ({q.ref}): legend {q.legend!r}"
        for q in QUERIES
        if {"device", ANY} & output_labels(q.expr, SERIES) and "{{node}}" not in q.legend
    ]
    assert missing == []
