"""Server-side printing: `meta.k8s.io` Table responses, what `kubectl get` asks for and prints.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...;v=v1beta1...,application/json`
on every get, list and watch; the apiserver answers a Table whose `columnDefinitions` and row
`cells` kubectl prints as they are (it computes nothing itself). This module owns the content
negotiation (`table_request`), the columns and cells per kind (the built-ins kubectl shows most,
with wide columns at priority 1) and the CustomResourceDefinition `additionalPrinterColumns`
(a JSONPath subset). Pure functions over plain objects and a `now` in epoch seconds: the HTTP
layer reads the store and the clock.

Kinds without a printer here get the apiserver's default columns: NAME and CREATED AT (a
timestamp), as every resource without a printer does on a real apiserver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gpuhealth.kube.meta import parse_rfc3339
from simulator.apiserver.errors import ApiError, bad_request
from simulator.apiserver.resources import ResourceInfo

TABLE_GROUP = "meta.k8s.io"
_TABLE_VERSIONS = ("v1", "v1beta1")
_INCLUDE_OBJECT = ("None", "Metadata", "Object")
_NONE = "<none>"

CATEGORY_ALL = frozenset(
    {
        "pods",
        "services",
        "deployments.apps",
        "replicasets.apps",
        "statefulsets.apps",
        "daemonsets.apps",
        "jobs.batch",
    }
)
"""Resources in the `all` category (discovery), the ones `kubectl get all` prints."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class TableRequest:
    """A client asked for a Table: in which meta.k8s.io version, and how much of each object to embed."""

    version: str = "v1"
    include_object: str = "Metadata"
    """`includeObject` query parameter: None, Metadata (PartialObjectMetadata, the default) or Object."""

    @property
    def api_version(self) -> str:
        return f"{TABLE_GROUP}/{self.version}"


def _media_ranges(accept: str) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        if not fields[0]:
            continue
        params: dict[str, str] = {}
        for f in fields[1:]:
            key, _, value = f.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        out.append((fields[0].lower(), params))
    return out


