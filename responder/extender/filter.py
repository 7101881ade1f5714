"""The scheduler extender's filter for device-plugin GPUs: quarantined devices counted out.

Device plugins give no API to keep one device out of allocation: the kubelet hands a pod any
free device its plugin reports Healthy. A quarantined device that reports Healthy again
(Unknown that cleared, a device on its way out of quarantine) is still counted in the node's
allocatable. kube-scheduler's extender API works per node, not per device, so the most it
can do — and what this does — is count those devices out of the node's capacity for pods
that request GPUs: a node passes only if the pod fits into what is left. What it cannot do
(`docs/quarantine.md`): stop the kubelet from picking the quarantined device among free ones
on a node that passes. DRA's DeviceTaintRule is the exact route.

The ramp (`docs/quarantine.md`, "Gradual return"): a device on the ramp is still counted out for
every pod but those that opt in (label `gpuhealth.io/canary-ok: "true"`), which may count it in
while the node has ramp slots left: the bound the responder wrote in the node's ramp
annotation, less the opted-in pods already bound there. So during the ramp at most that many
opted-in pods share the node's ramping devices, and after the release every pod may use them.

Wire shapes are `k8s.io/kube-scheduler/extender/v1` with Go field names: `ExtenderArgs{Pod,
Nodes (a v1.NodeList) | NodeNames}` in, `ExtenderFilterResult{Nodes | NodeNames, FailedNodes,
FailedAndUnresolvableNodes, Error}` out. With `nodeCacheCapable: true` the scheduler sends
names only and the extender answers names. Pure: parsing and deciding, no I/O; the capacity
view is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.plugin_resources import GPU_RESOURCE, gpu_resource
from responder.ladder import CANARY_OPT_IN


def gpu_units(values: Any) -> int:
    """The GPU units of a node's `status.capacity` or `status.allocatable`: `nvidia.com/gpu` and
    every `nvidia.com/mig-<profile>` together; unreadable quantities count as 0. Under MIG strategy
    mixed a partition of any profile is one unit: exact for what the extender decides on a node
    with a hold under way (no new GPU pod at all) and on a node of one profile; on a node of
    several profiles the count of quarantined units is the node's, not the profile's
    (`docs/quarantine.md`, "MIG")."""
    if not isinstance(values, dict):
        return 0
    total = 0
    for name, value in values.items():
        if gpu_resource(str(name)):
            try:
                total += max(0, int(str(value)))
            except ValueError:
                continue
    return total


class ArgsError(ValueError):
    """Not ExtenderArgs; the message names the field."""


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """A node's GPU accounting as the responder sees it."""

    allocatable: int
    """`status.allocatable[nvidia.com/gpu]` (the kubelet already leaves Unhealthy devices out)."""
    requested: int
    """GPUs requested by the pods bound to the node and not finished."""
    quarantined_allocatable: int
    """Quarantined devices the kubelet still counts allocatable (reported Healthy), those on the
    ramp included."""
    ramping_allocatable: int = 0
    """Of those, the devices on the ramp."""
    ramp_slots: int = 0
    """Opted-in pods the node may still take while its devices ramp: the annotation's bound less
    the opted-in pods bound there."""
    holding: int = 0
    """Quarantined devices whose hold (`responder.enforce.hold`) is being made: while any is, no
    GPU is free on the node, since the kubelet could hand a new pod the card."""

    @property
    def free(self) -> int:
        if self.holding:
            return 0
        return max(0, self.allocatable - self.requested - self.quarantined_allocatable)

    def free_for(self, opted_in: bool) -> int:
        """GPUs free for a pod: an opted-in one may count the ramping devices in while a slot is left."""
        if opted_in and self.ramp_slots > 0:
            return self.free + self.ramping_allocatable
        return self.free


@dataclass(frozen=True, slots=True)
class Args:
    gpus: int
    """GPUs the pod requests (0: the filter passes every node)."""
    node_names: tuple[str, ...]
    nodes: tuple[dict[str, Any], ...] | None
    """The Node objects when the scheduler sent them (not nodeCacheCapable), else None."""
    opted_in: bool = False
    """The pod opts in to devices on the ramp (`CANARY_OPT_IN`)."""


