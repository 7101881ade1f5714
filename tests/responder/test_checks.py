"""Probe and canary Jobs (responder.checks.jobs), with a fake client.

Aspects: Job names carry the record, kind and attempt and stay within 63 characters, distinct
per record, kind and attempt (property); a device-plugin check asks for no GPU (a kubelet would
hand it any free one), is pinned with `spec.nodeName`, tolerates every taint and gets the
device from the NVIDIA runtime (`NVIDIA_VISIBLE_DEVICES=<uuid>`, the configured RuntimeClass),
with no annotation naming the device for it; a DRA check's claim template selects the device
by uuid and tolerates the quarantine and canary taints, for the probe and the canary alike, and
its pod the node escalation's taint;
both are owned by the record; the canary runs its own image and command, not the probe's, as
configured; a check rung without a spec is refused; starting twice creates nothing twice; Job
status maps to a CheckResult (Absent, Running, Succeeded, Failed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.fields import SettingsError
from gpuhealth.kube.client import ObjectList
from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import Resource
from responder.checks.jobs import (
    CANARY,
    JOB,
    PROBE,
    CheckSettings,
    CheckSpec,
    job_name,
    job_result,
)
from responder.enforce.taint_rules import CLAIM_TEMPLATE
from responder.ladder import LADDER, Kind, Rung
from responder.reconcile.escalation import TAINT_KEY as ESCALATION_TAINT
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, CheckResult, PolicySettings
from responder.reconcile.reconciler import ReconcilerSettings
from responder.records import Quarantine, record_name
from responder.settings import ResponderSettings
from responder.webhook.intake import IntakeSettings, Write, decide
from tests.responder.test_intake import NOW, alert
from tests.support.backends import identified, job_checks

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
    return replace(identified(decision.record), uid="uid-1")


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


def pod_of(client: Client, name: str) -> dict[str, Any]:
    template: dict[str, Any] = client.objects[(JOB.plural, name)]["spec"]["template"]
    return template


def device_container(spec: dict[str, Any]) -> dict[str, Any]:
    """The container that uses the card: the probe's diagnostic (an init container), else the one."""
    if spec.get("initContainers"):
        (diag,) = spec["initContainers"]
        return dict(diag)
    (container,) = spec["containers"]
    return dict(container)


def device_env(container: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e["value"] for e in container.get("env") or () if not e["name"].startswith("GPUHEALTH_")
    }


@pytest.mark.parametrize("kind", ["probe", "canary"])
def test_a_device_plugin_check_asks_the_kubelet_for_one_gpu_on_the_node(kind: str) -> None:
    client = Client()
    checks = job_checks(client)
    r = record(uuid="GPU-4a1c")
    assert checks.through_kubelet(r)
    checks.start(r, kind, 1)
    checks.start(r, kind, 1)  # again: nothing twice
    name = f"{r.name}-{kind}-1"
    assert list(client.objects) == [(JOB.plural, name)]
    job = client.objects[(JOB.plural, name)]
    pod = pod_of(client, name)
    spec = pod["spec"]
    container = device_container(spec)
    # One GPU from the kubelet, while the card's hold has stepped aside (the only free GPU is the
    # card); the device plugin's Allocate names it to the runtime, not an env of ours.
    gpu = {"nvidia.com/gpu": "1"}
    assert container["resources"] == {"limits": gpu, "requests": gpu} and "resourceClaims" not in spec
    assert device_env(container) == {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    # The probe's judge asks for the same GPU: the kubelet reports devices of app containers only.
    assert all(c.get("resources") == {"limits": gpu, "requests": gpu} for c in spec["containers"])
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeName"] == "gpu-node-1"  # not scheduled: the extender would refuse the node
    assert spec["tolerations"] == [{"operator": "Exists"}]  # every taint the node may carry
    # Only the record's own note of the device for people; nothing a kubelet would read.
    assert pod["metadata"]["annotations"] == {"gpuhealth.io/device": "gpu-node-1/GPU-4a1c"}
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize("kind", ["probe", "canary"])
def test_a_device_plugin_check_can_get_that_device_from_the_nvidia_runtime_instead(kind: str) -> None:
    client = Client()
    checks = job_checks(client, CheckSettings(device_plugin_route="visible-devices"))
    r = record(uuid="GPU-4a1c")
    assert not checks.through_kubelet(r)
    checks.start(r, kind, 1)
    name = f"{r.name}-{kind}-1"
    spec = pod_of(client, name)["spec"]
    container = device_container(spec)
    # No GPU request: the kubelet would hand any free Healthy GPU; the runtime gives the card.
    assert "resources" not in container and "resourceClaims" not in spec
    assert device_env(container) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-4a1c",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    assert spec["nodeName"] == "gpu-node-1"


def test_a_check_the_kubelet_gave_another_card_is_void_and_started_again() -> None:
    client = Client()
    checks = job_checks(client)
    r = record(uuid="GPU-4a1c")
    checks.start(r, "canary", 1)
    name = f"{r.name}-canary-1"
    job = client.objects[(JOB.plural, name)]
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    allocated = [{"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-other", "health": "Healthy"}]}]
    pod = {
        "metadata": {"name": f"{name}-x", "namespace": "gpuhealth-system", "labels": {"job-name": name}},
        "status": {"phase": "Succeeded", "containerStatuses": [{"allocatedResourcesStatus": allocated}]},
    }
    client.objects[("pods", pod["metadata"]["name"])] = pod
    assert checks.result(r, "canary", 1) is CheckResult.ABSENT
    assert (JOB.plural, name) not in client.objects  # deleted: the next start makes it again
    # On the card, its verdict counts.
    checks.start(r, "canary", 1)
    client.objects[(JOB.plural, name)]["status"] = job["status"]
    allocated[0]["resources"][0]["resourceID"] = "GPU-4a1c"
    client.objects[("pods", pod["metadata"]["name"])] = pod
    assert checks.result(r, "canary", 1) is CheckResult.SUCCEEDED


