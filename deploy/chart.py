"""The Helm chart `charts/gpuhealth`, generated from the same objects as the kustomize manifests.

`deploy/generate.py` writes it (and `--check` holds it): every template is an object of
`deploy/base` or of a component under `deploy/components`, read from the same files kustomize
reads, with Helm's substitutions at the knobs only:

- the namespace: `{{ .Release.Namespace }}` wherever the manifests say gpuhealth-system (the
  chart leaves the Namespace to the operator: `docs/operations.md`, "Install with Helm");
- `image`, `extraEnv`, each workload's `resources` and the responder's scheduling
  (`nodeSelector`, `tolerations`, `affinity`), the exporter's `tolerations`;
- the components as values: `responder.mode` (dry-run, enforcing), `exporter.privileged`,
  `exporter.mode: cluster` (cluster-exporter), `dcgmExporter.enabled`, `gpuReset.enabled`,
  `serviceMonitor`, `prometheusRule`, `alertmanagerConfig`, `noOperator` and `dashboards`;
- the responder's configuration (`responder.config`, deploy/responder-config.yaml's settings).

Everything else in a template is the manifests' text, its `{{`/`}}` (alert templates,
dashboard legends) escaped. The CRD goes to `crds/` as Helm recommends: installed before the
templates, never templated, upgraded or deleted by Helm. `tests/deploy/test_deploy_chart.py`
renders both (helm template, kubectl kustomize) and compares the objects.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rules.manifests import NAMESPACE

CHART = "charts/gpuhealth"
"""Relative to the repository root."""
VERSION = "0.1.0"
IMAGE_REPOSITORY = "ghcr.io/gpuhealth/gpuhealth"
IMAGE_TAG = "0.1.0"

_BRACES = re.compile(r"\{\{|\}\}")
_MARK = re.compile(r"^(?P<indent> *)(?P<lead>- |[^\s:][^:]*: )?'?__KNOB_(?P<n>\d+)__'?$", re.M)


class ChartError(ValueError):
    """A manifest the chart cannot be made from; the message names it."""


def escape(text: str) -> str:
    """`text` as a template that renders to itself."""
    return _BRACES.sub(lambda m: '{{ "{{" }}' if m.group() == "{{" else '{{ "}}" }}', text)


@dataclass
class Knobs:
    """Template text standing in for parts of an object: `mark()` puts a placeholder in the object,
    `render()` replaces it, once the object is YAML text, with the text its builder makes for
    that line's indent and key (`key: ` or `- `)."""

    builders: list[Callable[[str, str], str]] = field(default_factory=list)

    def mark(self, builder: Callable[[str, str], str]) -> str:
        self.builders.append(builder)
        return f"__KNOB_{len(self.builders) - 1}__"

    def render(self, text: str) -> str:
        def one(found: re.Match[str]) -> str:
            return self.builders[int(found["n"])](found["indent"], found["lead"] or "")

        out = _MARK.sub(one, text)
        if "__KNOB_" in out:
            raise ChartError(
                f"a knob placeholder was left in the text: {out[out.index('__KNOB_') - 80 :][:200]}"
            )
        return out


def _block(indent: str, lead: str, expr: str, *, optional: bool = True) -> str:
    """`key:` with the YAML of `expr` beneath it (omitted when empty, if `optional`)."""
    key = lead.rstrip()
    width = len(indent) + 2
    if optional:
        return (
            f"{indent}{{{{- with {expr} }}}}\n{indent}{key}\n"
            f"{indent}  {{{{- toYaml . | nindent {width} }}}}\n{indent}{{{{- end }}}}"
        )
    return f"{indent}{key}\n{indent}  {{{{- toYaml {expr} | nindent {width} }}}}"


def _items(indent: str, condition: str, items: list[str]) -> str:
    """List items kept only when `condition` holds."""
    body = "\n".join(f"{indent}- {item}" for item in items)
    return f"{indent}{{{{- if {condition} }}}}\n{body}\n{indent}{{{{- end }}}}"


def _items_knob(condition: str, items: list[str]) -> Callable[[str, str], str]:
    return lambda indent, lead: _items(indent, condition, items)


