"""NetworkPolicies (deploy/components/network-policies, in every overlay): each selects the pods
it means by their template labels and opens only their serving port, the exporter's to
Prometheus's namespace alone. The real apiserver accepts them in test_deploy_on_cluster."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, OVERLAYS, kustomize

WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"] for o in objects if o["kind"] in WORKLOADS]


def selected(policy: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return [
        t
        for t in pod_templates(objects)
        if all(t["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
    ]


def ports(template: dict[str, Any]) -> set[int]:
    return {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", ())}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_opens_gpuhealth_s_ports_only_to_those_who_call_them(overlay: str) -> None:
    objects = kustomize(DEPLOY / "overlays" / overlay)
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"gpuhealth-exporter", "gpuhealth-responder"}
    for name, policy in policies.items():
        assert policy["metadata"]["namespace"] == "gpuhealth-system"
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress (the apiserver, Prometheus) open
        pods = selected(policy, objects)
        assert pods, f"{name} selects no pod of {overlay}"
        opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        for template in pods:
            assert opened <= ports(template), (name, opened, ports(template))
        for rule in policy["spec"]["ingress"]:
            assert rule["from"] and all(set(peer) == {"namespaceSelector"} for peer in rule["from"])
    exporter = policies["gpuhealth-exporter"]["spec"]["ingress"]
    assert [peer["namespaceSelector"] for rule in exporter for peer in rule["from"]] == [
        {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    ]


def test_the_cluster_mode_exporter_shards_are_covered_too(tmp_path_factory: pytest.TempPathFactory) -> None:
    # An overlay of one's own beside the shipped ones (kustomize resolves paths from the folder).
    with tempfile.TemporaryDirectory(dir=DEPLOY / "overlays") as folder:
        (Path(folder) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources:\n  - ../../base\n"
            "components:\n  - ../../components/cluster-exporter\n"
            "  - ../../components/cluster-exporter-shards\n  - ../../components/network-policies\n"
        )
        objects = kustomize(Path(folder))
    policy = next(
        o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "gpuhealth-exporter"
    )
    shards = [
        t for t in selected(policy, objects) if "--shard" in str(t["spec"]["containers"][0].get("args", ""))
    ]
    assert len(shards) >= 2
