"""Probe and canary checks of one quarantined device: batch/v1 Jobs (a `CheckRunner`).

An adapter over the API, thin and idempotent: `responder.reconcile.policy` decides when a check of an
attempt starts (`StartCheck`) and reads its result (`CheckResult`); this creates the Job and
reads its status. One Job per record, kind and attempt, named `<record>-<kind>-<attempt>`
(shortened with a hash past 63 characters, the limit of the `job-name` label its pods carry),
so a retry never mistakes an old Job's result for its own, and a second `start` is a no-op
(409 AlreadyExists). Every Job is owned by the record: deleting the record deletes its checks.

What a check's pod runs is its `CheckSpec`, looked up by the check rung's name
(`responder.ladder`): the probe is DCGM's diagnostic, the canary a separate small CUDA workload
run after the probe passed, each with its own image and command. A check rung added to the
ladder brings its spec (`CheckSettings.extra`). The probe's pod has two containers, the
diagnostic with a hostengine and a judge of its report (`responder.checks.probe_pod`); every
other check is one container whose exit status is its result.

How the Job reaches exactly the quarantined device is the record's backend's
(`responder.enforce.backends`, `device_request`): on DRA a claim through a ResourceClaimTemplate
of the Job's name that selects the device by uuid; on device plugins a pod with no GPU request,
pinned to the node, that the NVIDIA container runtime gives that one GPU
(`NVIDIA_VISIBLE_DEVICES=<uuid>`), so no other card can answer for it.
Synchronous like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth import yaml_keys
from gpuhealth.fields import SettingsError
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import POD, Resource
from responder.checks.probe_pod import DIAG_COMMAND, DiagSettings, diag_pod
from responder.enforce.backends import Backends, DeviceRequest
from responder.enforce.hold import device_ids
from responder.enforce.hold_plan import Card
from responder.enforce.node_annotation import CHECK_ROUTES, KUBELET, node_reader, through_kubelet
from responder.enforce.taint_rules import DEVICE_CLASS
from responder.ladder import CANARY as CANARY_PHASE
from responder.ladder import KNOWN, LADDER, Rung
from responder.reconcile.escalation import TAINT_KEY as ESCALATION_TAINT
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
class CheckSpec:
    """What the pod of one check rung runs: the rung's executor, found by the rung's name."""

    name: str
    """The check rung's name (`responder.ladder.Rung.name`)."""
    image: str
    command: tuple[str, ...]
    diag: DiagSettings | None = None
    """Set for DCGM's diagnostic: `image` and `command` are the diagnostic's container's, and a
    judge container decides from its report (`probe_pod`). None: one container, its exit status
    the result."""

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise SettingsError(f"check {self.name}: image must not be empty")
        if not self.command or not all(self.command):
            raise SettingsError(f"check {self.name}: command must be a non-empty argv")


PROBE = CheckSpec(
    "probe", "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", DIAG_COMMAND, DiagSettings()
)
"""DCGM's diagnostic, level 2 (about two minutes): memory, PCIe and a short stress, enough to
catch what quarantines. It judges the device as NVML and DCGM see it, from its JSON report
(`responder.checks.diag`), with a hostengine the pod starts or is told of (`probe_pod`)."""

_canary = LADDER.rung(CANARY_PHASE)
assert _canary is not None


def declared(rung: Rung) -> CheckSpec:
    """The spec a check rung declares (`Rung.image`, `Rung.command`)."""
    return CheckSpec(rung.name, rung.image, rung.command)


CANARY = declared(_canary)
"""The canary rung's pod as the ladder declares it: a short CUDA workload (`gpuhealth.ladder`)."""


