"""What a pod bound to a simulated node asks of its kubelet, and whether the node can give it:
pure decisions over the pod object and the node's state, for the pod workers (`pod_runner`) and
their admission (`pod_runner_admission`) only.

A pod's run (`RunSpec`: its requests, QoS class, containers, how long they run and how they exit,
the GPUs `NVIDIA_VISIBLE_DEVICES` names, init containers), the GPU programs the containers model
(`GPU_PROGRAMS`), resource fit against the node (`node_fit`) and the pod's DRA claims.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.plugin_resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from simulator.fleet import objects, programs
from simulator.fleet.state import SimNode
from simulator.model import node_slots

RUN_SECONDS = "sim.gpuhealth.io/run-seconds"
EXIT_CODE = "sim.gpuhealth.io/exit-code"
STOP_AFTER = "sim.gpuhealth.io/stop-after"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's variable: which of the node's GPUs a container sees."""

START_ERROR_EXIT_CODE = 128
"""A container the runtime could not create (here: `NVIDIA_VISIBLE_DEVICES` names a GPU the
node lacks, which nvidia-container-cli refuses): Failed at once, as the kubelet's StartError."""

CPU_ALLOCATABLE_MILLI = 191_500
MEMORY_ALLOCATABLE = 2_100_000 * 2**20
"""What `objects.node` writes as allocatable cpu and memory."""

_SLEEP = re.compile(r"\bsleep\s+(\d+(?:\.\d+)?)([smhd]?)\b")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SUFFIXES = {
    "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")


@dataclass(frozen=True, slots=True)
class GpuProgram:
    """A program that exercises the GPUs it reaches: it fails when one of them fails under it."""

    name: str
    pattern: re.Pattern[str]
    """Found in the container's command and args joined by spaces (as `sleep N` is)."""
    seconds: float
    """Its run when neither the run-seconds annotation nor a `sleep` says otherwise."""


GPU_PROGRAMS = (GpuProgram("vectorAdd", re.compile(r"(?:^|[\s/])vectorAdd\b"), 10.0),)
"""The GPU programs the simulated containers model: the CUDA sample that copies two vectors to
device memory, adds them and checks the sum. DCGM's diagnostic is not modelled from its command
text: its image runs for real against a hostengine it must start (`programs`). Anything else
(`sleep`, a scenario's workload) exits with its scripted code whatever its devices do."""


def quantity(text: Any) -> float:
    """A resource quantity (`4`, `500m`, `32Gi`) as a number; 0 when unreadable (validation's job)."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        return 0.0
    try:
        return float(match.group(1)) * _SUFFIXES[match.group(2) or ""]
    except ValueError:
        return 0.0


def _requests(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    # Requests default to limits, per resource.
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """Effective requests: the sum over containers, or the largest init container's if higher."""
    total: dict[str, float] = {}
    for c in spec.get("containers") or ():
        for name, value in _requests(c).items():
            total[name] = total.get(name, 0.0) + quantity(value)
    for c in spec.get("initContainers") or ():
        for name, value in _requests(c).items():
            total[name] = max(total.get(name, 0.0), quantity(value))
    return total