def test_the_runtime_class_is_a_setting() -> None:
    r = record(uuid="GPU-4a1c")
    for runtime_class in ("", "nvidia-cdi"):
        client = Client()
        job_checks(client, CheckSettings(runtime_class=runtime_class)).start(r, "probe", 1)
        spec = pod_of(client, f"{r.name}-probe-1")["spec"]
        assert spec.get("runtimeClassName") == (runtime_class or None)


@pytest.mark.parametrize(("kind", "attempt"), [("probe", 1), ("canary", 2)])
def test_a_dra_check_claims_the_device_by_uuid_and_tolerates_the_taints(kind: str, attempt: int) -> None:
    client = Client()
    checks = job_checks(client)
    r = record(**DRA_LABELS)
    checks.start(r, kind, attempt)
    name = f"{r.name}-{kind}-{attempt}"
    template = client.objects[(CLAIM_TEMPLATE.plural, name)]
    [request] = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["count"]) == ("gpu.nvidia.com", 1)
    assert exactly["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].uuid == "GPU-dra-3"'}}
    ]
    assert sorted((t["key"], t["operator"], t["effect"]) for t in exactly["tolerations"]) == [
        (CANARY_TAINT, "Exists", "NoExecute"),
        (CANARY_TAINT, "Exists", "NoSchedule"),
        (QUARANTINE_TAINT, "Exists", "NoExecute"),
        (QUARANTINE_TAINT, "Exists", "NoSchedule"),
    ]
    pod = pod_of(client, name)["spec"]
    assert pod["resourceClaims"] == [{"name": request["name"], "resourceClaimTemplateName": name}]
    container = device_container(pod)
    assert container["resources"] == {"claims": [{"name": request["name"]}]}
    # The claim is how it gets the device: no node pinning, no runtime variable.
    assert "nodeName" not in pod and "runtimeClassName" not in pod
    assert not device_env(container)
    assert template["metadata"]["ownerReferences"][0]["name"] == r.name
    # Through the scheduler: it still reaches a card of a node escalated by its failing cards.
    assert pod["tolerations"] == [{"key": ESCALATION_TAINT, "operator": "Exists", "effect": "NoSchedule"}]


def test_the_canary_is_a_workload_of_its_own_not_the_probe_again() -> None:
    r = record(uuid="GPU-4a1c")
    client = Client()
    checks = job_checks(client)
    checks.start(r, "probe", 1)
    checks.start(r, "canary", 1)
    probe = device_container(pod_of(client, f"{r.name}-probe-1")["spec"])
    canary = pod_of(client, f"{r.name}-canary-1")["spec"]["containers"][0]
    assert (probe["image"], probe["command"]) == (PROBE.image, list(PROBE.command))
    assert (canary["image"], canary["command"]) == (CANARY.image, list(CANARY.command))
    assert canary["image"] != probe["image"] and canary["command"] != probe["command"]
    assert device_env(canary) == device_env(probe)  # the same device, reached the same way

    configured = CheckSettings(
        canary=CheckSpec("canary", "registry.local/burn:1", ("burn", "--seconds", "30"))
    )
    client = Client()
    checks = job_checks(client, configured)
    checks.start(r, "probe", 1)
    checks.start(r, "canary", 1)
    canary = pod_of(client, f"{r.name}-canary-1")["spec"]["containers"][0]
    assert (canary["name"], canary["image"], canary["command"]) == (
        "canary",
        "registry.local/burn:1",
        ["burn", "--seconds", "30"],
    )
    assert device_container(pod_of(client, f"{r.name}-probe-1")["spec"])["image"] == PROBE.image


