"""The scenario's initial layout as a fixture beside a control plane the fleet does not own
(`simulator.fleet.initial_layout`).

Aspects: a pod is one of a scenario workload's only when its namespace, workload label and
controller (the Job of that name; the ReplicaSet `<name>-<pod-template-hash>` of a Deployment)
all say so, never from a label alone; a workload's pods on a node take the layout's slot sets of
that workload on that node in the layout's order, each at most once, only when every device of
the set is usable (free and Healthy) and the pod asks for the workload's GPU count; nothing is
handed out once the timeline has started, nor on DRA nodes, nor to any other pod.
"""

from __future__ import annotations

from typing import Any

from simulator.fleet.initial_layout import InitialLayout, scenario_workload
from simulator.fleet.objects import WORKLOAD_LABEL
from simulator.model import Slot
from simulator.scenario import from_dict

SCENARIO = from_dict(
    {
        "fleet": [
            {"name": "dp", "count": 1, "gpusPerNode": 8, "path": "device-plugin"},
            {"name": "dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
        ],
        "workloads": [
            {"name": "serve", "namespace": "inference", "replicas": 2, "gpusPerPod": 2,
             "path": "device-plugin"},
            {"name": "train", "namespace": "research", "kind": "Job", "replicas": 2, "gpusPerPod": 1,
             "path": "device-plugin"},
            {"name": "serve-dra", "namespace": "inference", "replicas": 1, "gpusPerPod": 1, "path": "dra"},
        ],
    }
)  # fmt: skip
EVERY = [Slot(g) for g in range(8)]


def deployment_pod(
    name: str = "serve", namespace: str = "inference", pod_hash: str = "5d8f7c"
) -> dict[str, Any]:
    """A pod as the Deployment controller makes it: owned by its ReplicaSet, labelled with its hash."""
    return {
        "metadata": {
            "name": f"{name}-{pod_hash}-x7k2q",
            "namespace": namespace,
            "labels": {"app": name, WORKLOAD_LABEL: name, "pod-template-hash": pod_hash},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{name}-{pod_hash}",
                    "controller": True,
                }
            ],
        }
    }


def job_pod(name: str = "train", namespace: str = "research") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{name}-abcde",
            "namespace": namespace,
            "labels": {WORKLOAD_LABEL: name, "job-name": name},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "controller": True}],
        }
    }


def layout(started: list[bool] | None = None) -> InitialLayout:
    flag = started if started is not None else [False]
    return InitialLayout(SCENARIO, lambda: flag[0])


def test_a_workload_pod_is_known_by_namespace_label_and_controller() -> None:
    workloads = SCENARIO.workloads
    assert scenario_workload(workloads, deployment_pod()) == 0
    assert scenario_workload(workloads, job_pod()) == 1
    assert scenario_workload(workloads, deployment_pod("serve-dra")) == 2


def test_a_look_alike_is_no_workload_pod() -> None:
    workloads = SCENARIO.workloads
    other_namespace = deployment_pod(namespace="default")
    assert scenario_workload(workloads, other_namespace) is None
    no_owner = deployment_pod()
    del no_owner["metadata"]["ownerReferences"]
    assert scenario_workload(workloads, no_owner) is None  # a client's pod with the label
    not_controller = deployment_pod()
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert scenario_workload(workloads, not_controller) is None
    other_set = deployment_pod()
    other_set["metadata"]["ownerReferences"][0]["name"] = "serve-other"
    assert scenario_workload(workloads, other_set) is None  # the hash label and the set disagree
    job_as_deployment = job_pod("serve", "inference")
    assert scenario_workload(workloads, job_as_deployment) is None  # serve is a Deployment
    unlabelled = job_pod()
    unlabelled["metadata"]["labels"] = {"job-name": "train"}
    assert scenario_workload(workloads, unlabelled) is None


def test_a_workloads_pods_take_its_slot_sets_on_the_node_in_order_once_each() -> None:
    initial = layout()
    # First fit: serve's two pods on GPUs 0-1 and 2-3, then train's on 4 and 5.
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) == (Slot(0), Slot(1))
    assert initial.claim("dp-0", job_pod(), 1, EVERY) == (Slot(4),)
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) == (Slot(2), Slot(3))
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) is None  # a third pod: the device manager's
    assert initial.claim("dp-0", job_pod(), 1, EVERY) == (Slot(5),)
    assert initial.unclaimed() == []


def test_only_a_usable_set_is_given_and_the_next_one_is_tried() -> None:
    initial = layout()
    busy = [s for s in EVERY if s.gpu != 1]  # GPU 1 taken by another pod, or reported Unhealthy
    assert initial.claim("dp-0", deployment_pod(), 2, busy) == (Slot(2), Slot(3))
    assert initial.claim("dp-0", deployment_pod(), 2, busy) is None
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) == (Slot(0), Slot(1))  # freed since


def test_nothing_for_another_count_another_node_dra_or_another_pod() -> None:
    initial = layout()
    assert initial.claim("dp-0", deployment_pod(), 1, EVERY) is None  # not the workload's GPU count
    assert initial.claim("dp-1", deployment_pod(), 2, EVERY) is None  # the layout put none there
    assert initial.claim("dra-0", deployment_pod("serve-dra"), 1, EVERY) is None  # the scheduler allocates
    assert {(p.workload, p.node) for p in initial.unclaimed()} == {(0, "dp-0"), (1, "dp-0")}
    client = {"metadata": {"name": "x", "namespace": "inference", "labels": {WORKLOAD_LABEL: "serve"}}}
    assert initial.claim("dp-0", client, 2, EVERY) is None


def test_nothing_once_the_timeline_has_started() -> None:
    started = [False]
    initial = layout(started)
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) == (Slot(0), Slot(1))
    started[0] = True
    assert initial.claim("dp-0", deployment_pod(), 2, EVERY) is None
    assert initial.claim("dp-0", job_pod(), 1, EVERY) is None
    assert len(initial.unclaimed()) == 3  # still unclaimed, never to be handed out