@dataclass(frozen=True, slots=True)
class CheckSettings:
    namespace: str = field(
        default="gpuhealth-system", metadata=yaml_keys.key("checks.namespace", yaml_keys.text)
    )
    """Where check Jobs (and their claim templates) live: the responder's namespace."""
    probe: CheckSpec = field(
        default=PROBE, metadata=yaml_keys.inner(image=("checks.probe_image", yaml_keys.text))
    )
    """The probe rung's pod: the diagnostic."""
    canary: CheckSpec = field(
        default=CANARY,
        metadata=yaml_keys.inner(
            image=("checks.canary_image", yaml_keys.text), command=("checks.canary_command", yaml_keys.argv)
        ),
    )
    """The canary rung's pod, run after the probe passed: a short compute and memory workload."""
    extra: tuple[CheckSpec, ...] = ()
    """The specs of check rungs beyond the shipped ladder (`Ladder.inserted`), by their names."""
    runtime_class: str = field(
        default="nvidia",
        metadata=yaml_keys.key(
            "checks.runtime_class",
            yaml_keys.object_name("a RuntimeClass name, or empty for the node's default runtime"),
        ),
    )
    """Device plugins: the RuntimeClass of a check's pod, the NVIDIA container runtime that reads
    `NVIDIA_VISIBLE_DEVICES` (the GPU operator creates `nvidia`; the exporter's DaemonSet uses it
    too). Empty: no runtimeClassName, for nodes whose default runtime is NVIDIA's."""
    device_plugin_route: str = field(
        default=KUBELET, metadata=yaml_keys.key("checks.device_plugin_route", yaml_keys.choice(CHECK_ROUTES))
    )
    """Device plugins: how a check's pod gets the card. `kubelet`: one `nvidia.com/gpu` the kubelet
    allocates while the card's hold steps aside (the node's other free GPUs held), so it can only
    be the card, read back before the result counts. `visible-devices`: no GPU request, the NVIDIA
    runtime gives the card named in `NVIDIA_VISIBLE_DEVICES` (only where the container toolkit
    accepts the variable from unprivileged containers; MIG cards always take this route)."""
    device_class: str = DEVICE_CLASS
    """DeviceClass of the DRA driver's GPUs (NVIDIA's DRA driver names its class so)."""

    def __post_init__(self) -> None:
        for name, spec in (("probe", self.probe), ("canary", self.canary)):
            if spec.name != name:
                raise SettingsError(f"CheckSettings.{name} is the spec of check {spec.name!r}")
        names = [s.name for s in self.specs()]
        if len(set(names)) != len(names):
            raise SettingsError(f"check specs repeat a name: {names}")

    def specs(self) -> tuple[CheckSpec, ...]:
        return (self.probe, self.canary, *self.extra)

    def spec(self, kind: str) -> CheckSpec:
        """The spec of the check rung named `kind`: these settings' own, else what the rung of a
        shipped ladder declares (`gpuhealth.ladder.KNOWN`); SettingsError when neither has one."""
        for spec in self.specs():
            if spec.name == kind:
                return spec
        rung = next((r for r in KNOWN.checks() if r.name == kind and r.image), None)
        if rung is not None:
            return declared(rung)
        raise SettingsError(f"no check spec for the check rung {kind!r} (CheckSettings.extra)")


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
    def __init__(self, client: Api, backends: Backends, settings: CheckSettings | None = None) -> None:
        """`backends`: the responder's backends, whose device requests the checks' pods carry
        (built once, from these settings' routes: `responder.service`)."""
        self._client = client
        self._backends = backends
        self.settings = settings or CheckSettings()

    def start(self, record: Quarantine, kind: str, attempt: int) -> None:
        name = job_name(record, kind, attempt)
        ns = self.settings.namespace
        for resource, obj in self._request(record, name).objects:
            with contextlib.suppress(AlreadyExists):  # a previous start got this far
                self._client.create(resource, obj, namespace=ns)
        with contextlib.suppress(AlreadyExists):
            self._client.create(JOB, self.job(record, kind, attempt), namespace=ns)

    def result(self, record: Quarantine, kind: str, attempt: int) -> CheckResult:
        name = job_name(record, kind, attempt)
        try:
            job = self._client.get(JOB, name, namespace=self.settings.namespace)
        except NotFound:
            return CheckResult.ABSENT
        if self._void(record, name):
            # The kubelet gave the check another card (a GPU freed between the hold stepping
            # aside and the pod's admission): its verdict is not the card's. Start it again.
            self.finish(record, kind, attempt)
            return CheckResult.ABSENT
        return job_result(job)

    def through_kubelet(self, record: Quarantine) -> bool:
        """Whether the record's checks get its card from the kubelet (the hold steps aside)."""
        route = self.settings.device_plugin_route
        return through_kubelet(route, record, node_reader(self._client, record))

    def _void(self, record: Quarantine, name: str) -> bool:
        """Whether a pod of the check, on the kubelet's route, says nothing about the card: it
        was allocated a device that is not the card's (a MIG card's check asks for every
        partition, so all it got must be the card's). It did not reach the card, so the check is
        run again in the same attempt, no failure counted. A check refused at admission (no
        device at all) is the plugin's word: the card is excluded, the check fails. The node's
        `aside` mark keeps gpuhealth's own fills off the card from the step aside to the check's
        admission (release-request at 10x: another card's fill took it in between, before the
        mark was written from the step aside's first pass)."""
        if not self.through_kubelet(record):
            return False
        card = Card(record.spec.uuid or record.spec.device, record.spec.partitions)
        ns = self.settings.namespace
        for pod in self._client.list(POD, namespace=ns, label_selector=f"job-name={name}").items:
            got = device_ids(pod)
            if got and not all(card.owns(d) for d in got):
                return True
        return False

    def finish(self, record: Quarantine, kind: str, attempt: int) -> None:
        # A finished check's pod still names its claim, and the simulated cluster (unlike the
        # resourceclaim controller) keeps such a claim allocated: the next check could not get
        # the device. Deleting the Job (its pods and their claims go with it) frees it either way.
        # Background, said in so many words: a batch/v1 Job deleted without a policy orphans its
        # pods, and an orphaned pod keeps its claim, and with it the device the next check needs.
        name, ns = job_name(record, kind, attempt), self.settings.namespace
        with contextlib.suppress(NotFound):
            self._client.delete(JOB, name, namespace=ns, propagation_policy="Background")
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
        check = s.spec(kind)
        annotations = {"gpuhealth.io/device": f"{record.spec.node}/{record.spec.device}"}
        annotations.update(request.annotations)
        pod_spec: dict[str, Any]
        if check.diag is not None:
            pod_spec = diag_pod(
                check.image, check.command, kind, check.diag, _uuid(record), dict(request.container)
            )
        else:
            container: dict[str, Any] = {"name": kind, "image": check.image, "command": list(check.command)}
            container.update(request.container)
            pod_spec = {"restartPolicy": "Never", "containers": [container]}
        pod_spec.update(request.pod)
        # A check of a card on an escalated node must still reach it: the node's taint keeps
        # tenants' new work off, never gpuhealth's own checks (device plugins tolerate all already).
        escalated = {"key": ESCALATION_TAINT, "operator": "Exists", "effect": "NoSchedule"}
        tolerations = list(pod_spec.get("tolerations") or ())
        if not any(t.get("operator") == "Exists" and not t.get("key") for t in tolerations):
            pod_spec["tolerations"] = [*tolerations, escalated]
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


def _uuid(record: Quarantine) -> str:
    """The card's GPU UUID for `dcgmi diag -i`, where the record knows it (a device-plugin
    record's device is its UUID; a DRA record's is driver/pool/device, its uuid a field)."""
    device = record.spec.device
    return record.spec.uuid or (device if device.startswith("GPU-") else "")