def test_every_check_rung_has_a_spec_or_the_settings_are_refused() -> None:
    # Each check rung has its pod: the settings' own spec, else the one the rung declares; the
    # settings hold no spec of a check the ladder does not have.
    shipped = CheckSettings()
    assert {s.name for s in shipped.specs()} <= {r.name for r in LADDER.checks()}
    for rung in LADDER.checks():
        assert shipped.spec(rung.name).name == rung.name
    burn_in = Rung("BurnIn", "burn-in", Kind.CHECK, seconds=600)
    ladder = LADDER.inserted(burn_in, after=LADDER.checks()[-1].phase)
    reconciler = ReconcilerSettings(policy=PolicySettings(ladder=ladder))
    base = {"token": "t", "identity": "i", "prometheus_url": "http://prometheus:9090"}
    with pytest.raises(SettingsError, match="no check spec for the check rung 'burn-in'"):
        ResponderSettings(**base, reconciler=reconciler)
    extra = CheckSpec("burn-in", "registry.local/burn:1", ("burn",))
    settings = ResponderSettings(**base, reconciler=reconciler, checks=CheckSettings(extra=(extra,)))
    assert settings.checks.spec("burn-in") == extra
    with pytest.raises(SettingsError, match=r"CheckSettings\.canary is the spec of check 'probe'"):
        CheckSettings(canary=PROBE)
    with pytest.raises(SettingsError, match="repeat a name"):
        CheckSettings(extra=(CANARY,))
    with pytest.raises(SettingsError, match="command must be a non-empty argv"):
        CheckSpec("canary", "image", ())


def test_job_status_is_a_check_result() -> None:
    client = Client()
    checks = job_checks(client)
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


def test_finishing_a_check_deletes_its_job_in_the_background_and_its_claim_template() -> None:
    deleted: list[tuple[str, str, Any]] = []

    class Recording(Client):
        def delete(self, resource: Resource, name: str, **kwargs: Any) -> dict[str, Any]:
            deleted.append((resource.plural, name, kwargs.get("propagation_policy")))
            return super().delete(resource, name, **kwargs)

    client = Recording()
    checks = job_checks(client)
    r = record(**DRA_LABELS)
    checks.start(r, "probe", 1)
    name = job_name(r, "probe", 1)
    checks.finish(r, "probe", 1)
    # Background: a Job's own default (Orphan) would leave its pods, and their claims, behind.
    assert deleted == [("jobs", name, "Background"), (CLAIM_TEMPLATE.plural, name, None)]
    assert client.objects == {}
    checks.finish(r, "probe", 1)  # again: nothing left, nothing fails


def test_a_check_the_kubelet_refused_at_admission_fails_and_one_that_ran_is_the_card_s() -> None:
    """A pod refused at admission got no GPU at all: the card's plugin excludes it (the node's
    `aside` mark keeps gpuhealth's own fills off the card meanwhile: test_hold_node.py), so the
    check fails at once rather than waiting out its timeout; a pod that ran on the card and
    failed is the card's verdict too."""
    client = Client()
    checks = job_checks(client)
    r = record(uuid="GPU-4a1c")
    checks.start(r, "probe", 1)
    name = f"{r.name}-probe-1"
    failed = {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}
    client.objects[(JOB.plural, name)]["status"] = failed
    refused = {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "Pod was rejected: Allocate failed due to requested number of devices unavailable",
    }
    pod = {
        "metadata": {"name": f"{name}-x", "namespace": "gpuhealth-system", "labels": {"job-name": name}},
        "status": refused,
    }
    client.objects[("pods", pod["metadata"]["name"])] = pod
    assert checks.result(r, "probe", 1) is CheckResult.FAILED
    assert (JOB.plural, name) in client.objects
    # A pod that ran on the card and failed: the card's verdict.
    client.objects[(JOB.plural, name)]["status"] = failed
    allocated = [{"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-4a1c", "health": "Healthy"}]}]
    ran = {"state": {"terminated": {"exitCode": 1}}, "allocatedResourcesStatus": allocated}
    pod["status"] = {"phase": "Failed", "containerStatuses": [ran]}
    client.objects[("pods", pod["metadata"]["name"])] = pod
    assert checks.result(r, "probe", 1) is CheckResult.FAILED
    # And one that ran where the kubelet names no devices (before 1.36): counted as before.
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]}
    assert checks.result(r, "probe", 1) is CheckResult.FAILED
