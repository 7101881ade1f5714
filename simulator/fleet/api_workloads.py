"""A scenario's workloads as plain API objects, for a control plane whose controllers run them.

With the simulated control plane the fleet lays out and replaces the scenario's pods itself
(`job_controller`, `scheduler`). When the fleet's nodes are agents of a control plane that the
fleet does not own (`Fleet(..., store=None)`: a real kube-apiserver, or the simulated one over
HTTP), the scenario's workloads are created as what a user would apply: Namespaces, Jobs and
Deployments whose pod templates ask for GPUs (`nvidia.com/gpu` requests on device-plugin nodes
and, for `extendedResource` workloads, on DRA nodes whose DeviceClass maps it; a
ResourceClaimTemplate on DRA nodes otherwise) and a nodeSelector for the workload's device path and
node group. That control plane's controllers make the pods, its scheduler binds them (and
allocates the claims), and the node agents run whatever lands on their nodes (`pod_runner`).

What the simulated pods do is said in the annotations the pod workers read: a Job's
`completeAfter` as `sim.gpuhealth.io/run-seconds`, the checkpoint agent's delay as
`sim.gpuhealth.io/checkpoint-after`.

Where the pods start: a scenario's faults and expectations name devices (`gpu-dra-0`, GPU 3)
on the understanding that its workloads start where the model's first-fit layout puts them
(`simulator.model.place_workloads`), as the simulated scheduler does. A real kube-scheduler
breaks ties between equally good nodes at random, so each pod template says where its
workload was laid out the way a user would: a *preferred* node affinity for those nodes. It
is a preference, never a requirement: a pod that no longer fits there (its device
quarantined) goes wherever the scheduler finds room, as on any cluster. Which GPUs of a
device-plugin node the initial pods get is the node agents' part (`initial_layout`): the layout's,
until the timeline starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from gpuhealth.kube import errors as kube_errors
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import NAMESPACE, Resource
from simulator.fleet import objects
from simulator.model import DEVICE_PLUGIN, DRA, NodeGroup, Scenario, Workload, eligible, place_workloads

RUN_SECONDS = "sim.gpuhealth.io/run-seconds"
CHECKPOINT_AFTER = "sim.gpuhealth.io/checkpoint-after"

JOB: Final = Resource("batch", "v1", "jobs", namespaced=True)
DEPLOYMENT: Final = Resource("apps", "v1", "deployments", namespaced=True)
CLAIM_TEMPLATE: Final = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", namespaced=True)


def workload_path(workload: Workload, groups: Iterable[NodeGroup]) -> str:
    """The device path the workload's pods ask for: its own, or DRA only when every node it may use is DRA."""
    if workload.path is not None:
        return workload.path
    paths = {g.path for g in groups if eligible(workload, g)}
    return DRA if paths == {DRA} else DEVICE_PLUGIN


HOSTNAME: Final = "kubernetes.io/hostname"
LAYOUT_WEIGHT: Final = 100
"""The preference's weight: the most a preferred term can have, so it outweighs the spreading scores."""


def _layout_affinity(nodes: Iterable[str]) -> dict[str, Any]:
    """A preferred node affinity for the nodes the model's layout put a workload's pods on."""
    wanted = sorted(set(nodes))
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": wanted}]}
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": LAYOUT_WEIGHT, "preference": term}]
        }
    }


def _pod_template(workload: Workload, path: str, laid_out_on: Sequence[str] = ()) -> dict[str, Any]:
    template = objects.pod(
        name="template", workload=workload, node_name="", gpus=workload.gpus_per_pod,
        dra=path == DRA and not workload.extended_resource, claim_name=None, job_uid=None,
    )  # fmt: skip
    meta, spec = template["metadata"], template["spec"]
    spec.pop("nodeName", None)
    if workload.kind == "Job":
        spec["restartPolicy"] = "Never"
    selector = {"gpuhealth.io/device-path": path}
    if workload.node_group is not None:
        selector["gpuhealth.io/node-group"] = workload.node_group
    spec["nodeSelector"] = selector
    if laid_out_on:
        spec["affinity"] = _layout_affinity(laid_out_on)
    annotations = meta["annotations"]
    if workload.complete_after is not None:
        annotations[RUN_SECONDS] = f"{workload.complete_after:g}s"
    if workload.checkpoint == "annotation":
        if workload.checkpoint_fails:
            annotations[CHECKPOINT_AFTER] = "fail"
        elif workload.checkpoint_after is None:
            annotations[CHECKPOINT_AFTER] = "never"
        else:
            annotations[CHECKPOINT_AFTER] = f"{workload.checkpoint_after:g}s"
    labels = {k: v for k, v in meta["labels"].items() if k not in ("pod-template-hash", "job-name")}
    labels.pop("batch.kubernetes.io/job-name", None)  # the Job controller sets its own
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def workload_objects(scenario: Scenario) -> list[tuple[Resource, dict[str, Any]]]:
    """What to create, in order: namespaces, claim templates, then the Jobs and Deployments."""
    out: list[tuple[Resource, dict[str, Any]]] = []
    for ns in sorted({w.namespace for w in scenario.workloads} - {"default"}):
        out.append((NAMESPACE, objects.namespace(ns)))
    layout: dict[int, list[str]] = {}
    for placement in place_workloads(scenario):
        layout.setdefault(placement.workload, []).append(placement.node)
    for index, workload in enumerate(scenario.workloads):
        path = workload_path(workload, scenario.fleet)
        template = _pod_template(workload, path, layout.get(index, ()))
        if path == DRA and not workload.extended_resource:
            out.append((CLAIM_TEMPLATE, objects.resource_claim_template(workload)))
        meta = {"name": workload.name, "namespace": workload.namespace, "labels": {"app": workload.name}}
        if workload.kind == "Job":
            spec: dict[str, Any] = {
                "completions": workload.replicas,
                "parallelism": workload.replicas,
                "backoffLimit": 6,
                # A move evicts a pod (DisruptionTarget): replaced, never counted as the job's
                # failure (docs/workloads.md, "Jobs").
                "podFailurePolicy": {
                    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
                },
                "template": template,
            }
            out.append((JOB, {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}))
        else:
            spec = {
                "replicas": workload.replicas,
                "selector": {"matchLabels": {"app": workload.name, objects.WORKLOAD_LABEL: workload.name}},
                "template": template,
            }
            out.append(
                (DEPLOYMENT, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec})
            )
    return out


def create_workloads(client: KubeClient, scenario: Scenario) -> list[dict[str, Any]]:
    """Create the scenario's workloads (an object already there is left as it is); returns what exists."""
    created = []
    for resource, obj in workload_objects(scenario):
        try:
            created.append(client.create(resource, obj))
        except kube_errors.AlreadyExists:
            meta = obj["metadata"]
            created.append(client.get(resource, meta["name"], namespace=meta.get("namespace")))
    return created