def parse_args(body: Any) -> Args:
    if not isinstance(body, dict):
        raise ArgsError("ExtenderArgs must be a JSON object")
    pod = _field(body, "Pod")
    if not isinstance(pod, dict):
        raise ArgsError("Pod: expected a Pod object")
    nodes_list = _field(body, "Nodes")
    names = _field(body, "NodeNames")
    if nodes_list is not None:
        items = nodes_list.get("items") if isinstance(nodes_list, dict) else None
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            raise ArgsError("Nodes.items: expected a list of Node objects")
        nodes = tuple(items)
        node_names = tuple(_node_name(n, i) for i, n in enumerate(nodes))
        return Args(gpus_requested(pod), node_names, nodes, opted_in(pod))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ArgsError("NodeNames: expected a list of node names (or Nodes)")
    return Args(gpus_requested(pod), tuple(names), None, opted_in(pod))


def opted_in(pod: Mapping[str, Any]) -> bool:
    """Whether the pod opts in to devices on the ramp: its label `gpuhealth.io/canary-ok` is `"true"`."""
    labels = _mapping(_mapping(pod.get("metadata")).get("labels"))
    return labels.get(CANARY_OPT_IN) == "true"


def gpus_requested(pod: Mapping[str, Any]) -> int:
    """The pod's effective GPU request: the sum over containers, or the largest init container's
    (units of `nvidia.com/gpu` and of every `nvidia.com/mig-<profile>` together)."""
    return _requested(pod, gpu_resource)


def requested(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request of one extended resource (as `gpus_requested` counts)."""
    return _requested(pod, lambda name: name == resource)


def _requested(pod: Mapping[str, Any], counted: Callable[[str], bool]) -> int:
    spec = _mapping(pod.get("spec"))

    def of(container: Any) -> int:
        resources = container.get("resources") if isinstance(container, dict) else None
        if not isinstance(resources, dict):
            return 0
        for part in ("requests", "limits"):  # extended resources: requests equal limits
            values = resources.get(part)
            if isinstance(values, dict) and any(counted(str(k)) for k in values):
                return sum(_count(v) for k, v in values.items() if counted(str(k)))
        return 0

    containers, inits = _list(spec.get("containers")), _list(spec.get("initContainers"))
    return max(sum(of(c) for c in containers), max((of(c) for c in inits), default=0))


def filter_nodes(args: Args, capacity: Callable[[str], NodeCapacity | None]) -> dict[str, Any]:
    """The ExtenderFilterResult: nodes where the pod's GPUs fit with quarantined devices counted out.

    A node the responder knows nothing about passes (it has nothing quarantined that we know
    of): the extender only ever removes nodes for a reason it can state.
    """
    passed: list[int] = []
    failed: dict[str, str] = {}
    for index, name in enumerate(args.node_names):
        view = capacity(name) if args.gpus else None
        if view is None or view.free_for(args.opted_in) >= args.gpus:
            passed.append(index)
            continue
        free = view.free_for(args.opted_in)
        if view.holding:
            failed[name] = (
                f"gpuhealth: {view.holding} quarantined {GPU_RESOURCE} not held yet (holder pods "
                "being placed, or its pods being moved): no new GPU pods until it is"
            )
            continue
        failed[name] = (
            f"gpuhealth: {view.quarantined_allocatable} quarantined {GPU_RESOURCE} counted out; "
            f"{free} free for a request of {args.gpus}"
        )
        if view.ramping_allocatable:
            failed[name] += (
                f" ({view.ramping_allocatable} on the ramp, {view.ramp_slots} opted-in pod slots left)"
                if args.opted_in
                else f" ({view.ramping_allocatable} on the ramp: only pods labelled {CANARY_OPT_IN}=true)"
            )
    result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
    if args.nodes is not None:
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": [args.nodes[i] for i in passed]}
        result["NodeNames"] = None
    else:
        result["Nodes"] = None
        result["NodeNames"] = [args.node_names[i] for i in passed]
    return result


def error_result(message: str) -> dict[str, Any]:
    """What to answer when the request cannot be judged: the scheduler fails this pod's attempt."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def _field(body: Mapping[str, Any], name: str) -> Any:
    """A field by its Go name, or lower-cased as Go's JSON decoder also accepts it."""
    return body[name] if name in body else body.get(name.lower())


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _node_name(node: Mapping[str, Any], index: int) -> str:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ArgsError(f"Nodes.items[{index}].metadata.name: expected a node name")
    return name


def _count(value: Any) -> int:
    """A GPU quantity (a whole number, as a string or a number)."""
    try:
        number = int(str(value))
    except ValueError:
        raise ArgsError(f"{GPU_RESOURCE}: {value!r} is not a whole number of GPUs") from None
    if number < 0:
        raise ArgsError(f"{GPU_RESOURCE}: {value!r} is negative")
    return number
