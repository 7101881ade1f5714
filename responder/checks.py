"""Probe and canary checks of one quarantined device: batch/v1 Jobs (a `CheckRunner`).

An adapter over the API, thin and idempotent: `responder.policy` decides when a check of an
attempt starts (`StartCheck`) and reads its result (`CheckResult`); this creates the Job and
reads its status. One Job per record, kind and attempt, named `<record>-<kind>-<attempt>`
(shortened with a hash past 63 characters, the limit of the `job-name` label its pods carry),
so a retry never mistakes an old Job's result for its own, and a second `start` is a no-op
(409 AlreadyExists). Every Job is owned by the record: deleting the record deletes its checks.

How the Job reaches exactly the quarantined device:
- DRA: a ResourceClaimTemplate of the same name, whose one request selects the device by its
  `uuid` attribute (CEL) and tolerates the quarantine and canary taints (the DeviceTaintRule
  keeps every other claim off it). This is what a real cluster runs too.
- Device plugin: the pod is pinned to the node with `spec.nodeName` and names the device in
  the annotation `gpuhealth.io/probe-device: <uuid>`. That annotation is a **simulation
  affordance**: the simulated kubelet allocates that device to the pod; a real kubelet cannot be
  told which device to allocate. On a real cluster the probe runs as a privileged pod on the
  node (no `nvidia.com/gpu` request) that runs the diagnostic against the device by UUID
  (`dcgmi diag -i <uuid>`), or the device plugin offers the quarantined device only to pods
  that tolerate the quarantine; that is deployment work outside this module.
Synchronous like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import POD, Resource
from responder.policy import CANARY_TAINT, QUARANTINE_TAINT, CheckResult
from responder.records import API_VERSION, DRA, KIND, Quarantine

JOB = Resource("batch", "v1", "jobs", namespaced=True)
CLAIM_TEMPLATE = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True)
PROBE_DEVICE = "gpuhealth.io/probe-device"
"""Pod annotation the simulated kubelet honours: allocate this device (uuid) to the pod."""
CLAIM = "gpu"
MAX_JOB_NAME = 63


class CheckRunner(Protocol):
    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        """Create the `kind` check of `attempt` for the record's device (a no-op if it exists)."""
        ...

    def result(self, record: Quarantine, kind: str, attempt: int) -> CheckResult:
        """What the check of `attempt` came to so far (Absent when it was never created)."""
        ...

    def finish(self, record: Quarantine, kind: str, attempt: int) -> None:
        """Remove the check of `attempt` once the record has moved on (a no-op if gone)."""
        ...


@dataclass(frozen=True, slots=True)
class CheckSettings:
    namespace: str = "gpuhealth-system"
    """Where check Jobs (and their claim templates) live: the responder's namespace."""
    image: str = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    """The diagnostic's image (DCGM ships `dcgmi`)."""
    command: tuple[str, ...] = ("dcgmi", "diag", "-r", "2")
    """Level 2 (about two minutes): memory, PCIe and a short stress, enough to catch what quarantines."""
    device_class: str = "gpu.nvidia.com"
    """DeviceClass of the DRA driver's GPUs (NVIDIA's DRA driver names its class so)."""
    run_seconds: str = ""
    """Simulation only: `sim.gpuhealth.io/run-seconds` on the pod (empty: the simulator's default)."""


def job_name(record: Quarantine, kind: str, attempt: int) -> str:
    """`<record>-<kind>-<attempt>`, shortened with a hash of the record's name past 63 characters."""
    suffix = f"-{kind}-{attempt}"
    name = f"{record.name}{suffix}"
    if len(name) <= MAX_JOB_NAME:
        return name
    digest = hashlib.sha256(record.name.encode()).hexdigest()[:10]
    room = MAX_JOB_NAME - len(suffix) - len(digest) - 1
    return f"{record.name[:room].rstrip('-.')}-{digest}{suffix}"