def _block_knob(expr: str) -> Callable[[str, str], str]:
    return lambda indent, lead: _block(indent, lead, expr)


def _alternatives(indent: str, lead: str, condition: str, then: Any, otherwise: Any) -> str:
    """`key:` with `then` beneath it when `condition` holds, else `otherwise`."""
    key = lead.rstrip()

    def dumped(value: Any) -> str:
        text = escape(yaml.safe_dump(value, sort_keys=False, width=110))
        return "\n".join(f"{indent}  {line}" for line in text.splitlines())

    return (
        f"{indent}{key}\n{indent}{{{{- if {condition} }}}}\n{dumped(then)}\n"
        f"{indent}{{{{- else }}}}\n{dumped(otherwise)}\n{indent}{{{{- end }}}}"
    )


def _wrap(condition: str, text: str) -> str:
    return f"{{{{- if {condition} }}}}\n{text.rstrip()}\n{{{{- end }}}}\n"


def _dump(doc: Any, knobs: Knobs) -> str:
    text = escape(yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=True))
    text = text.replace(NAMESPACE, "{{ .Release.Namespace }}")
    return knobs.render(text)


def load(path: Path) -> list[dict[str, Any]]:
    try:
        return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise ChartError(f"{path}: cannot read ({exc})") from exc


def _patch_ops(component: Path, kind: str) -> list[dict[str, Any]]:
    """The JSON 6902 operations a component patches `kind` with."""
    doc = yaml.safe_load((component / "kustomization.yaml").read_text(encoding="utf-8"))
    ops: list[dict[str, Any]] = []
    for patch in doc.get("patches") or []:
        if (patch.get("target") or {}).get("kind") == kind:
            ops += yaml.safe_load(patch["patch"])
    return ops


# ----- the knobs on the workloads ---------------------------------------------------------------

DEVICE_PLUGIN_NODE_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""Set to "true" on the nodes where the GPU Operator runs the device plugin (deploy/generate.py)."""

IMAGE = (
    "{{ .Values.image.repository }}{{ if .Values.image.digest }}@{{ .Values.image.digest }}"
    "{{ else }}:{{ .Values.image.tag }}{{ end }}"
)
EXPORTER_MODE = '(include "gpuhealth.exporterMode" .)'


def _container_knobs(
    container: dict[str, Any], knobs: Knobs, resources: str, extra_args: list[tuple[str, list[str]]]
) -> None:
    container["image"] = knobs.mark(lambda indent, lead: f"{indent}{lead}{IMAGE}")
    container["resources"] = knobs.mark(lambda indent, lead: _block(indent, lead, resources))
    args = container["args"]
    for i, arg in enumerate(args):
        if arg.startswith("--slice-health-driver="):
            args[i] = knobs.mark(
                lambda indent, lead: (
                    f"{indent}{{{{- with .Values.exporter.sliceHealthDriver }}}}\n"
                    f"{indent}- --slice-health-driver={{{{ . }}}}\n{indent}{{{{- end }}}}"
                )
            )
        elif arg.startswith("--prometheus-url="):
            args[i] = knobs.mark(
                lambda indent, lead: f"{indent}- --prometheus-url={{{{ .Values.responder.prometheusUrl }}}}"
            )
    for condition, items in extra_args:
        args.append(knobs.mark(_items_knob(condition, items)))
    if "env" not in container:
        container["env"] = knobs.mark(lambda indent, lead: _block(indent, lead, ".Values.extraEnv"))
        return
    container["env"].append(
        knobs.mark(
            lambda indent, lead: (
                f"{indent}{{{{- with .Values.extraEnv }}}}\n"
                f"{indent}{{{{- toYaml . | nindent {len(indent)} }}}}\n{indent}{{{{- end }}}}"
            )
        )
    )


def _pod_knobs(pod: dict[str, Any], knobs: Knobs, values: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        pod[key] = knobs.mark(_block_knob(f".Values.{values}.{key}"))


@dataclass(frozen=True)
class Sources:
    """What the templates are made of: the manifests' directories."""

    deploy: Path

    @property
    def base(self) -> Path:
        return self.deploy / "base"

    def component(self, name: str) -> Path:
        return self.deploy / "components" / name