def table_request(accept: str | None, include_object: str | None = None) -> TableRequest | None:
    """What the Accept header asks for: a Table, or None for the plain object or list (JSON).

    Media ranges are taken in the client's order, as the apiserver does: the first it can serve
    wins. A header naming only `as=` forms that are not served (PartialObjectMetadata, say) and no
    plain JSON is answered 406 NotAcceptable, as the real apiserver answers it.
    """
    if not accept:
        return None
    ranges = _media_ranges(accept)
    for media, params in ranges:
        if media not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in params:
            return None
        if (
            params["as"] == "Table"
            and params.get("g") == TABLE_GROUP
            and params.get("v", "v1") in _TABLE_VERSIONS
        ):
            include = include_object or "Metadata"
            if include not in _INCLUDE_OBJECT:
                raise bad_request(
                    f'includeObject: Unsupported value: "{include}": supported values: '
                    '"None", "Metadata", "Object"'
                )
            return TableRequest(params.get("v", "v1"), include)
    if any(params.get("as") for _, params in ranges) and not any(
        media in ("application/vnd.kubernetes.protobuf", "application/yaml") for media, _ in ranges
    ):
        raise ApiError(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, "
            "application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        )
    return None


# ---- time ---------------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages: two significant units at most, coarser as it grows."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def age(timestamp: Any, now: float) -> str:
    when = parse_rfc3339(timestamp)
    return _NONE if when is None else human_duration(now - when)


# ---- columns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    description: str = ""
    priority: int = 0
    format: str = ""

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


_NAME = Column("Name", format="name", description="Name must be unique within a namespace.")
_AGE = Column(
    "Age",
    description=(
        "CreationTimestamp is a timestamp representing the server time when this object was created."
    ),
)


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _dig(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _or_none(value: Any) -> Any:
    return value if value not in (None, "") else _NONE


Printer = Callable[[Obj, float], list[Any]]


@dataclass(frozen=True)
class KindPrinter:
    columns: tuple[Column, ...]
    cells: Printer
    """Cells after the name, one per column after the first."""


# -- pods


def pod_status(pod: Obj) -> str:
    """The STATUS kubectl shows for a pod: the phase refined by container states and deletion."""
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    reason = status.get("reason") or status.get("phase") or ""
    for cond in _list(status.get("conditions")):
        if (
            isinstance(cond, dict)
            and cond.get("type") == "PodScheduled"
            and cond.get("reason") == "SchedulingGated"
        ):
            reason = "SchedulingGated"
    init_specs = _list(spec.get("initContainers"))
    restartable = {
        c.get("name") for c in init_specs if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    }
    initializing = False
    for index, cs in enumerate(_list(status.get("initContainerStatuses"))):
        if not isinstance(cs, dict):
            continue
        state = _dict(cs.get("state"))
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        if isinstance(terminated, dict) and terminated.get("exitCode") == 0:
            continue
        if cs.get("name") in restartable and cs.get("started"):
            continue
        if isinstance(terminated, dict):
            if terminated.get("reason"):
                reason = f"Init:{terminated['reason']}"
            elif terminated.get("signal"):
                reason = f"Init:Signal:{terminated['signal']}"
            else:
                reason = f"Init:ExitCode:{terminated.get('exitCode', 0)}"
        elif isinstance(waiting, dict) and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{index}/{len(init_specs)}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(_list(status.get("containerStatuses"))):
            if not isinstance(cs, dict):
                continue
            state = _dict(cs.get("state"))
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if isinstance(waiting, dict) and waiting.get("reason"):
                reason = waiting["reason"]
            elif isinstance(terminated, dict) and terminated.get("reason"):
                reason = terminated["reason"]
            elif isinstance(terminated, dict):
                if terminated.get("signal"):
                    reason = f"Signal:{terminated['signal']}"
                else:
                    reason = f"ExitCode:{terminated.get('exitCode', 0)}"
            elif cs.get("ready") and "running" in state:
                has_running = True
        if reason == "Completed" and has_running:
            ready = any(
                isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in _list(status.get("conditions"))
            )
            reason = "Running" if ready else "NotReady"
    if _meta(pod).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def _pod_ready(pod: Obj) -> str:
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    sidecars = {
        c.get("name")
        for c in _list(spec.get("initContainers"))
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    }
    total = len(_list(spec.get("containers"))) + len(sidecars)
    statuses = _list(status.get("containerStatuses"))
    ready = sum(1 for cs in statuses if isinstance(cs, dict) and cs.get("ready"))
    ready += sum(
        1
        for cs in _list(status.get("initContainerStatuses"))
        if isinstance(cs, dict) and cs.get("name") in sidecars and cs.get("ready")
    )
    return f"{ready}/{total}"


def _pod_restarts(pod: Obj, now: float) -> str:
    status = _dict(pod.get("status"))
    restarts = 0
    last: float | None = None
    for cs in _list(status.get("containerStatuses")) + _list(status.get("initContainerStatuses")):
        if not isinstance(cs, dict):
            continue
        restarts += _int(cs.get("restartCount"))
        finished = parse_rfc3339(_dig(cs, "lastState", "terminated", "finishedAt"))
        if finished is not None and (last is None or finished > last):
            last = finished
    if restarts and last is not None:
        return f"{restarts} ({human_duration(now - last)} ago)"
    return str(restarts)


def _pod_cells(pod: Obj, now: float) -> list[Any]:
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    gates = _list(spec.get("readinessGates"))
    gate_cell = _NONE
    if gates:
        conditions = {
            c.get("type"): c.get("status") for c in _list(status.get("conditions")) if isinstance(c, dict)
        }
        passed = sum(
            1 for g in gates if isinstance(g, dict) and conditions.get(g.get("conditionType")) == "True"
        )
        gate_cell = f"{passed}/{len(gates)}"
    return [
        _pod_ready(pod),
        pod_status(pod),
        _pod_restarts(pod, now),
        age(_meta(pod).get("creationTimestamp"), now),
        _or_none(status.get("podIP")),
        _or_none(spec.get("nodeName")),
        _or_none(status.get("nominatedNodeName")),
        gate_cell,
    ]


_POD = KindPrinter(
    (
        _NAME,
        Column("Ready", description=("The aggregate readiness state of this pod for accepting traffic.")),
        Column("Status", description=("The aggregate status of the containers in this pod.")),
        Column(
            "Restarts",
            description=(
                "The number of times the containers in this pod have been restarted "
                "and when the last container in this pod has restarted."
            ),
        ),
        _AGE,
        Column(
            "IP",
            priority=1,
            description=("IP address allocated to the pod. Routable at least within the cluster."),
        ),
        Column(
            "Node",
            priority=1,
            description=("NodeName is a request to schedule this pod onto a specific node."),
        ),
        Column(
            "Nominated Node",
            priority=1,
            description=("nominatedNodeName is set when this pod preempts other pods on the node."),
        ),
        Column(
            "Readiness Gates",
            priority=1,
            description=("If specified, all readiness gates will be evaluated for pod readiness."),
        ),
    ),
    _pod_cells,
)


# -- nodes


def node_status(node: Obj) -> str:
    """Ready/NotReady/Unknown, plus SchedulingDisabled for a cordoned node."""
    parts: list[str] = []
    for cond in _list(_dig(node, "status", "conditions")):
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            parts.append("Ready" if cond.get("status") == "True" else "NotReady")
    if not parts:
        parts.append("Unknown")
    if _dig(node, "spec", "unschedulable"):
        parts.append("SchedulingDisabled")
    return ",".join(parts)


def _node_roles(node: Obj) -> str:
    roles: set[str] = set()
    for key, value in _dict(_meta(node).get("labels")).items():
        if key.startswith("node-role.kubernetes.io/"):
            role = key.removeprefix("node-role.kubernetes.io/")
            if role:
                roles.add(role)
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or _NONE


def _node_address(node: Obj, kind: str) -> str:
    for addr in _list(_dig(node, "status", "addresses")):
        if isinstance(addr, dict) and addr.get("type") == kind and addr.get("address"):
            return str(addr["address"])
    return _NONE


def _node_cells(node: Obj, now: float) -> list[Any]:
    info = _dict(_dig(node, "status", "nodeInfo"))
    return [
        node_status(node),
        _node_roles(node),
        age(_meta(node).get("creationTimestamp"), now),
        info.get("kubeletVersion", ""),
        _node_address(node, "InternalIP"),
        _node_address(node, "ExternalIP"),
        _or_none(info.get("osImage")),
        _or_none(info.get("kernelVersion")),
        _or_none(info.get("containerRuntimeVersion")),
    ]


_NODE = KindPrinter(
    (
        _NAME,
        Column("Status", description="The status of the node"),
        Column("Roles", description="The roles of the node"),
        _AGE,
        Column("Version", description="Kubelet Version reported by the node."),
        Column("Internal-IP", priority=1, description="List of addresses reachable to the node."),
        Column("External-IP", priority=1, description="List of addresses reachable to the node."),
        Column("OS-Image", priority=1, description=("OS Image reported by the node from /etc/os-release.")),
        Column("Kernel-Version", priority=1, description="Kernel Version reported by the node."),
        Column(
            "Container-Runtime", priority=1, description="Container Runtime Version reported by the node."
        ),
    ),
    _node_cells,
)


# -- workloads


def _containers(obj: Obj) -> tuple[str, str]:
    containers = _list(_dig(obj, "spec", "template", "spec", "containers"))
    names = ",".join(str(c.get("name", "")) for c in containers if isinstance(c, dict))
    images = ",".join(str(c.get("image", "")) for c in containers if isinstance(c, dict))
    return names, images


def format_selector(selector: Any) -> str:
    """A LabelSelector as its string form (matchLabels, then matchExpressions)."""
    if not isinstance(selector, dict):
        return _NONE
    parts = [f"{k}={v}" for k, v in sorted(_dict(selector.get("matchLabels")).items())]
    for expr in _list(selector.get("matchExpressions")):
        if not isinstance(expr, dict):
            continue
        key, op, values = expr.get("key"), expr.get("operator"), _list(expr.get("values"))
        if op == "In":
            parts.append(f"{key} in ({','.join(map(str, values))})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(map(str, values))})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or _NONE


_WIDE_WORKLOAD = (
    Column("Containers", priority=1, description="Names of each container in the template."),
    Column("Images", priority=1, description=("Images referenced by each container in the template.")),
    Column("Selector", priority=1, description="Label selector for pods."),
)


def _deployment_cells(obj: Obj, now: float) -> list[Any]:
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    names, images = _containers(obj)
    return [
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas', 1))}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        age(_meta(obj).get("creationTimestamp"), now),
        names,
        images,
        format_selector(spec.get("selector")),
    ]


_DEPLOYMENT = KindPrinter(
    (
        _NAME,
        Column("Ready", description="Number of the pod with ready state"),
        Column(
            "Up-to-date",
            "integer",
            (
                "Total number of non-terminated pods targeted by this "
                "deployment that have the desired template spec."
            ),
        ),
        Column(
            "Available",
            "integer",
            (
                "Total number of available pods (ready for at least "
                "minReadySeconds) targeted by this deployment."
            ),
        ),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    _deployment_cells,
)


def _replicaset_cells(obj: Obj, now: float) -> list[Any]:
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    names, images = _containers(obj)
    return [
        _int(spec.get("replicas", 1)),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        age(_meta(obj).get("creationTimestamp"), now),
        names,
        images,
        format_selector(spec.get("selector")),
    ]


_REPLICASET = KindPrinter(
    (
        _NAME,
        Column("Desired", "integer", "Replicas is the number of desired replicas."),
        Column("Current", "integer", ("Replicas is the most recently observed number of replicas.")),
        Column("Ready", "integer", ("The number of ready replicas for this replica set.")),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    _replicaset_cells,
)


def _statefulset_cells(obj: Obj, now: float) -> list[Any]:
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    names, images = _containers(obj)
    return [
        f"{_int(status.get('readyReplicas'))}/{_int(spec.get('replicas', 1))}",
        age(_meta(obj).get("creationTimestamp"), now),
        names,
        images,
    ]


_STATEFULSET = KindPrinter(
    (
        _NAME,
        Column("Ready", description="Number of the pod with ready state"),
        _AGE,
        *_WIDE_WORKLOAD[:2],
    ),
    _statefulset_cells,
)


def job_status(job: Obj) -> str:
    """Complete, Failed, Suspended, ... or Running, as kubectl shows a Job."""
    listed = _list(_dig(job, "status", "conditions"))
    conditions = {c.get("type"): c.get("status") for c in listed if isinstance(c, dict)}
    for kind in ("Failed", "Complete", "Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if conditions.get(kind) == "True":
            return kind
    if _meta(job).get("deletionTimestamp"):
        return "Terminating"
    return "Running"


def _job_cells(job: Obj, now: float) -> list[Any]:
    spec, status = _dict(job.get("spec")), _dict(job.get("status"))
    succeeded = _int(status.get("succeeded"))
    completions = spec.get("completions")
    parallelism = _int(spec.get("parallelism", 1))
    if isinstance(completions, int):
        done = f"{succeeded}/{completions}"
    elif parallelism > 1:
        done = f"{succeeded}/1 of {parallelism}"
    else:
        done = f"{succeeded}/1"
    start = parse_rfc3339(status.get("startTime"))
    duration = ""
    if start is not None:
        end = parse_rfc3339(status.get("completionTime"))
        duration = human_duration((end if end is not None else now) - start)
    names, images = _containers(job)
    return [
        job_status(job),
        done,
        duration,
        age(_meta(job).get("creationTimestamp"), now),
        names,
        images,
        format_selector(spec.get("selector")),
    ]


_JOB = KindPrinter(
    (
        _NAME,
        Column("Status", description="Status of the job."),
        Column(
            "Completions",
            description=("The desired number of successfully finished pods the job should be run with."),
        ),
        Column("Duration", description="Time required to complete the job."),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    _job_cells,
)


def _pdb_cells(obj: Obj, now: float) -> list[Any]:
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    min_available = spec.get("minAvailable")
    max_unavailable = spec.get("maxUnavailable")
    return [
        "N/A" if min_available is None else str(min_available),
        "N/A" if max_unavailable is None else str(max_unavailable),
        _int(status.get("disruptionsAllowed")),
        age(_meta(obj).get("creationTimestamp"), now),
    ]


_PDB = KindPrinter(
    (
        _NAME,
        Column("Min Available", description=("The minimum number of pods that must be available.")),
        Column("Max Unavailable", description=("The maximum number of pods that may be unavailable.")),
        Column(
            "Allowed Disruptions",
            "integer",
            ("Calculated number of pods that may be disrupted at this time."),
        ),
        _AGE,
    ),
    _pdb_cells,
)


# -- configuration, networking, coordination


def _configmap_cells(obj: Obj, now: float) -> list[Any]:
    count = len(_dict(obj.get("data"))) + len(_dict(obj.get("binaryData")))
    return [count, age(_meta(obj).get("creationTimestamp"), now)]


_CONFIGMAP = KindPrinter(
    (_NAME, Column("Data", "integer", "Number of data entries in the ConfigMap."), _AGE), _configmap_cells
)


def _secret_cells(obj: Obj, now: float) -> list[Any]:
    count = len(_dict(obj.get("data"))) + len(_dict(obj.get("stringData")))
    return [obj.get("type") or "Opaque", count, age(_meta(obj).get("creationTimestamp"), now)]


_SECRET = KindPrinter(
    (
        _NAME,
        Column("Type", description="The type of the secret."),
        Column("Data", "integer", "Number of data entries in the Secret."),
        _AGE,
    ),
    _secret_cells,
)


def _service_ports(spec: Obj) -> str:
    parts: list[str] = []
    for port in _list(spec.get("ports")):
        if not isinstance(port, dict):
            continue
        text = f"{port.get('port')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        parts.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(parts) or _NONE


def _service_external(obj: Obj) -> str:
    spec = _dict(obj.get("spec"))
    ips = [str(ip) for ip in _list(spec.get("externalIPs"))]
    if spec.get("type") == "ExternalName":
        return str(spec.get("externalName") or _NONE)
    if spec.get("type") == "LoadBalancer":
        for ingress in _list(_dig(obj, "status", "loadBalancer", "ingress")):
            if isinstance(ingress, dict) and (ingress.get("ip") or ingress.get("hostname")):
                ips.append(str(ingress.get("ip") or ingress.get("hostname")))
        return ",".join(ips) or "<pending>"
    return ",".join(ips) or _NONE


def _service_cells(obj: Obj, now: float) -> list[Any]:
    spec = _dict(obj.get("spec"))
    selector = _dict(spec.get("selector"))
    return [
        spec.get("type") or "ClusterIP",
        _or_none(spec.get("clusterIP")),
        _service_external(obj),
        _service_ports(spec),
        age(_meta(obj).get("creationTimestamp"), now),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or _NONE,
    ]


_SERVICE = KindPrinter(
    (
        _NAME,
        Column("Type", description="The type of the service."),
        Column("Cluster-IP", description="The IP address of the service."),
        Column("External-IP", description="External IP addresses of the service."),
        Column("Port(s)", description="The ports exposed by the service."),
        _AGE,
        Column(
            "Selector",
            priority=1,
            description=("Route service traffic to pods with label keys and values matching this selector."),
        ),
    ),
    _service_cells,
)


def _namespace_cells(obj: Obj, now: float) -> list[Any]:
    return [_dig(obj, "status", "phase") or "Active", age(_meta(obj).get("creationTimestamp"), now)]


_NAMESPACE = KindPrinter(
    (_NAME, Column("Status", description="The status of the namespace"), _AGE), _namespace_cells
)


def _lease_cells(obj: Obj, now: float) -> list[Any]:
    return [_dig(obj, "spec", "holderIdentity") or "", age(_meta(obj).get("creationTimestamp"), now)]


_LEASE = KindPrinter((_NAME, Column("Holder", description="The holder of the lease."), _AGE), _lease_cells)


def _event_time(event: Obj, *keys: str) -> float | None:
    for key in keys:
        value = event.get(key)
        if key == "series" and isinstance(value, dict):
            value = value.get("lastObservedTime")
        when = parse_rfc3339(value)
        if when is not None:
            return when
    return None


def _event_cells(event: Obj, now: float) -> list[Any]:
    involved = _dict(event.get("involvedObject"))
    last = _event_time(event, "series", "lastTimestamp", "eventTime")
    first = _event_time(event, "firstTimestamp", "eventTime")
    if last is None:
        last = parse_rfc3339(_meta(event).get("creationTimestamp"))
    source = _dict(event.get("source"))
    source_text = event.get("reportingComponent") or source.get("component") or ""
    if source.get("host"):
        source_text = f"{source_text}, {source['host']}"
    count = _int(_dig(event, "series", "count")) or _int(event.get("count")) or 1
    return [
        _NONE if last is None else human_duration(now - last),
        event.get("type") or "",
        event.get("reason") or "",
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        involved.get("fieldPath") or "",
        source_text,
        str(event.get("message") or "").strip(),
        _NONE if first is None else human_duration(now - first),
        count,
        _meta(event).get("name", ""),
    ]


_EVENT = KindPrinter(
    (
        Column("Last Seen", description="Time when last occurrence of the event was seen."),
        Column(
            "Type",
            description=("Type of this event (Normal, Warning), new types could be added in the future."),
        ),
        Column(
            "Reason",
            description=(
                "This should be a short, machine understandable string that "
                "gives the reason for this event being generated."
            ),
        ),
        Column("Object", description="The object this Event is about."),
        Column("Subobject", priority=1, description="The field path of the object this Event is about."),
        Column("Source", priority=1, description="The component reporting this event."),
        Column("Message", description=("A human-readable description of the status of this operation.")),
        Column("First Seen", priority=1, description="The time at which the event was first recorded."),
        Column("Count", "integer", priority=1, description="The number of times this event has occurred."),
        Column("Name", priority=1, format="name", description="Name must be unique within a namespace."),
    ),
    _event_cells,
)


# -- dynamic resource allocation


def claim_state(claim: Obj) -> str:
    if _meta(claim).get("deletionTimestamp"):
        return "deleted"
    status = _dict(claim.get("status"))
    if not status.get("allocation"):
        return "pending"
    return "allocated,reserved" if _list(status.get("reservedFor")) else "allocated"


def _claim_cells(obj: Obj, now: float) -> list[Any]:
    return [claim_state(obj), age(_meta(obj).get("creationTimestamp"), now)]


_CLAIM = KindPrinter(
    (
        _NAME,
        Column("State", description=("A summary of the current state (allocated, pending, reserved, etc.).")),
        _AGE,
    ),
    _claim_cells,
)


def _slice_cells(obj: Obj, now: float) -> list[Any]:
    spec = _dict(obj.get("spec"))
    return [
        _or_none(spec.get("nodeName")),
        spec.get("driver", ""),
        _dig(spec, "pool", "name") or "",
        age(_meta(obj).get("creationTimestamp"), now),
    ]


_SLICE = KindPrinter(
    (
        _NAME,
        Column("Node", description=("Name of the node which provides the resources in this slice.")),
        Column("Driver", description=("Name of the DRA driver which provides the resources in this slice.")),
        Column("Pool", description=("Name of the pool which the devices in this slice belong to.")),
        _AGE,
    ),
    _slice_cells,
)


def _taint_rule_cells(obj: Obj, now: float) -> list[Any]:
    spec = _dict(obj.get("spec"))
    selector = _dict(spec.get("deviceSelector"))
    taint = _dict(spec.get("taint"))
    return [
        _or_none(selector.get("driver")),
        _or_none(selector.get("pool")),
        _or_none(selector.get("device")),
        f"{taint.get('key', '')}={taint.get('value', '')}:{taint.get('effect', '')}" if taint else _NONE,
        age(_meta(obj).get("creationTimestamp"), now),
    ]


_TAINT_RULE = KindPrinter(
    (
        _NAME,
        Column("Driver", description="The driver whose devices the rule taints."),
        Column("Pool", description="The pool whose devices the rule taints."),
        Column("Device", description="The device the rule taints."),
        Column("Taint", description="The taint (key=value:effect) the rule adds."),
        _AGE,
    ),
    _taint_rule_cells,
)


PRINTERS: dict[str, KindPrinter] = {  # by store key
    "pods": _POD,
    "nodes": _NODE,
    "namespaces": _NAMESPACE,
    "deployments.apps": _DEPLOYMENT,
    "replicasets.apps": _REPLICASET,
    "statefulsets.apps": _STATEFULSET,
    "jobs.batch": _JOB,
    "poddisruptionbudgets.policy": _PDB,
    "configmaps": _CONFIGMAP,
    "secrets": _SECRET,
    "services": _SERVICE,
    "leases.coordination.k8s.io": _LEASE,
    "events": _EVENT,
    "resourceclaims.resource.k8s.io": _CLAIM,
    "resourceslices.resource.k8s.io": _SLICE,
    "devicetaintrules.resource.k8s.io": _TAINT_RULE,
}


# ---- the default printer and CRD printer columns ------------------------------------------------------

_CREATED_AT = Column(
    "Created At",
    "date",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
)
_DEFAULT = KindPrinter((_NAME, _CREATED_AT), lambda obj, now: [_meta(obj).get("creationTimestamp")])

_JSONPATH_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_\-/]+)|\[(?P<index>-?\d+)\]|\[\?\(@\.(?P<key>[A-Za-z0-9_\-]+)\s*==\s*["'](?P<value>[^"']*)["']\)\]"""
)


def parse_jsonpath(path: str) -> list[tuple[str, Any]]:
    """A printer column's jsonPath (the subset CRDs use) as steps; ValueError when outside it.

    Accepted: `.a.b` fields, `[n]` list indexes and `[?(@.key=="value")]` filters, with or
    without the `{...}` template braces.
    """
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        match = _JSONPATH_STEP.match(text, pos)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {text[pos:]!r}")
        if match.group("field") is not None:
            steps.append(("field", match.group("field")))
        elif match.group("index") is not None:
            steps.append(("index", int(match.group("index"))))
        else:
            steps.append(("filter", (match.group("key"), match.group("value"))))
        pos = match.end()
    if not steps:
        raise ValueError(f"unsupported JSONPath {path!r}")
    return steps


def eval_jsonpath(obj: Any, steps: Iterable[tuple[str, Any]]) -> Any:
    """The value at the path; None where it does not resolve (the cell prints as <none>)."""
    for kind, arg in steps:
        if kind == "field":
            obj = obj.get(arg) if isinstance(obj, dict) else None
        elif kind == "index":
            obj = obj[arg] if isinstance(obj, list) and -len(obj) <= arg < len(obj) else None
        else:
            key, value = arg
            items = obj if isinstance(obj, list) else []
            matches = [i for i in items if isinstance(i, dict) and str(i.get(key)) == value]
            obj = matches[0] if matches else None
        if obj is None:
            return None
    return obj


def _crd_cell(value: Any, column_type: str, now: float) -> Any:
    if value is None:
        return None
    if column_type == "date":
        return age(value, now)
    if column_type == "integer":
        return value if isinstance(value, int) else None
    if column_type == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if column_type == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else str(value)


def crd_printer(crd: Obj | None, version: str) -> KindPrinter:
    """Columns of a custom resource: NAME then the CRD's additionalPrinterColumns, or NAME and AGE."""
    columns_spec: list[Any] = []
    for v in _list(_dig(crd, "spec", "versions")):
        if isinstance(v, dict) and v.get("name") == version:
            columns_spec = _list(v.get("additionalPrinterColumns"))
    if not columns_spec:
        return KindPrinter((_NAME, _AGE), lambda obj, now: [age(_meta(obj).get("creationTimestamp"), now)])
    columns: list[Column] = [_NAME]
    paths: list[tuple[list[tuple[str, Any]], str]] = []
    for spec in columns_spec:
        if not isinstance(spec, dict):
            continue
        column_type = str(spec.get("type") or "string")
        try:
            steps = parse_jsonpath(str(spec.get("jsonPath", "")))
        except ValueError:
            steps = [("field", "\0")]  # prints <none>, as a path that matches nothing
        columns.append(
            Column(
                str(spec.get("name", "")),
                "string" if column_type == "date" else column_type,
                str(spec.get("description") or ""),
                _int(spec.get("priority")),
                str(spec.get("format") or ""),
            )
        )
        paths.append((steps, column_type))

    def cells(obj: Obj, now: float) -> list[Any]:
        return [_crd_cell(eval_jsonpath(obj, steps), column_type, now) for steps, column_type in paths]

    return KindPrinter(tuple(columns), cells)


def printer_for(info: ResourceInfo, version: str, crd: Obj | None = None) -> KindPrinter:
    """The printer for a resource; `crd` is the CustomResourceDefinition of a custom resource."""
    if info.custom:
        return crd_printer(crd, version)
    return PRINTERS.get(info.key, _DEFAULT)


# ---- tables ---------------------------------------------------------------------------------------


def _row_object(obj: Obj, request: TableRequest) -> Obj | None:
    if request.include_object == "None":
        return None
    if request.include_object == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": _meta(obj)}


def table_row(printer: KindPrinter, obj: Obj, request: TableRequest, now: float) -> Obj:
    first = [_meta(obj).get("name", "")] if printer.columns[0] is _NAME else []
    row: Obj = {"cells": first + printer.cells(obj, now)}
    embedded = _row_object(obj, request)
    if embedded is not None:
        row["object"] = embedded
    return row


def render_table(
    printer: KindPrinter,
    objects: Iterable[Obj],
    request: TableRequest,
    *,
    now: float,
    list_meta: Obj | None = None,
) -> Obj:
    """A Table of `objects` (one row each, in order) with the list's metadata."""
    return {
        "kind": "Table",
        "apiVersion": request.api_version,
        "metadata": dict(list_meta or {}),
        "columnDefinitions": [c.definition() for c in printer.columns],
        "rows": [table_row(printer, obj, request, now) for obj in objects],
    }
