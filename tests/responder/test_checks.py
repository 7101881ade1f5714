"""Probe and canary Jobs (responder.checks.jobs), with a fake client.

Aspects: Job names carry the record, kind and attempt and stay within 63 characters, distinct
per record, kind and attempt (property); a device-plugin check is pinned with `spec.nodeName`
and the probe-device annotation; a DRA check's claim template selects the device by uuid and
tolerates the quarantine and canary taints; both are owned by the record; starting twice
creates nothing twice; Job status maps to a CheckResult (Absent, Running, Succeeded, Failed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.client import ObjectList
from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import Resource
from responder.checks.jobs import JOB, JobChecks, job_name, job_result
from responder.enforce.node_annotation import PROBE_DEVICE
from responder.enforce.taint_rules import CLAIM_TEMPLATE
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, CheckResult
from responder.records import Quarantine, record_name
from responder.webhook.intake import IntakeSettings, Write, decide
from tests.responder.test_intake import NOW, alert

DRA_LABELS = {
    "device": "gpu.nvidia.com/gpu-node-1/gpu-3",
    "driver": "gpu.nvidia.com",
    "pool": "gpu-node-1",
    "device_name": "gpu-3",
    "uuid": "GPU-dra-3",
}


def record(**labels: str) -> Quarantine:
    decision = decide(None, alert(**labels), now=NOW, settings=IntakeSettings())
    assert isinstance(decision, Write)
    return replace(decision.record, uid="uid-1")


class Client:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        try:
            return self.objects[(resource.plural, name)]
        except KeyError:
            raise NotFound(name) from None

    def list(
        self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        key, _, value = (label_selector or "").partition("=")
        items = [
            o
            for (plural, _), o in self.objects.items()
            if plural == resource.plural and (not key or o["metadata"].get("labels", {}).get(key) == value)
        ]
        return ObjectList(items, "1")

    def delete(self, resource: Resource, name: str, **kwargs: Any) -> dict[str, Any]:
        if self.objects.pop((resource.plural, name), None) is None:
            raise NotFound(name)
        return {}

    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        key = (resource.plural, obj["metadata"]["name"])
        if key in self.objects:
            raise AlreadyExists(obj["metadata"]["name"])
        self.objects[key] = obj
        return obj


@given(st.text(min_size=1, max_size=80), st.sampled_from(["probe", "canary"]), st.integers(1, 10_000))
def test_job_names_are_short_and_distinct(device: str, kind: str, attempt: int) -> None:
    one = replace(record(), name=record_name("gpu-node-1", device))
    name = job_name(one, kind, attempt)
    assert len(name) <= 63 and name.endswith(f"-{kind}-{attempt}")
    other = replace(one, name=record_name("gpu-node-2", device))
    assert job_name(other, kind, attempt) != name
    assert job_name(one, kind, attempt + 1) != name


def test_a_device_plugin_check_is_pinned_to_the_node_and_device() -> None:
    client = Client()
    checks = JobChecks(client)
    r = record(uuid="GPU-4a1c")
    checks.start(r, "probe", 1)
    checks.start(r, "probe", 1)  # again: nothing twice
    assert list(client.objects) == [(JOB.plural, f"{r.name}-probe-1")]
    job = client.objects[(JOB.plural, f"{r.name}-probe-1")]
    pod = job["spec"]["template"]
    assert pod["spec"]["nodeName"] == "gpu-node-1"
    assert pod["metadata"]["annotations"][PROBE_DEVICE] == "GPU-4a1c"
    assert pod["spec"]["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_a_dra_check_claims_the_device_by_uuid_and_tolerates_the_taints() -> None:
    client = Client()
    checks = JobChecks(client)
    r = record(**DRA_LABELS)
    checks.start(r, "canary", 2)
    name = f"{r.name}-canary-2"
    template = client.objects[(CLAIM_TEMPLATE.plural, name)]
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].uuid == "GPU-dra-3"'}}
    ]
    assert {t["key"] for t in request["tolerations"]} == {QUARANTINE_TAINT, CANARY_TAINT}
    pod = client.objects[(JOB.plural, name)]["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": name}]
    assert "nodeName" not in pod
    assert template["metadata"]["ownerReferences"][0]["name"] == r.name


def test_job_status_is_a_check_result() -> None:
    client = Client()
    checks = JobChecks(client)
    r = record()
    assert checks.result(r, "probe", 1) == CheckResult.ABSENT
    checks.start(r, "probe", 1)
    assert checks.result(r, "probe", 1) == CheckResult.RUNNING
    assert checks.result(r, "probe", 2) == CheckResult.ABSENT  # another attempt's Job is not ours
    complete = {"conditions": [{"type": "Complete", "status": "True"}]}
    failed = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert job_result({"status": complete}) == CheckResult.SUCCEEDED
    assert job_result({"status": failed}) == CheckResult.FAILED
    assert job_result({"status": {"failed": 1}}) == CheckResult.FAILED
    assert job_result({"status": {"succeeded": 1}}) == CheckResult.SUCCEEDED
    assert job_result({"status": {"active": 1}}) == CheckResult.RUNNING


def test_finishing_a_check_removes_its_pods_even_when_the_job_deletion_orphaned_them() -> None:
    client = Client()
    checks = JobChecks(client)
    r = record(**DRA_LABELS)
    checks.start(r, "probe", 1)
    name = job_name(r, "probe", 1)
    # The Job's pod, left behind with no ownerReferences (orphaned), still holding its claim.
    client.objects[("pods", f"{name}-x1")] = {
        "metadata": {"name": f"{name}-x1", "labels": {"job-name": name}}
    }
    client.objects[("pods", "bystander")] = {
        "metadata": {"name": "bystander", "labels": {"job-name": "other"}}
    }
    checks.finish(r, "probe", 1)
    assert sorted(client.objects) == [("pods", "bystander")]
    checks.finish(r, "probe", 1)  # again: nothing left, nothing fails