def _exporter_daemonset(doc: dict[str, Any], knobs: Knobs, privileged: dict[str, Any]) -> None:
    pod = doc["spec"]["template"]["spec"]
    [container] = pod["containers"]
    _container_knobs(container, knobs, ".Values.exporter.resources", [])
    original = container["securityContext"]
    container["securityContext"] = knobs.mark(
        lambda indent, lead: _alternatives(indent, lead, ".Values.exporter.privileged", privileged, original)
    )
    pod["tolerations"] = knobs.mark(lambda indent, lead: _block(indent, lead, ".Values.exporter.tolerations"))
    # The GPU nodes: `exporter.nodeSelector`, plus (on the device-plugin DaemonSet) the label that
    # keeps the two DaemonSets apart, which stays whatever the value.
    fixed = {k: v for k, v in pod["nodeSelector"].items() if k == DEVICE_PLUGIN_NODE_LABEL}
    expr = ".Values.exporter.nodeSelector"
    if fixed:
        expr = f"(merge (dict {' '.join(json.dumps(x) for kv in fixed.items() for x in kv)}) {expr})"
    pod["nodeSelector"] = knobs.mark(lambda indent, lead: _block(indent, lead, expr))


def _privileged(sources: Sources) -> dict[str, Any]:
    [op] = [o for o in _patch_ops(sources.component("privileged-exporter"), "DaemonSet")]
    if op["op"] != "replace" or not op["path"].endswith("/securityContext"):
        raise ChartError("components/privileged-exporter: expected one replace of the securityContext")
    value: dict[str, Any] = op["value"]
    return value


def _added_args(sources: Sources, component: str) -> list[str]:
    ops = _patch_ops(sources.component(component), "Deployment")
    if not ops or any(o["op"] != "add" or not o["path"].endswith("/args/-") for o in ops):
        raise ChartError(f"components/{component}: expected only args added to the responder")
    return [str(o["value"]) for o in ops]


def templates(sources: Sources) -> dict[str, str]:
    """The chart's templates by file name."""
    base = yaml.safe_load((sources.base / "kustomization.yaml").read_text(encoding="utf-8"))
    resources = [r for r in base["resources"] if r not in ("namespace.yaml", "../crds")]
    privileged = _privileged(sources)
    responder_args = [
        ('eq .Values.responder.mode "dry-run"', _added_args(sources, "dry-run")),
        (".Values.gpuReset.enabled", _added_args(sources, "gpu-reset")),
    ]
    responder_only = {
        "rbac-responder.yaml",
        "responder-deployment.yaml",
        "responder-service.yaml",
        "responder-pdb.yaml",
        "holder-priorityclass.yaml",
        "holder-pdb.yaml",
        "breaker-configmap.yaml",
    }
    node_exporter = {
        "exporter-daemonset.yaml",
        "exporter-daemonset-device-plugin.yaml",
        "exporter-service.yaml",
    }
    out: dict[str, str] = {}
    for name in resources:
        knobs = Knobs()
        docs = [_labelled(d) for d in load(sources.base / name)]
        for doc in docs:
            if doc["kind"] == "DaemonSet":
                _exporter_daemonset(doc, knobs, privileged)
            elif doc["kind"] == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                [container] = pod["containers"]
                _container_knobs(container, knobs, ".Values.responder.resources", responder_args)
                for volume in pod["volumes"]:
                    if (volume.get("configMap") or {}).get("name") == "gpuhealth-responder-config":
                        volume["configMap"]["name"] = knobs.mark(
                            lambda indent, lead: (
                                f'{indent}{lead}{{{{ include "gpuhealth.responderConfig" . }}}}'
                            )
                        )
                _pod_knobs(pod, knobs, "responder", ("nodeSelector", "tolerations", "affinity"))
                doc["spec"]["replicas"] = knobs.mark(
                    lambda indent, lead: f"{indent}{lead}{{{{ .Values.responder.replicas }}}}"
                )
        text = "---\n".join(_dump(d, knobs) for d in docs)
        if name in responder_only:
            text = _wrap(".Values.responder.enabled", text)
        if name == "exporter-daemonset-device-plugin.yaml":
            text = _wrap(".Values.exporter.devicePluginNodes", text)
        if name in node_exporter:
            text = _wrap(f'eq {EXPORTER_MODE} "node"', text)
        out[name] = text
    out["responder-config.yaml"] = _wrap(".Values.responder.enabled", _responder_config(sources))
    out.update(_cluster_exporter(sources))
    out.update(_monitoring(sources))
    out.update(_gpu_reset(sources))
    out.update(_network_policies(sources))
    out.update(_dashboards(sources))
    out["_helpers.tpl"] = HELPERS
    out["NOTES.txt"] = NOTES
    return {f"templates/{k}": v for k, v in out.items()}


