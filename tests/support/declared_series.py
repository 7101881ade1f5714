"""The series gpuhealth's queries may use, and the label names each one carries.

Built from what is declared, never from what queries happen to use: the services' catalogs
(`exporter.metrics`, `responder.metrics`) plus the labels every scrape adds, Prometheus'
own series, the Alertmanager counters the self-monitoring rules read, the workloads' counters
that rules/config.yaml names (the business SLO), dcgm-exporter's and kube-state-metrics' series,
and the recording rules of rules/prometheus (their labels inferred from their expressions).
Shared by the rules test and, next, the dashboards test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from exporter.metrics import CATALOG as EXPORTER
from gpuhealth.metrics import Catalog, MetricFamily
from responder.metrics import CATALOG as RESPONDER
from rules.render import DEFAULT_CONFIG, load_config
from simulator import dcgm_exporter
from tests.support import kube_state_metrics
from tests.support.promql_names import ANY, Labels, SeriesLabels, output_labels

SERVICES = Catalog.union(EXPORTER, RESPONDER)
"""Every family a gpuhealth service declares (a name declared by both would be refused here)."""

_CONFIG = load_config(DEFAULT_CONFIG)

TARGET_LABELS: Labels = frozenset({"job", "instance", "node", _CONFIG.selectors.cluster_label})
"""Labels on every series a rule reads: `job` and `instance`, and `node`, which the exporter job
relabels onto its targets, added by the scrape, and the cluster label (rules/config.yaml,
`selectors`), added by each cluster's Prometheus as an external label."""

ALERTMANAGER = Catalog(
    (
        MetricFamily(
            "alertmanager_notifications",
            "counter",
            "Notifications attempted, by integration (Alertmanager 0.35).",
            ("integration",),
        ),
        MetricFamily(
            "alertmanager_notifications_failed",
            "counter",
            "Notifications that failed after retries, by integration and reason (Alertmanager 0.35).",
            ("integration", "reason"),
        ),
    )
)
"""Alertmanager's own counters that GPUHealthWebhookFailing reads (not a gpuhealth service's)."""

_WORKLOADS = _CONFIG.workloads
WORKLOAD_SERIES: Mapping[str, Labels] = {
    name: frozenset({_WORKLOADS.namespace_label, _WORKLOADS.pod_label}) | TARGET_LABELS
    for name in (_WORKLOADS.requests_metric, _WORKLOADS.errors_metric)
}
"""The workloads' own counters that rules/config.yaml (`workloads`) names: the site's serving
stack's, not a gpuhealth service's (the simulator's workloads export these by default)."""

DCGM_SERIES: Mapping[str, Labels] = {
    name: labels | TARGET_LABELS for name, labels in dcgm_exporter.series_labels().items()
}
"""dcgm-exporter's series that rules/prometheus/gpu-dcgm.yaml reads: NVIDIA's exporter's, not a
gpuhealth service's, with the labels it writes (both spellings of its host label); the simulated
dcgm-exporter (`simulator.dcgm_exporter`) serves exactly these."""

KUBE_STATE_METRICS_SERIES: Mapping[str, Labels] = {
    name: labels | TARGET_LABELS for name, labels in kube_state_metrics.SERIES.items()
}
"""kube-state-metrics' pod series that rules/prometheus/gpu-workload.yaml reads: the cluster's, not
a gpuhealth service's (`tests.support.kube_state_metrics` runs it allowing exactly these)."""

PROMETHEUS_SERIES: Mapping[str, Labels] = {
    **{
        name: TARGET_LABELS
        for name in (
            "up",
            "scrape_duration_seconds",
            "scrape_samples_scraped",
            "scrape_samples_post_metric_relabeling",
            "scrape_series_added",
            "scrape_timeout_seconds",
            "scrape_sample_limit",
            "scrape_body_size_bytes",
        )
    },
    # Alert series carry `alertname`, `alertstate` and each alert's own labels: any label.
    "ALERTS": frozenset({ANY}),
    "ALERTS_FOR_STATE": frozenset({ANY}),
}
"""Series Prometheus writes itself: per target (`up`, `scrape_*`) and per alert."""


def catalog_series(*catalogs: Catalog) -> dict[str, Labels]:
    """Each series name of `catalogs` with its labels, the scrape's target labels included."""
    return {
        sample: family.sample_labels(sample) | TARGET_LABELS
        for catalog in catalogs
        for family in catalog
        for sample in family.sample_names
    }


@dataclass(frozen=True)
class Rule:
    """One rule of a Prometheus rule file."""

    file: str
    name: str
    """The recorded series, or the alert name."""
    expr: str
    labels: Mapping[str, str]
    recording: bool


def load_rules(paths: Iterable[Path]) -> list[Rule]:
    """Every rule of the rule files `paths`, in file order."""
    rules: list[Rule] = []
    for path in paths:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in document["groups"]:
            for rule in group["rules"]:
                recording = "record" in rule
                name = rule["record"] if recording else rule["alert"]
                rules.append(Rule(path.name, name, rule["expr"], rule.get("labels") or {}, recording))
    return rules


def recorded_series(rules: Iterable[Rule], base: SeriesLabels) -> dict[str, Labels]:
    """The labels of each recording rule's series: its static labels and its expression's.

    A rule may read its own series (or another rule's, in any order), so this iterates to a
    fixpoint; label sets only grow, so it ends.
    """
    records = [rule for rule in rules if rule.recording]
    recorded: dict[str, Labels] = {rule.name: frozenset(rule.labels) for rule in records}
    changed = True
    while changed:
        changed = False
        series = {**base, **recorded}
        for rule in records:
            grown = recorded[rule.name] | output_labels(rule.expr, series) | frozenset(rule.labels)
            if grown != recorded[rule.name]:
                recorded[rule.name] = grown
                changed = True
    return recorded


def declared_series(rules: Iterable[Rule] = ()) -> dict[str, Labels]:
    """Every series a query may select: services, Alertmanager, Prometheus, recording `rules`."""
    base = {
        **catalog_series(SERVICES, ALERTMANAGER),
        **WORKLOAD_SERIES,
        **DCGM_SERIES,
        **KUBE_STATE_METRICS_SERIES,
        **PROMETHEUS_SERIES,
    }
    return {**base, **recorded_series(rules, base)}
