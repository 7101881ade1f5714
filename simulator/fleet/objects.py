"""Kubernetes object shapes the simulated fleet writes: pure builders over plain data.

Every function here returns a dict shaped exactly as the API server would store it
(Node, Lease, Namespace, Pod, Job, ResourceSlice, ResourceClaim). No store, no clock:
times come in as wall-clock seconds and are formatted here. A sample of each kind is
validated against the Kubernetes OpenAPI schemas in the tests.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from gpuhealth.kube.meta import rfc3339
from gpuhealth.plugin_resources import GPU_RESOURCE
from simulator.apiserver.store import format_timestamp
from simulator.model import DRA_DRIVER, NodeGroup, Slot, Workload

KUBELET_VERSION = "v1.36.0"

# The alphabet Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

CHECKPOINT_ANNOTATION = "gpuhealth.io/checkpoint"
SERVING_CONDITION = "gpuhealth.io/serving"
"""The readiness gate a workload may declare (`docs/workloads.md`): a condition the kubelet
knows nothing of, which it reads into the pod's Ready condition."""
KUBELET_CONDITIONS = frozenset(
    ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
)
"""Pod condition types the kubelet writes; every other (a readiness gate's, DisruptionTarget)
is someone else's and kept as it is when the kubelet writes the pod's status."""
TOPOLOGY_ANNOTATION = "gpuhealth.io/topology"
WORKLOAD_LABEL = "gpuhealth.io/workload"
CANARY_OPT_IN = "gpuhealth.io/canary-ok"
"""The label a workload opting in to ramping devices puts on its pods (what a user writes, from
`docs/workloads.md`; the simulator imports nothing of the responder)."""
CANARY_TAINT = "gpuhealth.io/canary"
"""The taint of a DRA device on the ramp, which an opted-in claim request tolerates."""
MANAGED_BY_FLEET = "simulator.gpuhealth.io/managed-by-fleet"
"""Annotation ("true") on a scenario workload's Deployment, ReplicaSet and Job: the fleet places and
replaces their pods; the API controllers keep only their status (`workloads.py`)."""


def micro_time(wall: float) -> str:
    """metav1.MicroTime: microsecond precision (Lease renewTime, acquireTime)."""
    return rfc3339(wall)


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU UUID for (node, index), shaped like NVML's `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`."""
    h = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def stable_uid(*parts: str) -> str:
    """A UUID-shaped uid for objects the simulator refers to but does not store (ReplicaSets)."""
    h = hashlib.sha1("/".join(parts).encode()).hexdigest()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def suffix(rng: random.Random, length: int = 5) -> str:
    return "".join(rng.choice(_SUFFIX_ALPHABET) for _ in range(length))


def hash_suffix(text: str, length: int = 10) -> str:
    """A deterministic pod-template-hash-like suffix."""
    digest = hashlib.sha1(text.encode()).digest()
    return "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:length])


def device_id(uuid: str, replica: int | None) -> str:
    """Device-plugin device ID: the UUID, `<uuid>::<n>` for a time-slicing replica."""
    return uuid if replica is None else f"{uuid}::{replica}"


def cdi_id(claim_uid: str, device: str) -> str:
    """DRA resourceID as the NVIDIA driver's CDI device name."""
    return f"k8s.{DRA_DRIVER}/claim={claim_uid}-{device}"


def node_ip(index: int) -> str:
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"


def namespace(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def gpu_capacity(group: NodeGroup, healthy: int) -> tuple[str, str]:
    """(capacity, allocatable) of the GPU resource (`NodeGroup.resource`) of a device-plugin node."""
    per_gpu = group.slots_per_gpu
    return str(group.gpus_per_node * per_gpu), str(healthy * per_gpu)


def _label_value(text: str) -> str:
    value = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:63]
    return value.strip("-_.") or "unknown"