def _responder_config(sources: Sources) -> str:
    reset = (sources.component("gpu-reset") / "responder-config-gpu-reset.yaml").read_text(encoding="utf-8")
    return (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        '  name: {{ include "gpuhealth.responderConfig" . }}\n'
        "  namespace: {{ .Release.Namespace }}\n"
        "  labels:\n    app.kubernetes.io/part-of: gpuhealth\n"
        "data:\n"
        "  responder-config.yaml: |\n"
        "    {{- toYaml .Values.responder.config | nindent 4 }}\n"
        "  {{- if .Values.gpuReset.enabled }}\n"
        "  responder-config-gpu-reset.yaml: |\n"
        + "".join(f"    {escape(line)}\n" if line else "\n" for line in reset.splitlines())
        + "  {{- end }}\n"
    )


def _labelled(doc: dict[str, Any]) -> dict[str, Any]:
    """kustomize's `labels` of the base (app.kubernetes.io/part-of: gpuhealth, on metadata only)."""
    doc["metadata"].setdefault("labels", {})["app.kubernetes.io/part-of"] = "gpuhealth"
    return doc


SHARD_LABEL = "gpuhealth.io/exporter-shard"
"""Keeps the shard Deployments' selectors apart (deploy/generate.py, `cluster_exporter_shards`)."""
SHARDED = "ge (int .Values.exporter.shards) 2"


def _cluster_exporter(sources: Sources) -> dict[str, str]:
    """The cluster-mode exporter (the cluster-exporter component) and, with `exporter.shards` of 2
    or more, that Deployment as one per shard (the cluster-exporter-shards component)."""
    docs = [_labelled(d) for d in load(sources.component("cluster-exporter") / "exporter-deployment.yaml")]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    shard = copy.deepcopy(deployment)
    knobs = Knobs()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    _container_knobs(container, knobs, ".Values.exporter.clusterResources", [])
    texts = []
    for doc in docs:
        text = _dump(doc, knobs)
        texts.append(_wrap(f"not ({SHARDED})", text) if doc is deployment else text)
    out = {"exporter-cluster.yaml": _wrap(f'eq {EXPORTER_MODE} "cluster"', "---\n".join(texts))}

    # One Deployment per shard: a range over the count, in which `.` is the shard number.
    knobs = Knobs()
    name = shard["metadata"]["name"]
    shard["metadata"]["name"] = knobs.mark(lambda indent, lead: f"{indent}{lead}{name}-{{{{ $shard }}}}")
    label = knobs.mark(lambda indent, lead: f'{indent}{lead}"{{{{ $shard }}}}"')
    shard["metadata"]["labels"][SHARD_LABEL] = label
    shard["spec"]["selector"]["matchLabels"][SHARD_LABEL] = label
    shard["spec"]["template"]["metadata"]["labels"][SHARD_LABEL] = label
    [container] = shard["spec"]["template"]["spec"]["containers"]
    _container_knobs(container, knobs, ".Values.exporter.clusterResources", [])
    container["args"] += [
        knobs.mark(lambda indent, lead: f"{indent}- --shard={{{{ $shard }}}}"),
        knobs.mark(lambda indent, lead: f"{indent}- --total-shards={{{{ $.Values.exporter.shards }}}}"),
    ]
    # Inside the range `.` is the shard number: the values and the release are `$`'s.
    body = re.sub(r"(?<![\w$])\.(Values|Release)\.", r"$.\1.", _dump(shard, knobs))
    ranged = f"{{{{- range $shard := until (int .Values.exporter.shards) }}}}\n---\n{body}{{{{- end }}}}\n"
    out["exporter-cluster-shards.yaml"] = _wrap(f'and (eq {EXPORTER_MODE} "cluster") ({SHARDED})', ranged)
    return out


