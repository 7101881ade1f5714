"""The rendered rules as Kubernetes objects and in-cluster files: what `deploy/generate.py` commits
under deploy/ and `gpuhealth rules render --format` writes for an operator's own overlay.

- `in_cluster`: the settings with the responder reached at its Service in the cluster and its
  bearer token read where Alertmanager mounts the `gpuhealth-responder-token` Secret;
- `prometheus_rule`: every rule group as one PrometheusRule;
- `alertmanager_config`: the routing as an AlertmanagerConfig (the token from that Secret);
- `scrape_config`: Prometheus scrape jobs for the exporter and the responder, for Prometheus
  without the operator.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import yaml

from rules.render import Settings

NAMESPACE = "gpuhealth-system"
RESPONDER_URL = f"http://gpuhealth-responder.{NAMESPACE}.svc:8080/webhook"
TOKEN_SECRET = "gpuhealth-responder-token"
TOKEN_KEY = "token"
CREDENTIALS_FILE = f"/etc/alertmanager/secrets/{TOKEN_SECRET}/{TOKEN_KEY}"
"""Where the Prometheus Operator mounts a Secret listed in `Alertmanager.spec.secrets`; a plain
Alertmanager mounts the Secret at the same path (docs/operations.md)."""

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')


class ManifestError(ValueError):
    """Rendered rules or routing that have no Kubernetes form; the message names the part."""


def in_cluster(settings: Settings) -> Settings:
    """The rules settings with the responder reached inside the cluster."""
    alertmanager = dataclasses.replace(
        settings.alertmanager, responder_url=RESPONDER_URL, responder_credentials_file=CREDENTIALS_FILE
    )
    return dataclasses.replace(settings, alertmanager=alertmanager)


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=True)


def prometheus_rule(rule_files: dict[str, str], header: str = "") -> str:
    """Every rule group of the rendered rule files as one PrometheusRule (Prometheus Operator v1)."""
    groups: list[Any] = []
    for path, text in sorted(rule_files.items()):
        doc = yaml.safe_load(text) or {}
        file_groups = doc.get("groups")
        if not isinstance(file_groups, list):
            raise ManifestError(f"rules/{path}: no `groups` list")
        groups.extend(file_groups)
    names = [g.get("name") for g in groups]
    if len(set(names)) != len(names):
        raise ManifestError(f"rule group names repeat across rules/prometheus: {names}")
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpuhealth",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "gpuhealth"},
        },
        "spec": {"groups": groups},
    }
    return header + _dump(doc)


def parse_matcher(text: str) -> dict[str, str]:
    """`name=~"value"` as an AlertmanagerConfig matcher; ManifestError for anything else."""
    found = _MATCHER.match(text)
    if found is None:
        raise ManifestError(f'Alertmanager matcher {text!r}: expected name, an operator and a "value"')
    name, operator, value = found.groups()
    return {"name": name, "value": value.replace('\\"', '"').replace("\\\\", "\\"), "matchType": operator}


_ROUTE_KEYS = {
    "receiver": "receiver",
    "group_by": "groupBy",
    "group_wait": "groupWait",
    "group_interval": "groupInterval",
    "repeat_interval": "repeatInterval",
    "continue": "continue",
}


def _route(route: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in route.items():
        if key == "matchers":
            out["matchers"] = [parse_matcher(m) for m in value]
        elif key == "routes":
            out["routes"] = [_route(r, f"{where}.routes[{i}]") for i, r in enumerate(value)]
        elif key in _ROUTE_KEYS:
            out[_ROUTE_KEYS[key]] = value
        else:
            raise ManifestError(f"alertmanager.yaml {where}: `{key}` has no AlertmanagerConfig translation")
    return out


def _webhook(config: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"url": config["url"], "sendResolved": bool(config.get("send_resolved", True))}
    http_config = config.get("http_config")
    if http_config:
        auth = http_config.get("authorization") or {}
        if set(http_config) != {"authorization"} or auth.get("credentials_file") != CREDENTIALS_FILE:
            raise ManifestError(
                f"alertmanager.yaml {where}: only the responder's bearer token file is translated"
            )
        out["httpConfig"] = {
            "authorization": {
                "type": auth.get("type", "Bearer"),
                "credentials": {"name": TOKEN_SECRET, "key": TOKEN_KEY},
            }
        }
    extra = set(config) - {"url", "send_resolved", "http_config"}
    if extra:
        raise ManifestError(
            f"alertmanager.yaml {where}: {sorted(extra)} have no AlertmanagerConfig translation"
        )
    return out


def alertmanager_config(alertmanager_yaml: str, header: str = "") -> str:
    """The rendered Alertmanager routing as an AlertmanagerConfig (Prometheus Operator v1alpha1)."""
    config = yaml.safe_load(alertmanager_yaml)
    receivers = []
    for i, receiver in enumerate(config.get("receivers") or []):
        hooks = receiver.get("webhook_configs") or []
        if set(receiver) - {"name", "webhook_configs"}:
            raise ManifestError(f"alertmanager.yaml receivers[{i}]: only webhook receivers are translated")
        receivers.append(
            {
                "name": receiver["name"],
                "webhookConfigs": [
                    _webhook(h, f"receivers[{i}].webhook_configs[{j}]") for j, h in enumerate(hooks)
                ],
            }
        )
    inhibit = [
        {
            "sourceMatch": [parse_matcher(m) for m in rule.get("source_matchers") or []],
            "targetMatch": [parse_matcher(m) for m in rule.get("target_matchers") or []],
            **({"equal": rule["equal"]} if rule.get("equal") else {}),
        }
        for rule in config.get("inhibit_rules") or []
    ]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": {
            "name": "gpuhealth",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "gpuhealth"},
        },
        "spec": {"route": _route(config["route"], "route"), "inhibitRules": inhibit, "receivers": receivers},
    }
    note = (
        "# Use it as the Alertmanager's global configuration (Alertmanager.spec.alertmanagerConfiguration:\n"
        "# {name: gpuhealth}), moved with the token Secret to the Alertmanager's namespace: as a namespaced\n"
        "# AlertmanagerConfig the operator would only route alerts labelled namespace=gpuhealth-system\n"
        "# (docs/operations.md). global.resolve_timeout has no field here; Alertmanager's default (5m)\n"
        "# is the same.\n"
    )
    return header + note + _dump(doc)


def scrape_config(settings: Settings, header: str = "") -> str:
    """Prometheus scrape jobs for the exporter and the responder, by Kubernetes service discovery."""

    def job(name: str, component: str, extra: list[dict[str, Any]], honor: bool) -> dict[str, Any]:
        keep = [
            {
                "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
                "regex": component,
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                "regex": "metrics|http",
                "action": "keep",
            },
        ]
        out: dict[str, Any] = {
            "job_name": name,
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [NAMESPACE]}}],
            "relabel_configs": keep + extra,
        }
        if honor:
            out["honor_labels"] = True
        return out

    node = [
        {
            "source_labels": [
                "__meta_kubernetes_service_label_gpuhealth_io_exporter_mode",
                "__meta_kubernetes_pod_node_name",
            ],
            "regex": "node;(.+)",
            "target_label": "node",
            "replacement": "$1",
            "action": "replace",
        },
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod", "action": "replace"},
    ]
    pod = [{"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod", "action": "replace"}]
    doc = {
        "scrape_configs": [
            job(settings.selectors.exporter_job, "exporter", node, honor=True),
            job(settings.selectors.responder_job, "responder", pod, honor=False),
        ]
    }
    note = (
        "# Merge these jobs into prometheus.yml (Prometheus needs get/list/watch on endpoints, services\n"
        "# and pods in gpuhealth-system). Node-mode exporter targets get their node name as `node`\n"
        "# (GPUNodeUnreachable names the node from it); honor_labels keeps the `node` label each device\n"
        "# series carries, which a cluster-mode exporter sets for every node it watches.\n"
    )
    return header + note + _dump(doc)