def node(name: str, index: int, group: NodeGroup, wall: float) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.product": _label_value(group.product),
        "nvidia.com/gpu.count": str(group.gpus_per_node),
        # GPU feature discovery's sharing labels (the GPU operator runs it beside the plugin).
        "nvidia.com/gpu.replicas": str(group.shared_replicas or 1),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if group.shared_replicas else "none",
        # GPU feature discovery's: how the device plugin advertises MIG partitions.
        "nvidia.com/mig.strategy": group.mig.strategy if group.mig is not None else "none",
        "gpuhealth.io/device-path": group.path,
        "gpuhealth.io/node-group": group.name,
        **group.labels,
    }
    capacity = {"cpu": "192", "memory": "2113460Mi", "pods": "110", "ephemeral-storage": "3750Gi"}
    allocatable = {"cpu": "191500m", "memory": "2100000Mi", "pods": "110", "ephemeral-storage": "3500Gi"}
    if group.path == "device-plugin":
        capacity[group.resource], allocatable[group.resource] = gpu_capacity(group, group.gpus_per_node)
    ts = format_timestamp(wall)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": f"sim://{group.name}/{name}", "podCIDR": f"10.244.{index & 255}.0/24"},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                _node_condition("MemoryPressure", "False", "KubeletHasSufficientMemory", ts),
                _node_condition("DiskPressure", "False", "KubeletHasNoDiskPressure", ts),
                _node_condition("PIDPressure", "False", "KubeletHasSufficientPID", ts),
                ready_condition("True", ts),
            ],
            "addresses": [
                {"type": "InternalIP", "address": node_ip(index)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": stable_uid(name, "boot"),
                "containerRuntimeVersion": "containerd://2.1.0",
                "kernelVersion": "6.8.0-gpuhealth-sim",
                "kubeProxyVersion": "",
                "kubeletVersion": KUBELET_VERSION,
                "machineID": stable_uid(name, "machine").replace("-", ""),
                "operatingSystem": "linux",
                "osImage": "Simulated Linux (gpuhealth)",
                "systemUUID": stable_uid(name, "system"),
            },
        },
    }


def _node_condition(ctype: str, status: str, reason: str, ts: str, message: str = "") -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message or reason,
        "lastHeartbeatTime": ts,
        "lastTransitionTime": ts,
    }


def ready_condition(status: str, ts: str) -> dict[str, Any]:
    if status == "True":
        return _node_condition("Ready", "True", "KubeletReady", ts, "kubelet is posting ready status")
    return _node_condition(
        "Ready", "Unknown", "NodeStatusUnknown", ts, "Kubelet stopped posting node status."
    )


def lease(name: str, wall: float, duration_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_time(wall),
        },
    }


def resource_slice(
    name: str,
    node_name: str,
    group: NodeGroup,
    uuids: list[str],
    taints: list[list[dict[str, Any]]],
    generation: int,
) -> dict[str, Any]:
    """The DRA driver's ResourceSlice for one node (resource.k8s.io/v1, one pool per node)."""
    devices = []
    for index, uuid in enumerate(uuids):
        device: dict[str, Any] = {
            "name": f"gpu-{index}",
            "attributes": {
                "uuid": {"string": uuid},
                "index": {"int": index},
                "productName": {"string": group.product},
                "type": {"string": "gpu"},
            },
            "capacity": {"memory": {"value": group.memory}},
        }
        if taints[index]:
            device["taints"] = taints[index]
        devices.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def pod_name(workload: Workload, ordinal: int, rng: random.Random) -> str:
    if workload.kind == "Deployment":
        return f"{workload.name}-{hash_suffix(workload.namespace + '/' + workload.name)}-{suffix(rng)}"
    return f"{workload.name}-{ordinal}-{suffix(rng)}"


def owner_reference(workload: Workload, job_uid: str | None) -> dict[str, Any]:
    if workload.kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": workload.name,
            "uid": job_uid or stable_uid(workload.namespace, workload.name, "job"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    # The ReplicaSet the fleet creates for the workload (`replica_set`); its uid comes from the store.
    rs = replica_set_name(workload)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": rs,
        "uid": job_uid or stable_uid(workload.namespace, rs, "replicaset"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def claim_reference(workload: Workload) -> dict[str, str]:
    """The main container's `resources.claims[]` entry of a DRA pod: the whole pod claim `gpus`,
    or (draStatusName: request) its request `gpus` only."""
    if workload.dra_status_name == "request":
        return {"name": "gpus", "request": "gpus"}
    return {"name": "gpus"}


def allocated_resource_name(reference: dict[str, str]) -> str:
    """`allocatedResourcesStatus[].name` of a container claim reference, as the kubelet forms it:
    `claim:<podClaimName>`, or `claim:<podClaimName>/<request>` when the reference names a request."""
    request = reference.get("request")
    return f"claim:{reference['name']}/{request}" if request else f"claim:{reference['name']}"


def per_container(
    containers: list[dict[str, Any]], allocated: list[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """Each app container's `allocatedResourcesStatus` from the pod's, as the kubelet reports them:
    a container lists only what it asks for (the API server refuses any other name). A claim's
    devices go to every container naming the claim (they share it); a device plugin's are the
    device manager's per container, each taking its own request's count in container order (app
    containers reuse what init containers had, so the pod's devices are theirs)."""
    taken: dict[str, int] = {}
    out: list[list[dict[str, Any]]] = []
    for container in containers:
        resources = container.get("resources") or {}
        requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        claims = {allocated_resource_name(c) for c in resources.get("claims") or [] if c.get("name")}
        mine = []
        for entry in allocated:
            name = entry["name"]
            if name.startswith("claim:"):
                if name in claims:
                    mine.append(entry)
                continue
            try:
                count = int(str(requests.get(name, 0)))
            except ValueError:
                count = 0
            if count <= 0:
                continue
            start = taken.get(name, 0)
            taken[name] = start + count
            devices = entry["resources"][start : start + count]
            if devices:
                mine.append({**entry, "resources": devices})
        out.append(mine)
    return out


def app_containers(workload: Workload, gpus: int) -> list[dict[str, Any]]:
    """The app containers of a device-plugin pod of `workload` holding `gpus` devices."""
    containers: list[dict[str, Any]] = _containers(workload, gpus, False)["containers"]
    return containers


def _containers(workload: Workload, gpus: int, dra: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    if dra:
        resources["claims"] = [claim_reference(workload)]
    else:
        resources["requests"][workload.resource] = str(gpus)
        resources["limits"][workload.resource] = str(gpus)
    main = {
        "name": "worker" if workload.kind == "Job" else "server",
        "image": f"registry.example/{workload.name}:1.0",
        "resources": resources,
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    out: dict[str, Any] = {"containers": [main]}
    if workload.init_container:
        out["initContainers"] = [
            {
                "name": "fetch-weights",
                "image": "registry.example/fetch-weights:1.0",
                "command": ["/bin/fetch", "--to", "/weights"],
                "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }
        ]
    return out


def pod(
    *,
    name: str,
    workload: Workload,
    node_name: str,
    gpus: int,
    dra: bool,
    claim_name: str | None,
    job_uid: str | None,
) -> dict[str, Any]:
    """The Pod as created (bound to its node); its status is written separately by the kubelet."""
    labels = {"app": workload.name, WORKLOAD_LABEL: workload.name}
    if workload.kind == "Job":
        labels["batch.kubernetes.io/job-name"] = workload.name
        labels["job-name"] = workload.name
    else:
        labels["pod-template-hash"] = hash_suffix(workload.namespace + "/" + workload.name)
    if workload.canary:
        labels[CANARY_OPT_IN] = "true"
    spec: dict[str, Any] = {
        **_containers(workload, gpus, dra),
        "nodeName": node_name,
        "schedulerName": "default-scheduler",
        "restartPolicy": "Never" if workload.kind == "Job" else "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "tolerations": [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    if workload.serving_gate:
        spec["readinessGates"] = [{"conditionType": SERVING_CONDITION}]
    if dra:
        if workload.dra_claim == "template" or claim_name is None:
            spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"{workload.name}-gpus"}]
        else:
            spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim_name}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": workload.namespace,
            "labels": labels,
            "annotations": {
                CHECKPOINT_ANNOTATION: workload.checkpoint,
                TOPOLOGY_ANNOTATION: workload.topology,
            },
            "ownerReferences": [owner_reference(workload, job_uid)],
        },
        "spec": spec,
    }


def _image_id(image: str) -> str:
    return f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def image_id(image: str) -> str:
    """containerStatuses[].imageID: the image pinned to its (simulated) digest."""
    return _image_id(image)


def container_id(pod_obj: dict[str, Any], container: str, restarts: int = 0) -> str:
    """containerStatuses[].containerID; a restarted container is a new container (a new id)."""
    parts = [pod_obj["metadata"]["name"], container] + ([str(restarts)] if restarts else [])
    uid = pod_obj["metadata"].get("uid")
    if uid and restarts:
        parts.append(uid)
    return f"containerd://{stable_uid(*parts)}"


def event(
    *,
    pod_obj: dict[str, Any],
    node_name: str,
    reason: str,
    message: str,
    wall: float,
    seq: int,
    warning: bool = False,
    container: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about a pod, as the kubelet records it (source kubelet on the node)."""
    meta = pod_obj["metadata"]
    ts = format_timestamp(wall)
    involved: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }
    rv = meta.get("resourceVersion")
    if rv:
        involved["resourceVersion"] = rv
    if container is not None:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    # Event names are <object>.<hex of a nanosecond timestamp>; the sequence keeps them unique.
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{int(wall * 1e9) + seq:x}", "namespace": meta["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": node_name},
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "count": 1,
        "type": "Warning" if warning else "Normal",
        "eventTime": None,
        "reportingComponent": "kubelet",
        "reportingInstance": node_name,
    }


def gates_not_ready(pod_obj: dict[str, Any]) -> str | None:
    """Why the pod's readiness gates hold its Ready condition False (the kubelet's message), or
    None when every gate's condition is True."""
    conditions = {
        c.get("type"): c.get("status") for c in (pod_obj.get("status") or {}).get("conditions") or ()
    }
    for gate in (pod_obj.get("spec") or {}).get("readinessGates") or ():
        ctype = gate.get("conditionType")
        if ctype not in conditions:
            return f'corresponding condition of pod readiness gate "{ctype}" does not exist.'
        if conditions[ctype] != "True":
            return f'the status of pod readiness gate "{ctype}" is not "True", but {conditions[ctype]}'
    return None


def others_conditions(pod_obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's conditions the kubelet does not own, which its status writes keep."""
    return [
        c
        for c in (pod_obj.get("status") or {}).get("conditions") or ()
        if isinstance(c, dict) and c.get("type") not in KUBELET_CONDITIONS
    ]


def pod_status(
    *,
    pod_obj: dict[str, Any],
    node_index: int,
    pod_index: int,
    started: float,
    ready: bool,
    allocated: list[dict[str, Any]],
    claim_statuses: list[dict[str, Any]] | None,
    finished: float | None = None,
    qos_class: str = "Burstable",
    ready_after: float = 5.0,
) -> dict[str, Any]:
    """A Running (or, with `finished`, Succeeded) pod's status as the kubelet writes it."""
    spec = pod_obj["spec"]
    t_start = format_timestamp(started)
    t_ready = format_timestamp(started + ready_after)
    ready_s = "True" if ready and finished is None else "False"
    gated = gates_not_ready(pod_obj) if ready_s == "True" else None
    pod_ready: dict[str, Any] = {
        "type": "Ready",
        "status": "False" if gated else ready_s,
        "lastTransitionTime": t_ready,
    }
    if gated:
        pod_ready.update(reason="ReadinessGatesNotReady", message=gated)
    host_ip = node_ip(node_index)
    pod_ip = f"10.{128 + ((pod_index >> 16) & 127)}.{(pod_index >> 8) & 255}.{pod_index & 255}"
    status: dict[str, Any] = {
        "phase": "Succeeded" if finished is not None else "Running",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t_start},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t_ready},
            pod_ready,
            {"type": "ContainersReady", "status": ready_s, "lastTransitionTime": t_ready},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t_start},
            *others_conditions(pod_obj),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": t_start,
        "qosClass": qos_class,
    }
    if finished is not None:
        state: dict[str, Any] = {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": t_ready,
                "finishedAt": format_timestamp(finished),
                "containerID": f"containerd://{stable_uid(pod_obj['metadata']['name'], 'main')}",
            }
        }
    else:
        state = {"running": {"startedAt": t_ready}}
    statuses = []
    mine = per_container(spec["containers"], allocated)
    for container, own in zip(spec["containers"], mine, strict=True):
        cs: dict[str, Any] = {
            "name": container["name"],
            "state": state,
            "ready": ready_s == "True",
            "restartCount": 0,
            "image": container["image"],
            "imageID": _image_id(container["image"]),
            "containerID": container_id(pod_obj, container["name"]),
            "started": finished is None,
        }
        if own:
            cs["allocatedResourcesStatus"] = own
        statuses.append(cs)
    status["containerStatuses"] = statuses
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [
            {
                "name": c["name"],
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": t_start,
                        "finishedAt": t_ready,
                        "containerID": f"containerd://{stable_uid(pod_obj['metadata']['name'], c['name'])}",
                    }
                },
                "ready": True,
                "restartCount": 0,
                "image": c["image"],
                "imageID": _image_id(c["image"]),
                "containerID": f"containerd://{stable_uid(pod_obj['metadata']['name'], c['name'])}",
                "started": False,
            }
            for c in spec["initContainers"]
        ]
    if claim_statuses:
        status["resourceClaimStatuses"] = claim_statuses
    return status


def pending_status(wall: float) -> dict[str, Any]:
    """A pod the scheduler could not place yet."""
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: insufficient usable GPUs.",
                "lastTransitionTime": format_timestamp(wall),
            }
        ],
        "qosClass": "Burstable",
    }


_TOLERATED_NODE_TAINTS = frozenset({GPU_RESOURCE})
"""GPU nodes' taint, keyed like cloud providers' by the device plugin's resource name."""


def schedulable(node_obj: dict[str, Any]) -> bool:
    """Not cordoned and no NoSchedule/NoExecute taint that GPU pods do not tolerate."""
    spec = node_obj.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    return not any(
        t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in _TOLERATED_NODE_TAINTS
        for t in spec.get("taints") or []
    )


RUNTIME_CLASS = "nvidia"
"""The RuntimeClass the NVIDIA container toolkit installs (the GPU Operator's default name)."""


def runtime_class() -> dict[str, Any]:
    """`nvidia`: pods that name it run through the NVIDIA container runtime (handler `nvidia`)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS},
        "handler": RUNTIME_CLASS,
    }


DRA_PLUGIN_NAMESPACE = "dra-driver-nvidia-gpu"
DRA_PLUGIN_LABELS = {
    "app.kubernetes.io/name": "dra-driver-nvidia-gpu",
    "app.kubernetes.io/instance": "dra-driver-nvidia-gpu",
    "dra-driver-nvidia-gpu-component": "kubelet-plugin",
}
"""Where the NVIDIA DRA driver's Helm chart runs its kubelet plugin, and its pods' labels."""


DRA_PLUGIN_SERVICE_ACCOUNT = "dra-driver-nvidia-gpu-kubelet-plugin"
"""The ServiceAccount the driver's chart installs for its kubelet plugin: a pod names its own
(kube-apiserver's ServiceAccount admission refuses a pod whose account does not exist yet, and a
new namespace's `default` account comes from kube-controller-manager a moment later)."""


def dra_plugin_service_account() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": DRA_PLUGIN_SERVICE_ACCOUNT, "namespace": DRA_PLUGIN_NAMESPACE},
    }


def dra_plugin_pod(node_name: str) -> dict[str, Any]:
    """The DRA driver's kubelet plugin on `node_name`, as its DaemonSet creates it (bound to the node).

    Its gRPC probes are the chart's: a plugin that stops serving fails them, is restarted and is
    not Ready meanwhile. The simulator plays the DaemonSet controller, so no ownerReference.
    """
    probe = {"grpc": {"port": 51515, "service": "liveness"}, "timeoutSeconds": 10}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"dra-driver-nvidia-gpu-kubelet-plugin-{hash_suffix(node_name, 5)}",
            "namespace": DRA_PLUGIN_NAMESPACE,
            "labels": dict(DRA_PLUGIN_LABELS),
        },
        "spec": {
            "nodeName": node_name,
            "serviceAccountName": DRA_PLUGIN_SERVICE_ACCOUNT,
            "restartPolicy": "Always",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "gpus",
                    "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1",
                    "command": ["gpu-kubelet-plugin"],
                    "startupProbe": {**probe, "failureThreshold": 600, "periodSeconds": 1},
                    "livenessProbe": {**probe, "failureThreshold": 3, "periodSeconds": 30},
                }
            ],
        },
        "status": {"phase": "Pending"},  # what the API server gives a new pod; its kubelet runs it
    }


def device_class(extended_resource: bool = False) -> dict[str, Any]:
    """The DeviceClass the NVIDIA DRA driver installs for whole GPUs; with `extended_resource`
    (KEP-5004, what the driver's chart sets where no device plugin runs) it also serves pods
    that request `nvidia.com/gpu`."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]}
    if extended_resource:
        spec["extendedResourceName"] = GPU_RESOURCE
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DRIVER},
        "spec": spec,
    }


MIG_DEVICE_CLASS = "mig.nvidia.com"


def mig_device_class() -> dict[str, Any]:
    """The DeviceClass the NVIDIA DRA driver's chart installs for its MIG devices: the driver's
    devices of type `mig`."""
    expression = f"device.driver == '{DRA_DRIVER}' && device.attributes['{DRA_DRIVER}'].type == 'mig'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": MIG_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
"""Annotation (value "true") kube-scheduler puts on the special ResourceClaim it creates for a
pod's DRA-backed extended resources (KEP-5004)."""


def extended_request_name(pod_spec: dict[str, Any], container: str, resource: str) -> str:
    """The special claim's request for `resource` of `container`, named as kube-scheduler names it:
    `container-<i>-request-<j>`, `i` counting init containers first, `j` the resource's place among
    the container's sorted request names. Informational only (KEP-5004): readers go through
    `status.extendedResourceClaimStatus.requestMappings`, never this form."""
    all_containers = [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]
    for i, c in enumerate(all_containers):
        if c.get("name") == container:
            keys = sorted(((c.get("resources") or {}).get("requests") or {}).keys())
            return f"container-{i}-request-{keys.index(resource)}"
    raise KeyError(container)


def extended_resource_claim(
    *, name: str, namespace: str, pod_name_: str, pod_uid: str, request: str, gpus: int
) -> dict[str, Any]:
    """The special ResourceClaim kube-scheduler writes for a pod whose `nvidia.com/gpu` request a
    DeviceClass serves: owned by the pod, annotated, one request per (container, resource)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "generateName": f"{pod_name_}-extended-resources-",
            "namespace": namespace,
            "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name_,
                    "uid": pod_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": DRA_DRIVER,
                            "allocationMode": "ExactCount",
                            "count": gpus,
                        },
                    }
                ]
            }
        },
    }


def extended_binding(
    pod_obj: dict[str, Any], claim_name: str, pod_uid: str, node_name: str, devices: list[str]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """What kube-scheduler writes binding a pod whose main container's `nvidia.com/gpu` a
    DeviceClass serves (KEP-5004): the special claim, its status (allocated `devices`, reserved
    for the pod) and the pod's `status.extendedResourceClaimStatus`."""
    main = pod_obj["spec"]["containers"][0]["name"]
    request = extended_request_name(pod_obj["spec"], main, GPU_RESOURCE)
    name, namespace = pod_obj["metadata"]["name"], pod_obj["metadata"]["namespace"]
    claim = extended_resource_claim(
        name=claim_name,
        namespace=namespace,
        pod_name_=name,
        pod_uid=pod_uid,
        request=request,
        gpus=len(devices),
    )
    allocation = claim_status(node_name, devices, name, pod_uid, request=request)
    return claim, allocation, extended_claim_status(claim_name, [(main, request)])


def extended_claim_status(claim_name: str, mappings: list[tuple[str, str]]) -> dict[str, Any]:
    """`pod.status.extendedResourceClaimStatus`: the special claim and (container, request) per
    mapped `nvidia.com/gpu` request."""
    return {
        "resourceClaimName": claim_name,
        "requestMappings": [
            {"containerName": c, "resourceName": GPU_RESOURCE, "requestName": r} for c, r in mappings
        ],
    }


def claim_tolerations(workload: Workload) -> list[dict[str, Any]]:
    """The tolerations of the workload's claim request: gpuhealth's canary taint when it opts in
    to devices on the ramp (`docs/workloads.md`), else none. A DRA-backed extended resource's
    special claim is the scheduler's and carries none (KEP-5004)."""
    if not workload.canary or workload.extended_resource:
        return []
    return [{"key": CANARY_TAINT, "operator": "Exists", "effect": "NoSchedule"}]


def _gpu_request(gpus: int, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRA_DRIVER, "count": gpus}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"name": "gpus", "exactly": exactly}


def resource_claim_template(workload: Workload) -> dict[str, Any]:
    """`<workload>-gpus`: what the workload's pods reference with resourceClaimTemplateName."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{workload.name}-gpus", "namespace": workload.namespace},
        "spec": {
            "spec": {
                "devices": {"requests": [_gpu_request(workload.gpus_per_pod, claim_tolerations(workload))]}
            }
        },
    }


def resource_claim(
    *,
    name: str,
    namespace: str,
    gpus: int,
    owner: dict[str, Any] | None,
    template: str | None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner is not None:
        # Claims generated from a template are owned by their pod (deleted with it).
        meta["ownerReferences"] = [owner]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpus"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [_gpu_request(gpus, tolerations or [])]}},
    }


def claim_status(
    node_name: str, devices: list[str], pod_name_: str, pod_uid: str, request: str = "gpus"
) -> dict[str, Any]:
    return {
        "allocation": {
            "devices": {
                "results": [
                    {"request": request, "driver": DRA_DRIVER, "pool": node_name, "device": d}
                    for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": pod_name_, "uid": pod_uid}],
    }


def job(workload: Workload, template_pod: dict[str, Any]) -> dict[str, Any]:
    spec = dict(template_pod["spec"])
    spec.pop("nodeName", None)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": workload.name,
            "namespace": workload.namespace,
            "labels": {"app": workload.name},
            "annotations": {MANAGED_BY_FLEET: "true"},
        },
        "spec": {
            "completions": workload.replicas,
            "parallelism": workload.replicas,
            "backoffLimit": 6,
            "completionMode": "NonIndexed",
            "template": {
                "metadata": {
                    "labels": {"app": workload.name, WORKLOAD_LABEL: workload.name},
                    "annotations": dict(template_pod["metadata"]["annotations"]),
                },
                "spec": spec,
            },
        },
    }


def replica_set_name(workload: Workload) -> str:
    return f"{workload.name}-{hash_suffix(workload.namespace + '/' + workload.name)}"


def _workload_template(
    workload: Workload, template_pod: dict[str, Any], labels: dict[str, str]
) -> dict[str, Any]:
    spec = dict(template_pod["spec"])
    spec.pop("nodeName", None)
    return {
        "metadata": {"labels": labels, "annotations": dict(template_pod["metadata"]["annotations"])},
        "spec": spec,
    }


def deployment(workload: Workload, template_pod: dict[str, Any]) -> dict[str, Any]:
    """A scenario Deployment, managed by the fleet (its pods are laid out and replaced by the fleet)."""
    labels = {"app": workload.name, WORKLOAD_LABEL: workload.name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": workload.name,
            "namespace": workload.namespace,
            "labels": {"app": workload.name},
            "annotations": {MANAGED_BY_FLEET: "true"},
        },
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": _workload_template(workload, template_pod, labels),
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
        },
    }


def replica_set(workload: Workload, template_pod: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The scenario Deployment's ReplicaSet, whose pods carry its pod-template-hash."""
    pod_hash = hash_suffix(workload.namespace + "/" + workload.name)
    labels = {"app": workload.name, WORKLOAD_LABEL: workload.name, "pod-template-hash": pod_hash}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": replica_set_name(workload),
            "namespace": workload.namespace,
            "labels": dict(labels),
            "annotations": {
                MANAGED_BY_FLEET: "true",
                "deployment.kubernetes.io/revision": "1",
                "deployment.kubernetes.io/desired-replicas": str(workload.replicas),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": workload.name,
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": _workload_template(workload, template_pod, labels),
        },
    }


def slots_key(slots: tuple[Slot, ...]) -> tuple[int, ...]:
    return tuple(s.gpu for s in slots)