def job_result(job: dict[str, Any]) -> CheckResult:
    """A Job's status as a check result (pure): conditions first, then the pod counts."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or ():
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return CheckResult.SUCCEEDED
        if condition.get("type") in ("Failed", "FailureTarget"):
            return CheckResult.FAILED
    if (status.get("succeeded") or 0) > 0:
        return CheckResult.SUCCEEDED
    if (status.get("failed") or 0) > 0:
        return CheckResult.FAILED  # backoffLimit 0: one failed pod fails the check
    return CheckResult.RUNNING


class Client(Protocol):
    def get(self, resource: Resource, name: str, *, namespace: str | None = ...) -> dict[str, Any]: ...

    def list(
        self, resource: Resource, *, namespace: str | None = ..., label_selector: str | None = ...
    ) -> Any: ...

    def create(
        self, resource: Resource, obj: dict[str, Any], *, namespace: str | None = ...
    ) -> dict[str, Any]: ...

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = ...,
        uid: str | None = ...,
        resource_version: str | None = ...,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = ...,
    ) -> dict[str, Any]: ...


class JobChecks:
    def __init__(self, client: Client, settings: CheckSettings | None = None) -> None:
        self._client = client
        self.settings = settings or CheckSettings()

    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        name = job_name(record, kind, attempt)
        ns = self.settings.namespace
        if record.spec.path == DRA:
            with contextlib.suppress(AlreadyExists):  # a previous start got this far
                self._client.create(CLAIM_TEMPLATE, self.claim_template(record, name), namespace=ns)
        with contextlib.suppress(AlreadyExists):
            self._client.create(JOB, self.job(record, kind, attempt), namespace=ns)

    def result(self, record: Quarantine, kind: str, attempt: int) -> CheckResult:
        try:
            job = self._client.get(JOB, job_name(record, kind, attempt), namespace=self.settings.namespace)
        except NotFound:
            return CheckResult.ABSENT
        return job_result(job)

    def finish(self, record: Quarantine, kind: str, attempt: int) -> None:
        # A finished check's pod still names its claim, and the simulated cluster (unlike the
        # resourceclaim controller) keeps such a claim allocated: the next check could not get
        # the device. Deleting the Job (its pods and their claims go with it) frees it either way.
        name, ns = job_name(record, kind, attempt), self.settings.namespace
        with contextlib.suppress(NotFound):
            self._client.delete(JOB, name, namespace=ns, propagation_policy="Background")
        # And its pods by name, not only through the garbage collector: a pod the deletion left
        # orphaned (found by `gpuhealth chaos` seed 3: the probe's pod outlived its Job with no
        # ownerReferences) keeps its claim, and with it the device the canary needs.
        for pod in self._client.list(POD, namespace=ns, label_selector=f"job-name={name}").items:
            with contextlib.suppress(NotFound):
                self._client.delete(POD, str((pod.get("metadata") or {}).get("name")), namespace=ns)
        if record.spec.path == DRA:
            with contextlib.suppress(NotFound):
                self._client.delete(CLAIM_TEMPLATE, name, namespace=ns)

    # ----- the objects --------------------------------------------------------------------------

    def job(self, record: Quarantine, kind: str, attempt: int) -> dict[str, Any]:
        name = job_name(record, kind, attempt)
        s = self.settings
        annotations = {"gpuhealth.io/device": f"{record.spec.node}/{record.spec.device}"}
        if s.run_seconds:
            annotations["sim.gpuhealth.io/run-seconds"] = s.run_seconds
        container: dict[str, Any] = {"name": kind, "image": s.image, "command": list(s.command)}
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        if record.spec.path == DRA:
            container["resources"] = {"claims": [{"name": CLAIM}]}
            pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": name}]
        else:
            annotations[PROBE_DEVICE] = record.spec.uuid or record.spec.device
            pod_spec["nodeName"] = record.spec.node
            container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
            pod_spec["tolerations"] = [{"operator": "Exists"}]  # whatever taints the node carries
        labels = {
            "app.kubernetes.io/managed-by": "gpuhealth",
            "gpuhealth.io/check": kind,
            "gpuhealth.io/record": record.name[:63].rstrip("-."),
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": s.namespace,
                "labels": labels,
                "annotations": {"gpuhealth.io/attempt": str(attempt)},
                "ownerReferences": [_owner(record)],
            },
            "spec": {
                "backoffLimit": 0,
                "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
            },
        }

    def claim_template(self, record: Quarantine, name: str) -> dict[str, Any]:
        uuid = record.spec.uuid
        if not uuid:
            raise ValueError(
                f"{record.name}: a DRA record without spec.uuid cannot pin a check to its device"
            )
        domain = record.spec.driver or self.settings.device_class
        tolerations = [
            {"key": key, "operator": "Exists", "effect": effect}
            for key in (QUARANTINE_TAINT, CANARY_TAINT)
            for effect in ("NoSchedule", "NoExecute")
        ]
        request = {
            "deviceClassName": self.settings.device_class,
            "count": 1,
            "selectors": [{"cel": {"expression": f'device.attributes["{domain}"].uuid == "{uuid}"'}}],
            "tolerations": tolerations,
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name,
                "namespace": self.settings.namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpuhealth"},
                "ownerReferences": [_owner(record)],
            },
            "spec": {"spec": {"devices": {"requests": [{"name": CLAIM, "exactly": request}]}}},
        }


def _owner(record: Quarantine) -> dict[str, Any]:
    if not record.uid:
        raise ValueError(f"{record.name}: the record has no uid to own its checks")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": record.name,
        "uid": record.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }
