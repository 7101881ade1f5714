"""The manifests under deploy/: what each overlay installs, and that every object is valid.

Aspects: `kubectl kustomize` (kubectl 1.37, kustomize 5.8) builds every overlay and the
cluster-exporter (also split into shards: one Deployment per shard, each with shard flags the
exporter accepts, selectors apart, all behind the one Service) and dcgm-exporter components on top
of one (the latter: no DaemonSet, a ServiceMonitor scraping dcgm-exporter as the job the rules
select); every built-in kind validates strictly
against the Kubernetes 1.36 and 1.37 schemas (kubernetes-validate), and the strict check does
refuse an unknown field; ServiceMonitors, the PrometheusRule and the AlertmanagerConfig validate
against the Prometheus Operator schemas of the fields we use, with unknown fields forbidden; the
exporter DaemonSet is the node-mode exporter the issue describes (no GPU requested, NVIDIA
runtime and environment, GPU nodes and taints, no capabilities, node-critical, NODE_NAME from
the downward API); on device-plugin nodes its twin instead, the same pod reading the kubelet's
pod-resources socket (a read-only host mount, UID 0 for the root-owned socket, the flag as the
exporter parses it), the two never on one node and never selecting each other's pods, both
behind the one Service; the responder runs two replicas with a disruption budget, its token and
config; dry-run overlays pass --dry-run and enforcing does not; no-operator ships no operator
kinds; the exporter targets get the `node` relabelling the rules rely on; the generated
Alertmanager config passes `amtool check-config` and the rules `promtool check rules`;
dashboards are labelled for the Grafana sidecar; the scheduler extender snippet parses as a
KubeSchedulerConfiguration and names the responder's Service; the gpu-reset component turns the
reset hand-off on (its file in the responder's ConfigMap as a second --config) and grants
create/get/list/watch/delete on the janitor's GPUResets only, which the base never grants.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from exporter.cli import settings_from_args
from gpuhealth_cli.main import build_parser
from responder.config import apply
from responder.ladder import LADDER, with_reset
from responder.settings import ResponderSettings
from rules.render import DEFAULT_CONFIG, load_config
from simulator.fleet.extender_client import load_scheduler_config
from tests.deploy.manifests import (
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    build,
    container,
    find,
    kustomize,
    operator_schemas,
    schema_errors,
)
from tests.rules.support import require_tool

OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_builds_with_the_core_objects(overlay: str) -> None:
    objects = build(overlay)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for wanted in [
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "devicequarantines.gpuhealth.io"),
        ("ServiceAccount", "gpuhealth-exporter"),
        ("ServiceAccount", "gpuhealth-responder"),
        ("DaemonSet", "gpuhealth-exporter"),
        ("DaemonSet", "gpuhealth-exporter-device-plugin"),
        ("Deployment", "gpuhealth-responder"),
        ("PodDisruptionBudget", "gpuhealth-responder"),
        ("Service", "gpuhealth-responder"),
        ("Service", "gpuhealth-exporter"),
        ("ConfigMap", "gpuhealth-breaker"),
        ("ValidatingAdmissionPolicy", "gpuhealth-devicequarantine-status"),
        ("ValidatingAdmissionPolicyBinding", "gpuhealth-devicequarantine-status"),
    ]:
        assert wanted in kinds, f"{overlay}: {wanted} missing"
    namespaced = [o for o in objects if o["kind"] not in _CLUSTER_SCOPED]
    assert {o["metadata"].get("namespace") for o in namespaced} <= {NAMESPACE, "kube-node-lease"}
    assert [
        o["metadata"]["name"] for o in namespaced if o["metadata"].get("namespace") == "kube-node-lease"
    ] == [
        "gpuhealth-exporter-node-leases",
        "gpuhealth-exporter-node-leases",
    ]


_CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
}


def test_the_cluster_exporter_component_replaces_the_daemonset(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "enforcing", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / "cluster-exporter", tmp_path)],
            }
        )
    )
    objects = kustomize(tmp_path)
    assert not [o for o in objects if o["kind"] == "DaemonSet"]
    deployment = find(objects, "Deployment", "gpuhealth-exporter-cluster")
    args = container(deployment)["args"]
    assert args[0] == "exporter" and not any(a.startswith("--node") for a in args)
    service = find(objects, "Service", "gpuhealth-exporter-cluster")
    # The same scrape job as the node-mode exporter: the ServiceMonitor selects it.
    monitor = find(objects, "ServiceMonitor", "gpuhealth-exporter")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[monitor["spec"]["jobLabel"]] == "gpuhealth-exporter"
    _validate_builtins(objects, "1.37")


def test_the_shards_component_runs_one_cluster_exporter_per_shard(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "enforcing", tmp_path)],
                "components": [
                    os.path.relpath(DEPLOY / "components" / name, tmp_path)
                    for name in ("cluster-exporter", "cluster-exporter-shards")
                ],
            }
        )
    )
    objects = kustomize(tmp_path)
    exporters = [
        o for o in objects if o["kind"] in ("Deployment", "DaemonSet") and "exporter" in o["metadata"]["name"]
    ]
    assert sorted(o["metadata"]["name"] for o in exporters) == [
        f"gpuhealth-exporter-cluster-{i}" for i in range(3)
    ]
    shards = []
    for deployment in exporters:
        args = container(deployment)["args"]
        settings = settings_from_args(build_parser().parse_args(args))  # the flags as the exporter reads them
        assert settings.observer.node_name is None
        shards.append((settings.observer.shard.index, settings.observer.shard.total))
    assert sorted(shards) == [(0, 3), (1, 3), (2, 3)]
    # Selectors apart (no Deployment adopts another's pods); the one Service reaches every shard.
    selectors = [frozenset(d["spec"]["selector"]["matchLabels"].items()) for d in exporters]
    assert all(not a <= b for a in selectors for b in selectors if a is not b)
    service = find(objects, "Service", "gpuhealth-exporter-cluster")
    for deployment in exporters:
        assert (
            service["spec"]["selector"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
    _validate_builtins(objects, "1.37")


def test_the_dcgm_exporter_component_runs_the_cluster_exporter_and_scrapes_dcgm_exporter_as_the_rules_job(
    tmp_path: Path,
) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "enforcing", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / "dcgm-exporter", tmp_path)],
            }
        )
    )
    objects = kustomize(tmp_path)
    # No per-node agent of gpuhealth's beside dcgm-exporter: the cluster-mode exporter, no NVML.
    assert not [o for o in objects if o["kind"] == "DaemonSet"]
    args = container(find(objects, "Deployment", "gpuhealth-exporter-cluster"))["args"]
    assert "--nvml=none" in args and not any(a.startswith("--node") for a in args)
    monitor = find(objects, "ServiceMonitor", "gpuhealth-dcgm-exporter")
    assert list(schema_errors(monitor, operator_schemas()["monitoring.coreos.com/v1/ServiceMonitor"])) == []
    [endpoint] = monitor["spec"]["endpoints"]
    [job] = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    # The job the rules' shipped matchers select.
    assert load_config(DEFAULT_CONFIG).dcgm.matchers == f'job="{job["replacement"]}"'
    plain = yaml.safe_load(
        (DEPLOY / "components/dcgm-exporter/prometheus-scrape-dcgm-exporter.yaml").read_text()
    )
    [scrape] = plain["scrape_configs"]
    assert scrape["job_name"] == job["replacement"] and scrape["honor_labels"] is True
    _validate_builtins(objects, "1.37")


def test_the_gpu_reset_component_grants_the_responder_the_reset_requests_only(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "enforcing", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / "gpu-reset", tmp_path)],
            }
        )
    )
    objects = kustomize(tmp_path)
    role = find(objects, "ClusterRole", "gpuhealth-responder-gpu-reset")
    assert role["rules"] == [
        {
            "apiGroups": ["janitor.dgxc.nvidia.com"],
            "resources": ["gpuresets"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        }
    ]
    binding = find(objects, "ClusterRoleBinding", "gpuhealth-responder-gpu-reset")
    responder = find(objects, "ServiceAccount", "gpuhealth-responder")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "gpuhealth-responder",
            "namespace": responder["metadata"]["namespace"],
        }
    ]
    # It turns the hand-off on: its file in the responder's ConfigMap, applied over the shipped one.
    config_map = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gpuhealth-responder-config")
    )
    assert set(config_map["data"]) == {"responder-config.yaml", "responder-config-gpu-reset.yaml"}
    args = container(find(objects, "Deployment", "gpuhealth-responder"))["args"]
    files = [a.removeprefix("--config=/etc/gpuhealth/config/") for a in args if a.startswith("--config=")]
    assert files == ["responder-config.yaml", "responder-config-gpu-reset.yaml"]
    settings = ResponderSettings(token="t", identity="i", prometheus_url="http://p")
    for name in files:
        settings = apply(yaml.safe_load(config_map["data"][name]), settings, name)
    assert settings.reconciler.policy.ladder == with_reset(LADDER)
    assert settings.reconciler.policy.reset_timeout_seconds == 900  # the shipped file's
    # The base grants nothing on the kind: without the component the responder may not reset.
    base = kustomize(DEPLOY / "overlays" / "enforcing")
    assert not any(
        "janitor.dgxc.nvidia.com" in (rule.get("apiGroups") or ())
        for o in base
        if o["kind"] in ("ClusterRole", "Role")
        for rule in o.get("rules") or ()
    )
    _validate_builtins(objects, "1.37")


def _validate_builtins(objects: list[dict[str, Any]], version: str) -> None:
    errors = []
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", ["1.36", "1.37"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_kinds_validate_strictly(overlay: str, version: str) -> None:
    _validate_builtins(build(overlay), version)


def test_the_strict_check_refuses_an_unknown_field() -> None:
    daemonset = copy.deepcopy(find(build("enforcing"), "DaemonSet", "gpuhealth-exporter"))
    container(daemonset)["runtimeClass"] = "nvidia"  # belongs on the pod spec, as runtimeClassName
    with pytest.raises(kubernetes_validate.ValidationError, match="runtimeClass"):
        kubernetes_validate.validate(daemonset, "1.37", strict=True)


@pytest.mark.parametrize("overlay", ["dry-run", "enforcing", "privileged"])
def test_operator_objects_validate_against_their_crd_schemas(overlay: str) -> None:
    objects = [o for o in build(overlay) if o["kind"] in OPERATOR_KINDS]
    assert sorted(o["kind"] for o in objects) == [
        "AlertmanagerConfig",
        "PrometheusRule",
        "ServiceMonitor",
        "ServiceMonitor",
    ]
    schemas = operator_schemas()
    errors = [e for o in objects for e in schema_errors(o, schemas[f"{o['apiVersion']}/{o['kind']}"])]
    assert not errors, "\n".join(errors)


def test_the_operator_schemas_refuse_unknown_and_misplaced_fields() -> None:
    schemas = operator_schemas()
    monitor = copy.deepcopy(find(build("enforcing"), "ServiceMonitor", "gpuhealth-exporter"))
    monitor["spec"]["endpoints"][0]["relabelings"][0]["target_label"] = "node"  # the scrape-config spelling
    assert any(
        "target_label" in e
        for e in schema_errors(monitor, schemas["monitoring.coreos.com/v1/ServiceMonitor"])
    )
    config = copy.deepcopy(find(build("enforcing"), "AlertmanagerConfig", "gpuhealth"))
    config["spec"]["route"]["routes"][0]["matchers"][0]["matchType"] = "=="
    assert any(
        "==" in e for e in schema_errors(config, schemas["monitoring.coreos.com/v1alpha1/AlertmanagerConfig"])
    )


def test_no_operator_ships_no_operator_kinds_but_the_plain_files() -> None:
    objects = build("no-operator")
    assert not [o for o in objects if o["kind"] in OPERATOR_KINDS]
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    rules = maps["gpuhealth-prometheus-rules"]["data"]
    assert sorted(rules) == sorted(p.name for p in (DEPLOY / "components/no-operator/rules").glob("*.yaml"))
    scrape = yaml.safe_load(maps["gpuhealth-prometheus-scrape"]["data"]["prometheus-scrape.yaml"])
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    assert set(jobs) == {"gpuhealth-exporter", "gpuhealth-responder"}
    [node] = [r for r in jobs["gpuhealth-exporter"]["relabel_configs"] if r.get("target_label") == "node"]
    assert node["regex"] == "node;(.+)" and node["source_labels"][-1] == "__meta_kubernetes_pod_node_name"
    assert "alertmanager.yaml" in maps["gpuhealth-alertmanager-config"]["data"]


def test_the_exporter_daemonset_is_the_node_mode_exporter() -> None:
    daemonset = find(build("enforcing"), "DaemonSet", "gpuhealth-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    exporter = container(daemonset)
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert {(t["key"], t["effect"]) for t in pod["tolerations"]} >= {
        ("nvidia.com/gpu", "NoSchedule"),
        ("nvidia.com/gpu", "NoExecute"),
    }
    env = {e["name"]: e for e in exporter["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node=$(NODE_NAME)" in exporter["args"]
    # No GPU requested: the exporter must not take a device from work.
    assert not any(
        "nvidia.com" in r
        for r in {**exporter["resources"].get("requests", {}), **exporter["resources"].get("limits", {})}
    )
    assert exporter["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert exporter["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["serviceAccountName"] == "gpuhealth-exporter"


def test_device_plugin_nodes_run_the_exporter_that_reads_the_kubelets_pod_resources() -> None:
    objects = build("enforcing")
    other = find(objects, "DaemonSet", "gpuhealth-exporter")
    device_plugin = find(objects, "DaemonSet", "gpuhealth-exporter-device-plugin")
    pod, other_pod = device_plugin["spec"]["template"]["spec"], other["spec"]["template"]["spec"]
    exporter = container(device_plugin)

    # Never both on one node (they would share the device directory): one selects the device
    # plugin's label, the other excludes it.
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    assert "affinity" not in pod
    [term] = other_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchExpressions": [
            {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "NotIn", "values": ["true"]}
        ]
    }
    # Neither selects the other's pods; the one Service selects both.
    for mine, theirs in [(device_plugin, other), (other, device_plugin)]:
        labels = theirs["spec"]["template"]["metadata"]["labels"]
        assert not mine["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = find(objects, "Service", "gpuhealth-exporter")
    for daemonset in (device_plugin, other):
        assert (
            service["spec"]["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
        )

    # The kubelet's socket, as the exporter's own command line parses the flag.
    [flag] = [a for a in exporter["args"] if a.startswith("--pod-resources")]
    parsed = settings_from_args(
        build_parser().parse_args(["exporter", flag, "--node", "n", "--nvml", "pynvml"])
    )
    socket = parsed.pod_resources.removeprefix("unix://")
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    [mount] = [m for m in exporter["volumeMounts"] if socket.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == mount["mountPath"]
    # The socket is root-owned: UID 0, with every capability still dropped.
    assert exporter["securityContext"]["runAsUser"] == 0
    assert exporter["securityContext"]["capabilities"]["drop"] == ["ALL"]

    # Otherwise the same pod as on every other GPU node.
    def rest(daemonset: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(daemonset["spec"]["template"]["spec"])
        for key in ("nodeSelector", "affinity"):
            spec.pop(key, None)
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] != mount["name"]]
        [c] = spec["containers"]
        c["args"] = [a for a in c["args"] if a != flag]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != mount["name"]]
        return spec

    assert rest(device_plugin) == rest(other)


def test_the_privileged_overlay_only_makes_the_exporter_privileged() -> None:
    plain, privileged = build("dry-run"), build("privileged")
    for name in ("gpuhealth-exporter", "gpuhealth-exporter-device-plugin"):
        daemonset = find(privileged, "DaemonSet", name)
        assert container(daemonset)["securityContext"]["privileged"] is True
        assert container(find(plain, "DaemonSet", name))["securityContext"].get("privileged") is None
    assert [o for o in plain if o["kind"] != "DaemonSet"] == [
        o for o in privileged if o["kind"] != "DaemonSet"
    ]


def test_the_responder_runs_two_leader_elected_replicas_with_its_token_and_config() -> None:
    objects = build("enforcing")
    deployment = find(objects, "Deployment", "gpuhealth-responder")
    assert deployment["spec"]["replicas"] == 2
    pdb = find(objects, "PodDisruptionBudget", "gpuhealth-responder")
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    responder = container(deployment)
    args = responder["args"]
    assert args[0] == "responder" and "--identity=$(POD_NAME)" in args
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in responder["volumeMounts"]}
    assert volumes["token"]["secret"]["secretName"] == "gpuhealth-responder-token"
    assert f"--token-file={mounts['token']}/token" in args
    config_map = find(objects, "ConfigMap", volumes["config"]["configMap"]["name"])
    assert config_map["data"]["responder-config.yaml"].endswith(
        (DEPLOY / "responder-config.yaml").read_text()
    )
    assert f"--config={mounts['config']}/responder-config.yaml" in args
    # The token is the operator's, created in any order with the install: no manifest ships the
    # Secret, so no apply or uninstall ever touches it (docs/operations.md).
    assert not [o for o in objects if o["kind"] == "Secret"]
    breaker = find(objects, "ConfigMap", "gpuhealth-breaker")
    assert "data" not in breaker  # an apply never resets the breaker's state
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(
    "overlay,dry_run", [("dry-run", True), ("privileged", True), ("no-operator", True), ("enforcing", False)]
)
def test_only_the_enforcing_overlay_enforces(overlay: str, dry_run: bool) -> None:
    args = container(find(build(overlay), "Deployment", "gpuhealth-responder"))["args"]
    assert ("--dry-run" in args) is dry_run


def test_exporter_targets_carry_their_node_name() -> None:
    monitor = find(build("enforcing"), "ServiceMonitor", "gpuhealth-exporter")
    [endpoint] = monitor["spec"]["endpoints"]
    [relabel] = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "node"]
    assert relabel["sourceLabels"] == [
        "__meta_kubernetes_service_label_gpuhealth_io_exporter_mode",
        "__meta_kubernetes_pod_node_name",
    ]
    assert relabel["regex"] == "node;(.+)" and relabel["replacement"] == "$1"
    assert endpoint["honorLabels"] is True
    service = find(build("enforcing"), "Service", "gpuhealth-exporter")
    assert service["metadata"]["labels"]["gpuhealth.io/exporter-mode"] == "node"
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "gpuhealth-exporter"


def test_the_alertmanager_config_passes_amtool(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    done = subprocess.run(
        [amtool, "check-config", str(DEPLOY / "components/no-operator/alertmanager.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((DEPLOY / "components/no-operator/alertmanager.yaml").read_text())
    assert f" - {len(config['receivers'])} receivers" in done.stdout
    [responder] = [r for r in config["receivers"] if r["name"] == "gpuhealth-responder"]
    [hook] = responder["webhook_configs"]
    # In-cluster: the responder's Service, and the token where Alertmanager mounts the Secret.
    assert hook["url"] == "http://gpuhealth-responder.gpuhealth-system.svc:8080/webhook"
    token_file = hook["http_config"]["authorization"]["credentials_file"]
    assert token_file == "/etc/alertmanager/secrets/gpuhealth-responder-token/token"


def test_the_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rule = find(build("enforcing"), "PrometheusRule", "gpuhealth")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rendered = [
        g["name"]
        for f in sorted((DEPLOY.parent / "rules/prometheus").glob("*.yaml"))
        for g in yaml.safe_load(f.read_text())["groups"]
    ]
    assert sorted(g["name"] for g in rule["spec"]["groups"]) == sorted(rendered)


def test_dashboards_are_labelled_for_the_grafana_sidecar() -> None:
    """One ConfigMap per dashboards/*.json; none while no dashboard is committed yet."""
    objects = build("enforcing")
    boards = sorted(p.name for p in (DEPLOY.parent / "dashboards").glob("*.json"))
    maps = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gpuhealth-dashboard-")
    ]
    assert sorted(name for m in maps for name in m["data"]) == boards
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == NAMESPACE
        size = sum(len(v.encode()) for v in config_map["data"].values())
        assert size < 1024 * 1024, f"{config_map['metadata']['name']}: {size} bytes, over a ConfigMap's 1 MiB"


def test_the_scheduler_extender_snippet_points_at_the_responder() -> None:
    [extender] = load_scheduler_config(DEPLOY / "scheduler" / "kube-scheduler-config.yaml")
    service = find(build("enforcing"), "Service", "gpuhealth-responder")
    [port] = service["spec"]["ports"]
    assert extender.url_prefix == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}/scheduler"
    )
    assert extender.filter_verb == "filter"
    assert extender.ignorable and extender.node_cache_capable


def test_the_operator_guides_example_overlay_builds_and_patches_what_it_says(tmp_path: Path) -> None:
    """docs/operations.md's own overlay: built as written (paths made local), its patches land."""
    guide = (DEPLOY.parent / "docs" / "operations.md").read_text()
    [example] = [b for b in guide.split("```yaml\n")[1:] if b.startswith("# my-cluster/kustomization.yaml")]
    text = example.split("```")[0].replace("../gpuhealth/deploy", os.path.relpath(DEPLOY, tmp_path))
    text = text.replace("sha256:...", "sha256:" + "0" * 64)
    (tmp_path / "kustomization.yaml").write_text(text)
    objects = kustomize(tmp_path)
    args = container(find(objects, "Deployment", "gpuhealth-responder"))["args"]
    assert [a for a in args if a.startswith("--prometheus-url=")] == [
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090"
    ]
    assert "--dry-run" in args and len(args) == len(
        container(find(build("dry-run"), "Deployment", "gpuhealth-responder"))["args"]
    )
    operator = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert operator and all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in operator)
    assert find(objects, "AlertmanagerConfig", "gpuhealth")["metadata"]["namespace"] == "monitoring"
    assert (
        container(find(objects, "DaemonSet", "gpuhealth-exporter"))["image"]
        == "REGISTRY/gpuhealth@sha256:" + "0" * 64
    )


def test_the_plain_scrape_config_passes_promtool(tmp_path: Path) -> None:
    """Discovery, relabelling (regexes, actions, label names) and rule files as Prometheus 3 reads
    them: the pinned build carries Kubernetes discovery, so the jobs are checked as shipped."""
    promtool = require_tool("promtool")
    scrape = yaml.safe_load((DEPLOY / "components/no-operator/prometheus-scrape.yaml").read_text())
    for job in scrape["scrape_configs"]:
        assert job["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": [NAMESPACE]}}]
    rules = sorted(str(p) for p in (DEPLOY / "components/no-operator/rules").glob("*.yaml"))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({**scrape, "rule_files": rules}))
    done = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rule files found" in done.stdout