def qos_class(spec: dict[str, Any]) -> str:
    """Guaranteed (cpu and memory limits equal requests everywhere), BestEffort (none set), or Burstable."""
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
    any_set = False
    guaranteed = True
    for c in containers:
        resources = c.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        if any(k in requests or k in limits for k in ("cpu", "memory")):
            any_set = True
        for name in ("cpu", "memory"):
            if name not in limits or quantity(requests.get(name)) != quantity(limits[name]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _seconds(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text.strip())
    except DurationError:
        return None


def _words(container: dict[str, Any]) -> str:
    return " ".join(str(w) for w in (*(container.get("command") or ()), *(container.get("args") or ())))


def gpu_program(container: dict[str, Any]) -> GpuProgram | None:
    """The GPU program the container runs (`GPU_PROGRAMS`), if any; none in a container that runs
    for real (`programs.executed`)."""
    if programs.executed(container):
        return None
    words = _words(container)
    return next((p for p in GPU_PROGRAMS if p.pattern.search(words)), None)


def run_seconds(meta: dict[str, Any], container: dict[str, Any]) -> float | None:
    """How long the containers run: the annotation, else a `sleep N` in command/args, else a GPU
    program's usual length; None: forever."""
    annotated = _seconds((meta.get("annotations") or {}).get(RUN_SECONDS))
    executed = programs.usual_seconds(container)
    if executed is not None and (annotated is None or executed == programs.JUDGE_SECONDS):
        return executed  # a judge's read of a file is its own length, not the workload's
    if annotated is not None:
        return annotated
    match = _SLEEP.search(_words(container))
    if match is not None:
        return float(match.group(1)) * _UNITS[match.group(2)]
    program = gpu_program(container)
    return None if program is None else program.seconds


def visible_devices(containers: tuple[dict[str, Any], ...]) -> tuple[str, ...]:
    """The `NVIDIA_VISIBLE_DEVICES` values of the containers' env (literal values only: a
    `valueFrom` is not resolved), in container order."""
    values = []
    for container in containers:
        for var in container.get("env") or ():
            if isinstance(var, dict) and var.get("name") == VISIBLE_DEVICES and "value" in var:
                values.append(str(var.get("value") or ""))
    return tuple(values)


def visible_gpus(
    values: tuple[str, ...], uuids: tuple[str, ...], partitions: tuple[tuple[str, ...], ...] = ()
) -> tuple[int, ...] | None:
    """The indexes of the node's GPUs (`uuids`, by index) that the values expose, as the NVIDIA
    container runtime reads them: `all` is every GPU; `none`, `void` or empty is none (the
    runtime still runs the container, without a GPU); otherwise a comma list of GPU uuids or
    indexes, or MIG device UUIDs (`partitions`: each GPU's, by index), which reach their card.
    None when an entry names no GPU of the node (the runtime refuses the container). The
    `<gpu>:<mig>` index form is not modelled: such an entry names no GPU here."""
    parent = {mig: index for index, migs in enumerate(partitions) for mig in migs}
    picked: set[int] = set()
    for value in values:
        value = value.strip()
        if value == "all":
            picked.update(range(len(uuids)))
            continue
        if value in ("", "none", "void"):
            continue
        for entry in (e.strip() for e in value.split(",")):
            if entry.isdigit() and int(entry) < len(uuids):
                picked.add(int(entry))
            elif entry in uuids:
                picked.add(uuids.index(entry))
            elif entry in parent:
                picked.add(parent[entry])
            else:
                return None
    return tuple(sorted(picked))


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What an API pod's simulated containers do."""

    containers: tuple[dict[str, Any], ...]
    run_seconds: float | None
    exit_code: int
    restart_policy: str
    stop_after: float | None
    """Seconds the workload takes to exit on SIGTERM; None: it ignores SIGTERM."""
    gpus: int
    cpu_milli: int
    memory: int
    program: GpuProgram | None
    """The GPU program the first container runs: its exit code is its devices' verdict."""
    visible: tuple[str, ...]
    """`NVIDIA_VISIBLE_DEVICES` of the containers, for a pod that gets no device otherwise."""
    qos: str
    resource: str = GPU_RESOURCE
    """The GPU resource the pod requests `gpus` of: `nvidia.com/gpu`, or a MIG profile's
    `nvidia.com/mig-<profile>` (strategy mixed)."""
    init: tuple[dict[str, Any], ...] = ()
    """The pod's init containers, run in order before `containers`."""
    init_seconds: tuple[float, ...] = ()
    """How long each init container runs."""


def run_spec(obj: dict[str, Any]) -> RunSpec:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    annotations = meta.get("annotations") or {}
    containers = tuple(spec.get("containers") or ())
    init = tuple(spec.get("initContainers") or ())
    try:
        exit_code = int(annotations.get(EXIT_CODE, "0"))
    except ValueError:
        exit_code = 1
    stop_text = annotations.get(STOP_AFTER, "0")
    requests = pod_requests(spec)
    resource = next(
        (name for name in sorted(requests) if name.startswith(MIG_RESOURCE_PREFIX) and requests[name] > 0),
        GPU_RESOURCE,
    )
    return RunSpec(
        containers=containers,
        run_seconds=run_seconds(meta, containers[0]) if containers else None,
        exit_code=exit_code,
        restart_policy=spec.get("restartPolicy") or "Always",
        stop_after=None if stop_text.strip() == "never" else (_seconds(stop_text) or 0.0),
        gpus=int(requests.get(resource, 0)),
        resource=resource,
        cpu_milli=round(requests.get("cpu", 0.0) * 1000),
        memory=int(requests.get("memory", 0.0)),
        program=gpu_program(containers[0]) if containers else None,
        visible=visible_devices((*init, *containers)),
        qos=qos_class(spec),
        init=init,
        init_seconds=tuple(run_seconds(meta, c) or 0.0 for c in init),
    )


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    message: str


def fit(requested: int, used: int, capacity: int, resource: str) -> Rejection | None:
    """The kubelet's admission check of one resource, worded as the real kubelet words it."""
    if requested <= 0 or requested <= capacity - used:
        return None
    why = f"Node didn't have enough resource: {resource}, requested: {requested}, used: {used}"
    return Rejection(f"OutOf{resource}", f"{why}, capacity: {capacity}")


def node_fit(node: SimNode, spec: RunSpec, extended: bool = False) -> Rejection | None:
    """The kubelet's admission fit; `extended`: the pod's `nvidia.com/gpu` is served by a DRA
    claim the scheduler made (KEP-5004), so the node's allocatable is not asked for it."""
    active = [p for p in node.pods if not (p.terminated or p.stopped)]
    for rejection in (
        fit(spec.cpu_milli, sum(p.cpu_milli for p in active), CPU_ALLOCATABLE_MILLI, "cpu"),
        fit(spec.memory, sum(p.memory_bytes for p in active), MEMORY_ALLOCATABLE, "memory"),
    ):
        if rejection is not None:
            return rejection
    if node.is_dra:
        # DRA nodes advertise no nvidia.com/gpu
        return None if extended else fit(spec.gpus, 0, 0, spec.resource)
    if spec.resource != node.group.resource:
        return fit(spec.gpus, 0, 0, spec.resource)  # a resource the node does not advertise
    per_gpu = node.group.slots_per_gpu
    total = len(node_slots(node.group))
    healthy = max(0, node.allocatable_written) * per_gpu
    return fit(spec.gpus, total - len(node.free), healthy, spec.resource)


def start_error(spec: RunSpec) -> RunSpec:
    """The runtime could not create the containers: they fail at once, nothing runs."""
    return replace(
        spec, run_seconds=0.0, exit_code=START_ERROR_EXIT_CODE, program=None, init=(), init_seconds=()
    )


def scenario_spec(spec: RunSpec) -> RunSpec:
    """A scenario pod's containers run until stopped and exit promptly on SIGTERM."""
    return replace(
        spec,
        run_seconds=None,
        exit_code=0,
        stop_after=0.0,
        gpus=0,
        cpu_milli=0,
        memory=0,
        program=None,
        visible=(),
        init=(),
        init_seconds=(),
    )


def claim_names(obj: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """The pod's claims: each `spec.resourceClaims` entry with its ResourceClaim's name (None while
    not generated), then the special claim of its DRA-backed extended resources (entry `{}`)."""
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (obj.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    refs: list[tuple[dict[str, Any], str | None]] = [
        (c, c.get("resourceClaimName") or generated.get(c.get("name")))
        for c in (obj.get("spec") or {}).get("resourceClaims") or ()
    ]
    special = extended_claim(obj)
    if special is not None:
        refs.append(({}, special))
    return refs


def extended_claim(obj: dict[str, Any]) -> str | None:
    """The special claim of a pod whose extended resources DRA serves (KEP-5004), as the scheduler
    recorded it in `status.extendedResourceClaimStatus`; None for any other pod."""
    status = (obj.get("status") or {}).get("extendedResourceClaimStatus")
    name = status.get("resourceClaimName") if isinstance(status, dict) else None
    return name if isinstance(name, str) and name else None


def claim_status_name(spec: dict[str, Any], pod_claim: str) -> str:
    """The name `allocatedResourcesStatus` gives the devices of `pod_claim` (its container's reference)."""
    for container in spec.get("containers") or ():
        for ref in (container.get("resources") or {}).get("claims") or ():
            if ref.get("name") == pod_claim:
                return objects.allocated_resource_name(ref)
    return objects.allocated_resource_name({"name": pod_claim})
