"""The ramp's opt-in objects (deploy/opt-in/canary-ok.yaml), as a user applies them.

Aspects: both documents validate strictly against the Kubernetes 1.36 and 1.37 schemas (a
DeviceClass has no tolerations there, so the DRA opt-in is a ResourceClaimTemplate whose request
tolerates the canary taint); the template's tolerations match the responder's canary taint and
never its quarantine taint, whatever the effect; the example Deployment's pods carry the label
the scheduler extender reads (its own `opted_in`); and the simulator's opted-in workloads ask
for exactly the shipped tolerations and label, so the scenarios run what the docs tell users.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from responder.extender.filter import opted_in
from responder.ladder import CANARY_OPT_IN, CANARY_TAINT, QUARANTINE_TAINT
from simulator.fleet import objects
from simulator.fleet.tolerations import tolerates
from simulator.scenario import resolve
from tests.deploy.manifests import DEPLOY

OPT_IN = DEPLOY / "opt-in" / "canary-ok.yaml"


def shipped() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(OPT_IN.read_text())}


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_the_opt_in_objects_validate_strictly(version: str) -> None:
    docs = shipped()
    assert sorted(docs) == ["Deployment", "ResourceClaimTemplate"]
    for doc in docs.values():
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_device_class_cannot_carry_the_toleration() -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu-canary-ok"},
        "spec": {"tolerations": [{"key": CANARY_TAINT, "operator": "Exists"}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError, match="tolerations"):
        kubernetes_validate.validate(device_class, "1.37", strict=True)


def template_tolerations() -> list[dict[str, Any]]:
    requests = shipped()["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"]
    assert len(requests) == 1
    tolerations: list[dict[str, Any]] = requests[0]["exactly"]["tolerations"]
    return tolerations


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_the_template_tolerates_the_ramp_and_never_the_quarantine(effect: str) -> None:
    tolerations = template_tolerations()
    canary = {"key": CANARY_TAINT, "value": "Unhealthy", "effect": "NoSchedule"}
    quarantine = {"key": QUARANTINE_TAINT, "value": "Unhealthy", "effect": effect}
    assert any(tolerates(t, canary) for t in tolerations)
    assert not any(tolerates(t, quarantine) for t in tolerations)


def test_the_example_pods_carry_the_label_the_extender_reads() -> None:
    template = shipped()["Deployment"]["spec"]["template"]
    assert template["metadata"]["labels"][CANARY_OPT_IN] == "true"
    assert opted_in(template)


def test_the_simulator_opts_in_as_users_are_told_to() -> None:
    scenario = resolve("gradual-return")
    workload = next(w for w in scenario.workloads if w.canary and w.path == "dra")
    request = objects.resource_claim_template(workload)["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["tolerations"] == template_tolerations()
    pod = objects.pod(
        name="p", workload=workload, node_name="n", gpus=1, dra=True, claim_name=None, job_uid=None
    )
    assert opted_in(pod)
    ordinary = next(w for w in scenario.workloads if not w.canary)
    assert objects.claim_tolerations(ordinary) == []
