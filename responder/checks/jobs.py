"""Probe and canary checks of one quarantined device: batch/v1 Jobs (a `CheckRunner`).

An adapter over the API, thin and idempotent: `responder.reconcile.policy` decides when a check of an
attempt starts (`StartCheck`) and reads its result (`CheckResult`); this creates the Job and
reads its status. One Job per record, kind and attempt, named `<record>-<kind>-<attempt>`
(shortened with a hash past 63 characters, the limit of the `job-name` label its pods carry),
so a retry never mistakes an old Job's result for its own, and a second `start` is a no-op
(409 AlreadyExists). Every Job is owned by the record: deleting the record deletes its checks.

How the Job reaches exactly the quarantined device is the record's backend's
(`responder.enforce.backends`, `device_request`): a claim through a ResourceClaimTemplate of the Job's
name on DRA, a pod pinned to the node and the device on device plugins.
Synchronous like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import POD, Resource
from responder.enforce.backends import Backends, DeviceRequest
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import DEVICE_CLASS
from responder.reconcile.policy import CheckResult
from responder.records import Quarantine, owner_reference

JOB = Resource("batch", "v1", "jobs", namespaced=True)
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
    device_class: str = DEVICE_CLASS
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


class JobChecks:
    def __init__(
        self, client: Api, settings: CheckSettings | None = None, backends: Backends | None = None
    ) -> None:
        """`backends`: whose device requests the checks' pods carry (default: the shipped ones)."""
        self._client = client
        self.settings = settings or CheckSettings()
        self._backends = backends or Enforcer(client, None, device_class=self.settings.device_class)

    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        name = job_name(record, kind, attempt)
        ns = self.settings.namespace
        for resource, obj in self._request(record, name).objects:
            with contextlib.suppress(AlreadyExists):  # a previous start got this far
                self._client.create(resource, obj, namespace=ns)
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
        for resource, _ in self._request(record, name).objects:
            with contextlib.suppress(NotFound):
                self._client.delete(resource, name, namespace=ns)

    # ----- the objects --------------------------------------------------------------------------

    def _request(self, record: Quarantine, name: str) -> DeviceRequest:
        return self._backends.of(record).device_request(record, name, self.settings.namespace)

    def job(self, record: Quarantine, kind: str, attempt: int) -> dict[str, Any]:
        name = job_name(record, kind, attempt)
        s = self.settings
        request = self._request(record, name)
        annotations = {"gpuhealth.io/device": f"{record.spec.node}/{record.spec.device}"}
        if s.run_seconds:
            annotations["sim.gpuhealth.io/run-seconds"] = s.run_seconds
        annotations.update(request.annotations)
        container: dict[str, Any] = {"name": kind, "image": s.image, "command": list(s.command)}
        container.update(request.container)
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        pod_spec.update(request.pod)
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
                "ownerReferences": [owner_reference(record)],
            },
            "spec": {
                "backoffLimit": 0,
                "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
            },
        }
