"""Every rule queries only declared series and labels (`tests/support/promql_names.py`).

Aspects covered: each expression of rules/prometheus/*.yaml parses, and every metric it
selects is a family some service declares (exporter, responder), a recording rule of the
rules, an Alertmanager counter or a Prometheus-internal series; every label it matches,
groups by, or joins on exists where it is used (labels aggregated away do not); the
checker refuses undeclared names and labels in synthetic expressions; the parser reads
PromQL's precedence, modifiers and quoting, and refuses malformed text with `PromQLError`
only, never another exception (hypothesis).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.metrics import CATALOG as EXPORTER
from responder.metrics import CATALOG as RESPONDER
from tests.rules.support import PROMETHEUS_DIR
from tests.support.declared_series import (
    PROMETHEUS_SERIES,
    SERVICES,
    TARGET_LABELS,
    Rule,
    catalog_series,
    declared_series,
    load_rules,
)
from tests.support.promql_names import (
    Aggregation,
    Binary,
    PromQLError,
    Selector,
    check,
    output_labels,
    parse,
    usage,
)

RULES = load_rules(sorted(PROMETHEUS_DIR.glob("*.yaml")))
SERIES = declared_series(RULES)


def test_the_rule_files_are_found() -> None:
    assert {rule.file for rule in RULES} >= {"gpu-device.yaml", "gpu-fleet.yaml", "gpu-node.yaml"}
    assert any(rule.recording for rule in RULES) and any(not rule.recording for rule in RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.file}:{r.name}")
def test_every_rule_uses_only_declared_series_and_labels(rule: Rule) -> None:
    assert check(rule.expr, SERIES) == []
    assert usage(rule.expr).metric_names <= SERIES.keys()


def test_the_responder_families_the_rules_query_are_all_declared() -> None:
    used = set().union(*(usage(rule.expr).metric_names for rule in RULES))
    responder_series = {s for family in RESPONDER for s in family.sample_names}
    assert {
        "gpuhealth_responder_webhook_requests_total",
        "gpuhealth_breaker_tripped",
        "gpuhealth_device_quarantined",
        "gpuhealth_quarantine_created_timestamp_seconds",
        "gpuhealth_migrations_total",
        "gpuhealth_responder_leader",
        "gpuhealth_responder_reconcile_passes_total",
        "gpuhealth_responder_rate_limited_quarantines",
    } <= used & responder_series


def test_no_recording_rule_shadows_a_declared_series() -> None:
    base = {**catalog_series(SERVICES), **PROMETHEUS_SERIES}
    assert not {rule.name for rule in RULES if rule.recording} & base.keys()


def test_recording_rules_carry_the_labels_their_expressions_keep() -> None:
    # Every record keeps the cluster label (rules/config.yaml, selectors.cluster_label).
    assert SERIES["node_device:gpu_device_reported_unhealthy:bool"] == {"cluster", "node", "device"}
    assert SERIES["node_device:gpu_device_info:topk1"] == {
        "cluster", "node", "device", "driver", "pool", "device_name"
    }  # fmt: skip
    assert SERIES["node:gpu_devices:count"] == {"cluster", "node"}
    assert SERIES["state:gpu_devices_effective:count"] == {"cluster", "state"}  # and the rule's static label
    assert SERIES["node_device:gpu_device_unknown_since:timestamp"] == {
        "cluster",
        "node",
        "device",
    }  # reads itself


# ----- the checker refuses what is not declared -----------------------------------------


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ('gpu_device_healthy{job="gpuhealth-exporter"}', "gpu_device_healthy: not a declared series"),
        ("gpuhealth_migrations", "gpuhealth_migrations: not a declared"),  # a counter without _total
        ('gpu_device_health{stauts="Unhealthy"}', "label(s) stauts not on"),
        ("max by (node, gpu) (gpu_device_health)", "label(s) gpu not on"),
        ("sum without (pod) (gpu_device_health)", "label(s) pod not on"),
        ('gpu_device_health{status="Unhealthy"} * on (node, uuid) gpu_device_info', "uuid not on"),
        ("gpu_device_health * on (node, device) group_left (pod) gpu_device_info", "pod not on"),
        ("gpu_device_health * on (node, device) group_right (uuid) gpu_device_info", "uuid not on"),
        # Labels aggregated away are gone: status does not survive `max by (node, device)`.
        ("sum by (status) (max by (node, device) (gpu_device_health))", "status not on"),
        ('node:gpu_devices:count{device="GPU-1"}', "label(s) device not on {cluster, node}"),
        ('label_replace(gpu_device_health, "gpu", "$1", "uid", "(.*)")', "uid not on"),
        ('absent(up{job="x"}) * on (instance) up', "instance not on"),
        ("gpu_device_health_bucket", "not a declared series"),
    ],
)
def test_undeclared_names_and_labels_are_problems(expr: str, problem: str) -> None:
    problems = check(expr, SERIES)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "expr",
    [
        'ALERTS{alertname="GPUDeviceUnhealthy", device="x", anything="y"}',
        '{__name__="gpu_device_health", status="Unknown"}',
        '{"gpu_device_health", status="Unknown"}',
        'sum by (gpu) (label_replace(gpu_device_health, "gpu", "$1", "device", "(.*)"))',
        'count by (state) (count_values("state", gpu_device_status_version))',
        "histogram_quantile(0.9, sum by (le) (rate(gpuhealth_exporter_directory_write_seconds_bucket[5m])))",
        "topk by (node) (1, gpu_device_info) * on (node, device) group_left (uuid) gpu_device_info",
        "max_over_time(gpu_device_status_age_seconds[30m:1m] offset 5m) > bool 60",
        'sum by (job, instance, node) (scrape_samples_scraped{job="gpuhealth-exporter"})',
        "-gpu_nvml_temperature_celsius ^ 2 ^ 0.5 + time()",
        'gpuhealth_breaker_tripped{node="n"} == 1',  # node is a target label
    ],
)
def test_declared_names_and_labels_pass(expr: str) -> None:
    assert check(expr, SERIES) == []


def test_target_labels_are_on_every_service_series() -> None:
    series = catalog_series(EXPORTER)
    assert all(labels >= TARGET_LABELS for labels in series.values())
    assert series["gpuhealth_exporter_directory_write_seconds_bucket"] >= {"le"}
    assert "le" not in series["gpuhealth_exporter_directory_write_seconds_sum"]


# ----- the parser -----------------------------------------------------------------------


def test_operators_bind_by_prometheus_precedence() -> None:
    tree = parse("a or b and c > 1 + 2 * d")
    assert isinstance(tree, Binary) and tree.op == "or"
    assert isinstance(tree.rhs, Binary) and tree.rhs.op == "and"
    assert isinstance(tree.rhs.rhs, Binary) and tree.rhs.rhs.op == ">"


def test_modifiers_and_grouping_are_read_on_either_side() -> None:
    tree = parse("a > bool on (x, y) group_left (z) b")
    assert isinstance(tree, Binary)
    assert (tree.on, tree.ignoring, tree.group, tree.include) == (("x", "y"), False, "group_left", ("z",))
    for text in ("sum by (x) (a)", "sum(a) by (x)"):
        agg = parse(text)
        assert isinstance(agg, Aggregation) and agg.grouping == ("x",) and not agg.without
    sel = parse('a:b:c{x=~\'1|2\', y!="q\\"", `z`!~`.*`}[5m] @ 1700000000 offset -1h30m')
    assert isinstance(sel, Selector) and sel.name == "a:b:c"
    assert [m.label for m in sel.matchers] == ["x", "y", "z"]  # a label name may be quoted


def test_usage_lists_names_and_labels() -> None:
    found = usage('sum by (node) (rate(x_total{job="j"}[5m])) / on (node) group_left (pool) y')
    assert found.metric_names == {"x_total", "y"}
    assert found.label_names == {"node", "job", "pool"}


def test_output_labels_of_an_aggregation_are_its_grouping() -> None:
    assert output_labels("max by (node) (gpu_device_health)", SERIES) == {"node"}
    assert output_labels("sum(gpu_device_health) or vector(0)", SERIES) == frozenset()


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "sum(",
        "a{b=}",
        "a{b~'x'}",
        "a[5m",
        "rate(a[5q])",
        "nosuchfunction(a)",
        "a and",
        "by (x)",
        "a @ yesterday",
        "'unterminated",
        "a ! b",
        "5x",
        "{}",
        "sum by (x:y) (a)",
        "a{'m', 'n'}",
    ],
)
def test_malformed_expressions_are_refused(expr: str) -> None:
    with pytest.raises(PromQLError):
        parse(expr)


PROMQL_PIECES = st.sampled_from(
    [
        "a",
        "b_total",
        "sum",
        "rate",
        "by",
        "on",
        "group_left",
        "offset",
        "bool",
        "and",
        "or",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "@",
        "=",
        "=~",
        "!=",
        "==",
        "+",
        "-",
        "*",
        "^",
        "5m",
        "1",
        "0x1f",
        "Inf",
        '"x"',
        "'y'",
        "`z`",
        "$v",
        "#c\n",
        " ",
        "label_replace",
        "count_values",
        "topk",
        "absent",
        "__name__",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(PROMQL_PIECES, max_size=25).map(" ".join)))
def test_junk_is_refused_with_promql_error_and_nothing_else(text: str) -> None:
    try:
        check(text, SERIES)
        usage(text)
    except PromQLError:
        pass


def test_deep_nesting_is_refused_not_crashed() -> None:
    with pytest.raises(PromQLError):
        parse("(" * 5000 + "a" + ")" * 5000)
    with pytest.raises(PromQLError):
        check("up + " * 5000 + "up", SERIES)