def _monitoring(sources: Sources) -> dict[str, str]:
    operator = sources.component("prometheus-operator")
    out = {}
    for name, condition in (
        ("servicemonitors.yaml", ".Values.serviceMonitor.enabled"),
        ("prometheusrule.yaml", ".Values.prometheusRule.enabled"),
        ("alertmanagerconfig.yaml", ".Values.alertmanagerConfig.enabled"),
    ):
        docs = [_labelled(d) for d in load(operator / name)]
        knobs = Knobs()
        for doc in docs:
            doc["metadata"]["labels"]["__extra__"] = "x"
            if doc["kind"] in OVERRIDES:
                value, key = OVERRIDES[doc["kind"]]
                default = doc["spec"][key] if key else doc["spec"]
                mark = knobs.mark(_overridable(value, default))
                if key:
                    doc["spec"][key] = mark
                else:
                    doc["spec"] = mark
        text = "---\n".join(_monitoring_labels(_dump(d, knobs)) for d in docs)
        out[f"monitoring-{name}"] = _wrap(condition, text)
    dcgm = [_labelled(d) for d in load(sources.component("dcgm-exporter") / "servicemonitor.yaml")]
    for doc in dcgm:
        doc["metadata"]["labels"]["__extra__"] = "x"
    out["monitoring-dcgm-exporter.yaml"] = _wrap(
        ".Values.dcgmExporter.enabled",
        _wrap(".Values.serviceMonitor.enabled", _monitoring_labels(_dump(dcgm[0], Knobs()))),
    )
    plain = sources.component("no-operator")
    kustomization = yaml.safe_load((plain / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for generator in kustomization["configMapGenerator"]:
        data = {Path(f).name: (plain / f).read_text(encoding="utf-8") for f in generator["files"]}
        docs.append(
            _labelled(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": generator["name"], "namespace": generator["namespace"]},
                    "data": data,
                }
            )
        )
    out["no-operator.yaml"] = _wrap(
        ".Values.noOperator.enabled", "---\n".join(_dump(d, Knobs()) for d in docs)
    )
    return out


OVERRIDES = {
    "PrometheusRule": (".Values.prometheusRule.groups", "groups"),
    "AlertmanagerConfig": (".Values.alertmanagerConfig.spec", ""),
}
"""The rules and the routing as values, when set (`gpuhealth rules render --format helm-values`
writes them from an operator's own settings); the shipped ones otherwise."""


def _overridable(expr: str, default: Any) -> Callable[[str, str], str]:
    def build(indent: str, lead: str) -> str:
        key = lead.rstrip()
        text = escape(yaml.safe_dump(default, sort_keys=False, width=110, allow_unicode=True))
        text = text.replace(NAMESPACE, "{{ .Release.Namespace }}")
        body = "\n".join(f"{indent}  {line}" for line in text.splitlines())
        return (
            f"{indent}{{{{- with {expr} }}}}\n{indent}{key}\n"
            f"{indent}  {{{{- toYaml . | nindent {len(indent) + 2} }}}}\n"
            f"{indent}{{{{- else }}}}\n{indent}{key}\n{body}\n{indent}{{{{- end }}}}"
        )

    return build


def _monitoring_labels(text: str) -> str:
    """The Prometheus Operator objects' labels plus `monitoringLabels` (kube-prometheus-stack
    selects them by its release label)."""
    return re.sub(
        r"^(?P<indent> +)__extra__: x$",
        lambda m: (
            f"{m['indent']}{{{{- with .Values.monitoringLabels }}}}\n"
            f"{m['indent']}{{{{- toYaml . | nindent {len(m['indent'])} }}}}\n{m['indent']}{{{{- end }}}}"
        ),
        text,
        flags=re.M,
    )


def _gpu_reset(sources: Sources) -> dict[str, str]:
    docs = [_labelled(d) for d in load(sources.component("gpu-reset") / "rbac-gpu-reset.yaml")]
    text = "---\n".join(_dump(d, Knobs()) for d in docs)
    return {
        "rbac-gpu-reset.yaml": _wrap(".Values.responder.enabled", _wrap(".Values.gpuReset.enabled", text))
    }


NAMESPACE_LABEL = "kubernetes.io/metadata.name"


def _network_policies(sources: Sources) -> dict[str, str]:
    """deploy/components/network-policies, its peers' namespace a value (`monitoring` there)."""
    component = sources.component("network-policies")
    listed = yaml.safe_load((component / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    texts = []
    for name in listed:
        for doc in load(component / name):
            knobs = Knobs()
            for rule in _labelled(doc)["spec"]["ingress"]:
                for peer in rule["from"]:
                    labels = peer["namespaceSelector"]["matchLabels"]
                    if labels.get(NAMESPACE_LABEL) == "monitoring":
                        labels[NAMESPACE_LABEL] = knobs.mark(
                            lambda indent, lead: (
                                f"{indent}{lead}{{{{ .Values.networkPolicies.monitoringNamespace }}}}"
                            )
                        )
            texts.append(_dump(doc, knobs))
    return {"network-policies.yaml": _wrap(".Values.networkPolicies.enabled", "---\n".join(texts))}


def _dashboards(sources: Sources) -> dict[str, str]:
    component = sources.component("dashboards")
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = []
    for generator in kustomization.get("configMapGenerator") or []:
        options = generator.get("options") or {}
        metadata = {
            "name": generator["name"],
            "namespace": generator["namespace"],
            "labels": dict(options.get("labels") or {}),
            "annotations": dict(options.get("annotations") or {}),
        }
        data = {Path(f).name: (component / f).read_text(encoding="utf-8") for f in generator["files"]}
        docs.append(_labelled({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}))
    if not docs:
        return {}
    return {
        "dashboards.yaml": _wrap(".Values.dashboards.enabled", "---\n".join(_dump(d, Knobs()) for d in docs))
    }


HELPERS = """{{/* Generated by deploy/generate.py (deploy/chart.py); a test fails when it is out of date. */}}

{{/* node: the exporter DaemonSets; cluster: one Deployment watching every node (dcgm-exporter as
the source runs it too, as the kustomize component does). */}}
{{- define "gpuhealth.exporterMode" -}}
{{- if or .Values.dcgmExporter.enabled (eq .Values.exporter.mode "cluster") -}}
cluster
{{- else -}}
node
{{- end -}}
{{- end }}

{{/* The responder's ConfigMap, named after its content as kustomize's generator names it: a
change rolls the responder. */}}
{{- define "gpuhealth.responderConfig" -}}
{{- $content := list (toYaml .Values.responder.config) .Values.gpuReset.enabled -}}
gpuhealth-responder-config-{{ $content | toJson | sha256sum | trunc 10 }}
{{- end }}
"""

NOTES = """gpuhealth {{ .Chart.AppVersion }} is installed in {{ .Release.Namespace }}
(responder: {{ .Values.responder.mode }}).

{{- if .Values.responder.enabled }}

The responder pods wait until the webhook token exists; create it once, in any order with the
install (the chart never ships it, so upgrades and uninstall leave it alone):

  kubectl -n {{ .Release.Namespace }} create secret generic gpuhealth-responder-token \\
    --from-literal=token="$(openssl rand -hex 32)" --dry-run=client -o yaml | kubectl apply -f -
{{- end }}

Check it: kubectl -n {{ .Release.Namespace }} get pods; kubectl gpuhealth devices -A
docs/operations.md, "Install with Helm", has the rest.
"""


def chart_yaml() -> str:
    doc = {
        "apiVersion": "v2",
        "name": "gpuhealth",
        "description": "GPU failure governance for Kubernetes: device health, quarantine and release",
        "type": "application",
        "version": VERSION,
        "appVersion": IMAGE_TAG,
        "kubeVersion": ">=1.36.0-0",
        "keywords": ["gpu", "nvidia", "dra", "quarantine", "prometheus"],
        "maintainers": [{"name": "gpuhealth"}],
    }
    return yaml.safe_dump(doc, sort_keys=False, width=110)


def values(sources: Sources) -> dict[str, Any]:
    """The defaults: what `deploy/overlays/dry-run` installs."""
    [daemonset] = load(sources.base / "exporter-daemonset.yaml")
    [deployment] = load(sources.base / "responder-deployment.yaml")
    [cluster] = [
        d
        for d in load(sources.component("cluster-exporter") / "exporter-deployment.yaml")
        if d["kind"] == "Deployment"
    ]
    exporter_pod = daemonset["spec"]["template"]["spec"]
    responder_pod = deployment["spec"]["template"]["spec"]
    [responder] = responder_pod["containers"]
    [url] = [a for a in responder["args"] if a.startswith("--prometheus-url=")]
    [driver] = [a for a in exporter_pod["containers"][0]["args"] if a.startswith("--slice-health-driver=")]
    config = yaml.safe_load((sources.deploy / "responder-config.yaml").read_text(encoding="utf-8"))
    return {
        "image": {"repository": IMAGE_REPOSITORY, "tag": IMAGE_TAG, "digest": ""},
        "extraEnv": [],
        "exporter": {
            "mode": "node",
            "shards": 0,
            "devicePluginNodes": True,
            "privileged": False,
            "sliceHealthDriver": driver.split("=", 1)[1],
            "resources": exporter_pod["containers"][0]["resources"],
            "clusterResources": cluster["spec"]["template"]["spec"]["containers"][0]["resources"],
            "nodeSelector": exporter_pod["nodeSelector"],
            "tolerations": exporter_pod["tolerations"],
        },
        "responder": {
            "enabled": True,
            "mode": "dry-run",
            "replicas": deployment["spec"]["replicas"],
            "prometheusUrl": url.split("=", 1)[1],
            "resources": responder["resources"],
            "nodeSelector": responder_pod.get("nodeSelector", {}),
            "tolerations": responder_pod.get("tolerations", []),
            "affinity": responder_pod.get("affinity", {}),
            "config": config,
        },
        "gpuReset": {"enabled": False},
        "dcgmExporter": {"enabled": False},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "groups": []},
        "alertmanagerConfig": {"enabled": True, "spec": {}},
        "monitoringLabels": {},
        "noOperator": {"enabled": False},
        "dashboards": {"enabled": True},
        "networkPolicies": {"enabled": True, "monitoringNamespace": "monitoring"},
    }


VALUES_NOTES = {
    "image": "One image for every part; pin it by digest (digest wins over tag).",
    "extraEnv": "Environment variables added to every gpuhealth container (a proxy, a CA bundle path...).",
    "exporter": (
        "mode: node runs the exporter DaemonSets (one pod per GPU node; devicePluginNodes: the one on\n"
        "# nodes labelled nvidia.com/gpu.deploy.device-plugin=true); cluster runs one Deployment watching\n"
        "# every node (no NVML); with shards of 2 or more, as that many Deployments, each exporting the\n"
        '# nodes whose name hashes to it (docs/operations.md, "Shard the cluster-mode exporter").\n'
        "# nodeSelector: the GPU nodes (the device-plugin DaemonSet adds its label).\n"
        "# privileged: for container toolkits that ignore NVIDIA_VISIBLE_DEVICES in\n"
        "# unprivileged pods. sliceHealthDriver: the DRA driver whose ResourceSlice taints are its devices'\n"
        '# health (the NVIDIA DRA driver); "" turns it off.'
    ),
    "responder": (
        "mode: dry-run records what it would do and enforces nothing (install this first); enforcing\n"
        "# taints DRA devices, annotates device-plugin nodes and migrates checkpointed work.\n"
        "# prometheusUrl: where your Prometheus answers queries. config: deploy/responder-config.yaml's\n"
        "# settings (breaker, rate limits, migration, checks), each documented there."
    ),
    "gpuReset": "The reset hand-off: the responder asks NVSentinel's janitor for a GPUReset before a probe.",
    "dcgmExporter": "dcgm-exporter as the signal source: a cluster-mode exporter, a ServiceMonitor for it.",
    "serviceMonitor": (
        "Prometheus Operator objects: ServiceMonitors, the rules, the routing. prometheusRule.groups and\n"
        "# alertmanagerConfig.spec replace the shipped rules and routing when set: render them from your\n"
        "# own rules settings with `gpuhealth rules render --config MINE.yaml --format helm-values`."
    ),
    "monitoringLabels": "Labels added to those objects (kube-prometheus-stack: release: <its release name>).",
    "noOperator": "No Prometheus Operator: the rule files, scrape jobs, Alertmanager config, in ConfigMaps.",
    "dashboards": 'Grafana dashboards as ConfigMaps labelled grafana_dashboard: "1".',
    "networkPolicies": (
        "The exporter's port open only to monitoringNamespace (Prometheus), the responder's to it and\n"
        '# kube-system (docs/web-config.md, "Who can reach the endpoints").'
    ),
}


def values_yaml(sources: Sources) -> str:
    out = [
        "# Generated by deploy/generate.py (deploy/chart.py) from deploy/: the defaults install what",
        '# deploy/overlays/dry-run installs. docs/operations.md, "Install with Helm".',
        "# The rules' thresholds: `gpuhealth rules render --config MINE.yaml --format helm-values`",
        "# renders your settings as prometheusRule.groups and alertmanagerConfig.spec, for helm -f.",
    ]
    for key, value in values(sources).items():
        note = VALUES_NOTES.get(key)
        out.append("")
        if note:
            out.append(f"# {note}")
        out.append(yaml.safe_dump({key: value}, sort_keys=False, width=110).rstrip())
    return "\n".join(out) + "\n"


SCHEMA_CHOICES: dict[str, dict[str, Any]] = {
    "responder.mode": {"enum": ["dry-run", "enforcing"]},
    "responder.replicas": {"type": "integer", "minimum": 1},
    "responder.prometheusUrl": {"type": "string", "pattern": "^https?://"},
    "exporter.mode": {"enum": ["node", "cluster"]},
    "exporter.shards": {"type": "integer", "minimum": 0},
    "image.repository": {"type": "string", "minLength": 1},
}
FREE_FORM = {
    "resources",
    "clusterResources",
    "nodeSelector",
    "affinity",
    "config",
    "monitoringLabels",
    "spec",
}
"""Values whose content is Kubernetes' or the responder's to judge, not the chart's."""


def _schema_of(value: Any, path: str) -> dict[str, Any]:
    if path in SCHEMA_CHOICES:
        return SCHEMA_CHOICES[path]
    name = path.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": ["array", "null"]}
    if isinstance(value, dict) and name not in FREE_FORM:
        return {
            "type": "object",
            # A misspelt key is an error, not a silently ignored value.
            "additionalProperties": False,
            "properties": {k: _schema_of(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()},
        }
    return {"type": ["object", "null"]}


def schema(sources: Sources) -> str:
    """values.schema.json, from the defaults: every key the chart reads, nothing else (a misspelt
    one fails `helm lint --strict`, install and upgrade), and the choices."""
    doc = {"$schema": "https://json-schema.org/draft-07/schema#", **_schema_of(values(sources), "")}
    doc["properties"]["global"] = {"type": "object"}  # Helm's own, for subcharts
    return json.dumps(doc, indent=2) + "\n"


HEADER = "# Generated by deploy/generate.py (deploy/chart.py) from deploy/; a test fails when it is stale.\n"


def chart_files(deploy: Path) -> dict[str, str]:
    """Every file of the chart by its path relative to the repository root."""
    sources = Sources(deploy)
    files = {
        "Chart.yaml": HEADER + chart_yaml(),
        "values.yaml": values_yaml(sources),
        "values.schema.json": schema(sources),
        "crds/devicequarantines.gpuhealth.io.yaml": (
            deploy / "crds/devicequarantines.gpuhealth.io.yaml"
        ).read_text(encoding="utf-8"),
        ".helmignore": "# Generated by deploy/generate.py.\n*.orig\n*~\n",
    }
    for name, text in templates(sources).items():
        if name.endswith(".yaml"):
            text = HEADER + text
        files[name] = text
    return {f"{CHART}/{k}": v for k, v in files.items()}
