"""The kubelet's pod workers: every pod bound to a simulated node runs, and deleted pods stop gracefully.

Pods the scenario creates are started by the scheduler and the job controller; a pod created
through the API with `spec.nodeName` set (by a client, or bound by a scheduler) is run here,
as a kubelet runs what the API server assigns to its node:

- admission: CPU, memory and `nvidia.com/gpu` must fit what the node has left, else phase
  Failed with reason `OutOf<resource>` (`OutOfcpu`, `OutOfnvidia.com/gpu`); GPUs are allocated
  as the device manager does (any free device the plugin reports Healthy, nothing outside the
  kubelet consulted, no annotation read), except that beside a control plane the fleet does not
  own a scenario's initial pods, until its timeline starts, get the slots its layout gives them
  (`initial_layout`: the scenario's fixture, not a kubelet's behaviour); DRA devices come from
  the claims' `status.allocation`;
- the NVIDIA container runtime: a pod that gets no device from the device plugin or a claim
  reaches the GPUs its containers' `NVIDIA_VISIBLE_DEVICES` names (`visible_gpus`), as
  dcgm-exporter does; the kubelet knows nothing of it (no allocation, no
  `allocatedResourcesStatus`), so the device plugin may still hand the same GPU to another pod;
- start: status Pending (ContainerCreating), then Running with conditions, container
  statuses, IPs, QoS class and `allocatedResourcesStatus` (kept by the kubelet's status sync
  like every other pod's), with the events Pulled, Created and Started;
- a finite run (`sleep N` in the container's command or args, or the annotation
  `sim.gpuhealth.io/run-seconds`) ends with the exit code `sim.gpuhealth.io/exit-code` (default
  0): Succeeded or Failed, or a restart after a back-off (event BackOff) under `restartPolicy`
  Always / OnFailure;
- a GPU program (`GPU_PROGRAMS`: the CUDA sample `vectorAdd`) runs for its usual length unless
  told otherwise, and exits 0 when every device it reached (allocated or visible) stayed Healthy
  and reachable for its whole run, 1 otherwise (also when it reached none): the outcome follows
  the device the pod really got, whatever the pod was meant to test;
- containers of DCGM's image and of gpuhealth's run as real processes (`programs`): `dcgmi`
  answers only where the container started a `nv-hostengine`, and its diagnostic fails on a GPU
  that failed during the container's run as a GPU program's would; a DCGM program in any other
  image cannot start (StartError);
- init containers run one at a time before the containers, each to its end; one that fails
  fails the pod under restartPolicy Never (the containers never start), else it is restarted
  after a back-off;
- graceful deletion (any pod of a simulated node): event Killing, the workload exits (143, as
  SIGTERM leaves a process: the pod Failed, never Succeeded) when it has committed a requested
  checkpoint, after `sim.gpuhealth.io/stop-after` (default 0: at once; `never`: ignores
  SIGTERM) or is killed at the end of the grace period (exit 137); devices are freed and the
  pod is deleted with a grace period of 0.

Decisions (what a pod asks for, whether it fits) are pure functions at the top; the class
applies them through the node agents' `NodeApi`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.plugin_resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import mig, objects, programs
from simulator.fleet.checkpoint_agent import CheckpointAgent
from simulator.fleet.container_runtime import ContainerRuntime, finished_state, marks
from simulator.fleet.device_manager import allocate
from simulator.fleet.health import HEALTHY
from simulator.fleet.initial_layout import InitialLayout
from simulator.fleet.node_api import NodeApi, PodEntry
from simulator.fleet.state import DeviceDriver, PendingPod, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.fleet.writes import PodStatusWriter, keep_others_conditions
from simulator.model import DRA_DRIVER, Settings, Slot, Workload, node_slots

log = logging.getLogger(__name__)

RUN_SECONDS = "sim.gpuhealth.io/run-seconds"
EXIT_CODE = "sim.gpuhealth.io/exit-code"
STOP_AFTER = "sim.gpuhealth.io/stop-after"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's variable: which of the node's GPUs a container sees."""

START_SECONDS = 1.0
"""Simulated seconds from admission (ContainerCreating) to Running: image present, no pull."""
START_ERROR_EXIT_CODE = 128
"""A container the runtime could not create (here: `NVIDIA_VISIBLE_DEVICES` names a GPU the
node lacks, which nvidia-container-cli refuses): Failed at once, as the kubelet's StartError."""
BACKOFF_SECONDS, BACKOFF_LIMIT = 10.0, 300.0
"""The kubelet's crash-loop back-off: 10 s, doubled per restart, at most 5 minutes."""
KILLED_EXIT_CODE = 137  # SIGKILL at the end of the grace period
TERMINATED_EXIT_CODE = 143
"""A workload that stops on SIGTERM exits as the signal's default action leaves it (128 + 15): a
Job's pod asked to stop did not complete its work, so the Job controller replaces it rather than
count a completion (docs/workloads.md)."""

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

_API_WORKLOAD = Workload(
    name="", namespace="", kind="Deployment", replicas=0, gpus_per_pod=0, checkpoint="none",
    topology="fixed", path=None, node_group=None, init_container=False, dra_claim="direct",
    dra_status_name="claim", complete_after=None,
)  # fmt: skip
"""What an API pod's `SimPod.workload` holds: no scenario workload (never replaced, never a Job)."""


# ---------------------------------------------------------------------------- decisions


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


# ---------------------------------------------------------------------------- the pod workers


@dataclass(slots=True)
class _Run:
    sim: SimPod
    obj: dict[str, Any]
    spec: RunSpec
    admitted: float
    """Wall time of admission (the pod's startTime)."""
    token: int = 0
    restarts: int = 0
    started_wall: float = 0.0
    terminating: bool = False
    grace: float = 0.0
    """Seconds of the grace period the kubelet is honouring (a later, shorter one replaces it)."""
    visible: tuple[int, ...] = ()
    """GPUs (indexes) the runtime exposes through `NVIDIA_VISIBLE_DEVICES`, beside any allocated."""
    marks: tuple[tuple[int, int, bool], ...] = ()
    """Per GPU the containers reach, at their last start: (index, its `unhealthy_reports`,
    whether it was Unhealthy then), what a GPU program's verdict compares against."""
    init_done: int = 0
    """Init containers that completed."""
    sandbox: programs.Sandbox | None = None
    """The pod's folders, once a container of it ran as a real process."""


class PodRunner:
    """The pod workers of every simulated kubelet (one object for all nodes, as `Kubelet`).

    Owns the API pods' `SimPod` records (adding them to `pods` and their node) and every pod's
    graceful stop; the kubelet's status sync keeps their device health as for any pod.
    """

    def __init__(
        self,
        api: NodeApi,
        settings: Settings,
        timers: Timers,
        nodes: Mapping[str, SimNode],
        pods: dict[str, SimPod],
        pending: Mapping[str, PendingPod],
        drivers: Mapping[str, DeviceDriver],
        pod_status: PodStatusWriter,
        agent: CheckpointAgent,
        allocated: Callable[[SimPod, SimNode], list[dict[str, Any]]],
        terminating: Callable[[SimPod], None],
        layout: InitialLayout | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._timers = timers
        self._nodes = nodes
        self._pods = pods
        self._pending = pending
        self._drivers = drivers
        self._pod_status = pod_status
        self._agent = agent
        self._allocated = allocated
        self._terminating = terminating
        """Told when a pod gets its deletionTimestamp (controllers replace Terminating pods at once)."""
        self._layout = layout
        """The scenario's initial pods' devices, where the fleet does not write those pods itself."""
        self._runs: dict[str, _Run] = {}
        self._failing: set[str] = set()  # `fail`: each start fails its startup probe, backs off
        self._owed: dict[str, set[str]] = {}
        """Pods whose kubelet could not act (stopped, partitioned), by node: looked at again at its sync."""
        self._event_seq = itertools.count()
        self._runtime = ContainerRuntime(
            api, timers, settings, nodes, self._write, self._event, self._step_at,
            current=lambda run, token: token == run.token and self._runs.get(run.sim.key) is run,
            start=self._start, back_off=self._back_off,
        )  # fmt: skip
        self._pod_index = itertools.count(1 << 22)  # pod IPs apart from the scenario's pods

    # ------------------------------------------------------------------ what the API server asks

    def runs(self, pod_obj: dict[str, Any]) -> bool:
        """Whether a simulated kubelet runs the pod (bound to a simulated node): its DELETE is graceful."""
        return (pod_obj.get("spec") or {}).get("nodeName") in self._nodes

    def observe(self, etype: str, entry: PodEntry) -> None:
        """A pod was added or changed (the kubelet's pod watch)."""
        key = f"{entry.namespace}/{entry.name}"
        sim = self._pods.get(key)
        if sim is None:
            if key in self._pending:
                return
            fields = entry.fields or {}
            node = self._nodes.get(fields.get("spec.nodeName", ""))
            if node is None or fields.get("status.phase", "Pending") not in ("", "Pending"):
                return
            self._pod_seen(node, entry.load())
            return
        data = entry.data
        if b"deletionTimestamp" in data or b"checkpoint-requested" in data or b"readinessGates" in data:
            self._pod_changed(sim, entry.load())

    def created(self, node: SimNode, obj: dict[str, Any]) -> None:
        """A pod the node's own agents created bound to it (a DaemonSet's): run it, as one watched."""
        self._pod_seen(node, obj)

    def _pod_seen(self, node: SimNode, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(key)
            return
        if obj["metadata"].get("deletionTimestamp"):
            self._remove(obj["metadata"]["namespace"], obj["metadata"]["name"])  # never started
            return
        self._admit(node, obj)

    def _pod_changed(self, sim: SimPod, obj: dict[str, Any]) -> None:
        if obj["metadata"].get("uid") not in (None, "", sim.uid) and sim.uid:
            return  # a different pod of the same name; its predecessor's DELETED is still to come
        if obj["metadata"].get("deletionTimestamp"):
            self._terminate(sim, obj)
        elif sim.ready and (obj.get("spec") or {}).get("readinessGates"):
            self._pod_status.gates_changed(sim, obj)
        self._agent.observe(sim, obj)

    def node_synced(self, node: SimNode) -> None:
        """The node's kubelet syncs (so it writes): do what it owed while it could not."""
        keys = self._owed.pop(node.name, None)
        for key in sorted(keys or ()):
            namespace, name = key.split("/", 1)
            try:
                obj = self._api.get("pods", name, namespace)
            except ApiError:
                continue
            sim = self._pods.get(key)
            if sim is None:
                if obj.get("spec", {}).get("nodeName") == node.name:
                    phase = (obj.get("status") or {}).get("phase", "Pending")
                    if phase in ("", "Pending"):
                        self._pod_seen(node, obj)
            elif obj["metadata"].get("deletionTimestamp"):
                self._terminate(sim, obj)
            else:
                run = self._runs.get(key)
                if run is not None and run.sim.waiting and not run.sim.terminated:
                    self._start(run, run.token)

    def fail(self, key: str, failing: bool) -> None:
        """The pod's containers fail their probes (restarted with back-off, never Ready) or work again."""
        (self._failing.add if failing else self._failing.discard)(key)
        run = self._runs.get(key)
        up = run is not None and not (run.sim.waiting or run.sim.terminated or run.terminating)
        if failing and run is not None and up and self._nodes[run.sim.node].writes:
            run.token += 1
            self._back_off(run, self._nodes[run.sim.node], 1)

    def resync(self, entries: list[PodEntry]) -> None:
        """After the watch fell behind: every pod looked at again."""
        for entry in entries:
            self.observe("MODIFIED", entry)

    def gone(self, sim: SimPod) -> None:
        """The pod is gone from the API (the kubelet forgot it)."""
        run = self._runs.pop(sim.key, None)
        if run is not None:
            run.token += 1
            self._runtime.close(run)
        if not sim.stopped:
            self._agent.stopped(sim, succeeded=sim.terminated)

    # ------------------------------------------------------------------ admission

    def _admit(self, node: SimNode, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        spec = run_spec(obj)
        sim = SimPod(meta["name"], meta["namespace"], node.name, _API_WORKLOAD, (), uid=meta.get("uid", ""))
        sim.api = True
        sim.containers = tuple(obj["spec"].get("containers") or ())
        if spec.resource != GPU_RESOURCE:
            sim.resource_name = spec.resource  # allocatedResourcesStatus[].name: what it asked for
        sim.cpu_milli = spec.cpu_milli
        sim.memory_bytes = spec.memory
        sim.index = next(self._pod_index)
        rejection = node_fit(node, spec, extended_claim(obj) is not None)
        slots: tuple[Slot, ...] = ()
        if rejection is None:
            if node.is_dra:
                found = self._prepare_claims(node, sim, obj)
                if found is None:
                    # Claims not allocated yet: the kubelet waits (ContainerCreating) and retries.
                    self._owed.setdefault(node.name, set()).add(sim.key)
                    return
                slots = found
            else:
                picked = self._pick_devices(node, spec, obj)
                if isinstance(picked, Rejection):
                    rejection = picked
                else:
                    slots = picked
        if rejection is not None:
            self._reject(node, obj, rejection)
            return
        visible: tuple[int, ...] = ()
        if not slots and spec.visible:
            # No device from the kubelet: the runtime exposes what the env names (the
            # kubelet's allocation, when there is one, is what the container gets instead).
            found_visible = visible_gpus(
                spec.visible, tuple(g.uuid for g in node.gpus), tuple(g.partitions for g in node.gpus)
            )
            if found_visible is None:
                spec = _start_error(spec)
            else:
                visible = found_visible
        if any(programs.missing_program(c) for c in (*spec.init, *spec.containers)):
            spec = _start_error(spec)  # `exec: "dcgmi": executable file not found`
        sim.slots = slots
        for slot in slots:
            if slot in node.free:
                node.free.remove(slot)
            node.gpus[slot.gpu].allocated += 1
        sim.waiting = True
        sim.ready = False
        wall = self._timers.wall()
        sim.started = wall
        run = _Run(sim, obj, spec, wall, visible=visible)
        self._runs[sim.key] = run
        self._pods[sim.key] = sim
        node.pods.append(sim)
        node.last_sig = None
        self._write(sim, lambda o: _creating(o, run.spec, run.admitted, objects.node_ip(node.index)))
        self._step_at(self._timers.now() + START_SECONDS, self._start, run, run.token)
        self._timers.wake()

    def _pick_devices(
        self, node: SimNode, spec: RunSpec, pod: dict[str, Any]
    ) -> tuple[Slot, ...] | Rejection:
        """Among free devices the plugin reports Healthy: a scenario's initial pod its layout slots
        (`initial_layout`, beside a control plane the fleet does not own), else the device
        manager's choice (`device_manager`)."""
        driver = self._drivers[node.group.path]
        now = self._timers.now()
        usable = [s for s in node.free if driver.health(node, node.gpus[s.gpu], now)[0] == HEALTHY]
        claimed = None if self._layout is None else self._layout.claim(node.name, pod, spec.gpus, usable)
        picked = claimed or allocate(node, usable, spec.gpus)
        if picked is None:
            return Rejection(
                "UnexpectedAdmissionError",
                f"Allocate failed due to requested number of devices unavailable for {spec.resource}. "
                f"Requested: {spec.gpus}, Available: {len(usable)}, which is unexpected",
            )
        return picked

    def _prepare_claims(self, node: SimNode, sim: SimPod, obj: dict[str, Any]) -> tuple[Slot, ...] | None:
        """DRA: the devices of the pod's claims as allocated (`status.allocation`); None until allocated."""
        spec = obj.get("spec") or {}
        slots: list[Slot] = []
        for pod_claim, name in claim_names(obj):
            if not name:
                return None
            try:
                claim = self._api.get("resourceclaims.resource.k8s.io", name, sim.namespace)
            except ApiError:
                return None
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                return None
            devices = [
                r["device"]
                for r in (allocation.get("devices") or {}).get("results") or ()
                if r.get("driver") == DRA_DRIVER and r.get("pool") == node.name
            ]
            if devices and sim.claim_uid is None:
                sim.claim_name = name
                sim.claim_uid = claim["metadata"].get("uid", "")
                sim.extended = not pod_claim
                if pod_claim:
                    sim.resource_name = _claim_status_name(spec, pod_claim.get("name", ""))
            named = mig.dra_slots(node.group.mig, len(node.gpus))
            slots.extend(named[d] for d in devices if d in named)
        return tuple(slots)

    def _reject(self, node: SimNode, obj: dict[str, Any], rejection: Rejection) -> None:
        wall = self._timers.wall()
        status = {
            "phase": "Failed",
            "reason": rejection.reason,
            "message": f"Pod was rejected: {rejection.message}",
            "startTime": format_timestamp(wall),
            "qosClass": qos_class(obj.get("spec") or {}),
        }

        def fn(o: dict[str, Any]) -> dict[str, Any]:
            o["status"] = status
            return o

        with contextlib.suppress(ApiError):
            self._api.mutate(
                "pods", obj["metadata"]["name"], obj["metadata"]["namespace"], fn, subresource="status"
            )
        self._event(obj, node, rejection.reason, rejection.message, warning=True)

    # ------------------------------------------------------------------ running

    def _start(self, run: _Run, token: int) -> None:
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or run.terminating:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        if sim.key in self._failing:  # it starts, and fails its startup probe
            run.started_wall = self._timers.wall()
            return self._back_off(run, node, 1)
        wall = self._timers.wall()
        run.started_wall = wall
        run.marks = marks(run, node)
        if run.init_done < len(run.spec.init):
            return self._runtime.start_init(run, node, wall)
        claim_statuses = (run.obj.get("status") or {}).get("resourceClaimStatuses")
        status = objects.pod_status(
            pod_obj=run.obj,
            node_index=node.index,
            pod_index=sim.index,
            started=run.admitted,
            ready=True,
            allocated=self._allocated(sim, node),
            claim_statuses=claim_statuses,
            qos_class=run.spec.qos,
            ready_after=wall - run.admitted,
        )
        restarts, previous = run.restarts, self._runtime.last_states(run)
        for cs in status["containerStatuses"]:
            cs["restartCount"] = restarts
            cs["lastState"] = previous.get(cs["name"], {})
            cs["containerID"] = objects.container_id(run.obj, cs["name"], restarts)

        def fn(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"] = keep_others_conditions(obj, status, format_timestamp(wall))
            return obj

        if not self._write(sim, fn):
            return
        sim.waiting = False
        sim.ready = True
        node.last_sig = None
        self._runtime.started(run, node, run.spec.containers)
        self._agent.serving(sim, run.obj)
        resumed = self._agent.started(sim, run.obj["metadata"])
        if run.spec.run_seconds is not None:
            remaining = max(0.0, run.spec.run_seconds - resumed)
            self._step_at(self._timers.now() + remaining, self._exited, run, run.token)

    def _exited(self, run: _Run, token: int) -> None:
        """The containers' run ended: restart (with back-off) or finish, as restartPolicy says."""
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or run.terminating:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._step_at(self._timers.now() + self._settings.status_sync_interval, self._exited, run, token)
            return
        code = self._runtime.exit_code(run, node, run.spec.containers[0])
        self._agent.stopped(sim, succeeded=code == 0)
        policy = run.spec.restart_policy
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            self._back_off(run, node, code)
            return
        self._finish(run, node, code)

    def _back_off(self, run: _Run, node: SimNode, code: int) -> None:
        sim = run.sim
        delay = min(BACKOFF_LIMIT, BACKOFF_SECONDS * 2**run.restarts)
        pod_ref = f"{sim.name}_{sim.namespace}({sim.uid})"
        if not self._write(sim, _crash_loop(code, run.started_wall, self._timers.wall(), delay, pod_ref)):
            return
        sim.waiting = True
        sim.ready = False
        run.restarts += 1
        for c in run.spec.containers:
            message = f"Back-off restarting failed container {c['name']} in pod {pod_ref}"
            self._event(run.obj, node, "BackOff", message, warning=True, container=c["name"])
        self._step_at(self._timers.now() + delay, self._start, run, run.token)

    def _finish(self, run: _Run, node: SimNode, code: int) -> None:
        """The containers exited and stay down: Succeeded or Failed, devices freed."""
        sim = run.sim
        if self._write(sim, _terminated(code, run.started_wall, self._timers.wall(), deleted=False)):
            sim.terminated = True
            sim.waiting = False
            node.release(sim)
            node.last_sig = None
            self._runtime.close(run)

    # ------------------------------------------------------------------ graceful termination

    def _terminate(self, sim: SimPod, obj: dict[str, Any]) -> None:
        """The pod got a deletionTimestamp: stop its containers within the grace period."""
        node = self._nodes.get(sim.node)
        if node is None or sim.stopped:
            return
        self._terminating(sim)  # the controllers see it whether or not the kubelet can act
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        if sim.terminated:
            self._remove(sim.namespace, sim.name)  # nothing runs: the kubelet deletes it at once
            return
        run = self._runs.get(sim.key)
        if run is None:  # a scenario pod: it runs its workload's containers
            spec = run_spec(obj) if sim.api else _scenario_spec(run_spec(obj))
            run = _Run(sim, obj, spec, sim.started, started_wall=sim.started)
            self._runs[sim.key] = run
        now = self._timers.now()
        grace = float(obj["metadata"].get("deletionGracePeriodSeconds") or 0)
        if run.terminating:
            # Any later change of the pod comes here too; only a shorter grace period matters.
            if grace < run.grace:
                run.grace = grace
                self._step_at(now + grace, self._kill, run, run.token, KILLED_EXIT_CODE)
                self._timers.wake()
            return
        run.terminating = True
        run.grace = grace
        run.token += 1
        for c in run.spec.containers:
            self._event(obj, node, "Killing", f"Stopping container {c['name']}", container=c["name"])
        if sim.waiting:
            self._kill(run, run.token, 0 if run.restarts == 0 else run.spec.exit_code)
            return
        deadline = now + grace
        commit = self._agent.commit_time(sim)
        if commit is not None:
            exit_at = commit
        elif run.spec.stop_after is not None:
            exit_at = now + run.spec.stop_after
        else:
            exit_at = deadline
        code = TERMINATED_EXIT_CODE if exit_at < deadline else KILLED_EXIT_CODE
        exit_at = min(exit_at, deadline)
        if exit_at <= now:
            self._kill(run, run.token, code)
        else:
            self._step_at(exit_at, self._kill, run, run.token, code)
            self._timers.wake()

    def _kill(self, run: _Run, token: int, code: int) -> None:
        sim = run.sim
        if token != run.token or self._runs.get(sim.key) is not run or sim.stopped:
            return
        node = self._nodes[sim.node]
        if not node.writes:
            self._owed.setdefault(node.name, set()).add(sim.key)
            return
        # Deleted before it finished: whatever it did since its last checkpoint is lost.
        self._agent.stopped(sim, succeeded=False)
        self._write(
            sim, _terminated(code, run.started_wall or sim.started, self._timers.wall(), deleted=True)
        )
        sim.stopped = True
        node.release(sim)
        node.last_sig = None
        self._runtime.close(run)
        self._remove(sim.namespace, sim.name)

    def _remove(self, namespace: str, name: str) -> None:
        """The kubelet's final delete once the containers are gone (finalizers may still hold the pod)."""
        with contextlib.suppress(ApiError):
            self._api.delete("pods", name, namespace, grace_period_seconds=0)

    # ------------------------------------------------------------------ writes

    def _step_at(self, when: float, step: Callable[..., None], *args: Any) -> None:
        """Run a pod worker's `step(*args)` at simulated `when`. A step whose write the API server
        could not take (5xx, 429, unreachable: an apiserver restarting) runs again a status sync
        later, as a real kubelet's pod worker syncs the pod again after an error; dropping it
        would leave the pod in ContainerCreating (or Running) for ever."""

        def attempt() -> None:
            try:
                step(*args)
            except ApiError as exc:
                if exc.code < 500 and exc.code != 429:
                    raise
                log.info("pod worker %s: %s; again in a status sync", getattr(step, "__name__", step), exc)
                self._timers.at(self._timers.now() + self._settings.status_sync_interval, attempt)

        attempt.__name__ = getattr(step, "__name__", "step")
        self._timers.at(when, attempt)

    def _write(self, sim: SimPod, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
        return self._pod_status.mutate(sim, fn)

    def _event(
        self,
        obj: dict[str, Any],
        node: SimNode,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        container: str | None = None,
    ) -> None:
        event = objects.event(
            pod_obj=obj, node_name=node.name, reason=reason, message=message, wall=self._timers.wall(),
            seq=next(self._event_seq), warning=warning, container=container,
        )  # fmt: skip
        # Events are best effort for a real kubelet too (a full or refusing API drops them).
        with contextlib.suppress(ApiError):
            self._api.create("events", event)


def _start_error(spec: RunSpec) -> RunSpec:
    """The runtime could not create the containers: they fail at once, nothing runs."""
    return replace(
        spec, run_seconds=0.0, exit_code=START_ERROR_EXIT_CODE, program=None, init=(), init_seconds=()
    )


def _scenario_spec(spec: RunSpec) -> RunSpec:
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


def _not_ready(ctype: str, ts: str, containers: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    names = ", ".join(c["name"] for c in containers)
    return {
        "type": ctype,
        "status": "False",
        "reason": "ContainersNotReady",
        "message": f"containers with unready status: [{names}]",
        "lastTransitionTime": ts,
    }


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


def _creating(obj: dict[str, Any], spec: RunSpec, admitted: float, host: str) -> dict[str, Any]:
    """The pod admitted on the node at `host`, its containers being created (phase Pending)."""
    ts = format_timestamp(admitted)
    has_init = bool((obj.get("spec") or {}).get("initContainers"))
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": ts},
        {"type": "Initialized", "status": "False" if has_init else "True", "lastTransitionTime": ts},
        _not_ready("Ready", ts, spec.containers),
        _not_ready("ContainersReady", ts, spec.containers),
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts},
    ]
    obj["status"] = {
        **(obj.get("status") or {}),
        "phase": "Pending",
        "conditions": conditions,
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "startTime": ts,
        "qosClass": spec.qos,
        "containerStatuses": [
            {
                "name": c["name"],
                "state": {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": c.get("image", ""),
                "imageID": "",
                "started": False,
            }
            for c in spec.containers
        ],
    }
    return obj


def _claim_status_name(spec: dict[str, Any], pod_claim: str) -> str:
    """The name `allocatedResourcesStatus` gives the devices of `pod_claim` (its container's reference)."""
    for container in spec.get("containers") or ():
        for ref in (container.get("resources") or {}).get("claims") or ():
            if ref.get("name") == pod_claim:
                return objects.allocated_resource_name(ref)
    return objects.allocated_resource_name({"name": pod_claim})


def _crash_loop(
    code: int, started: float, now: float, delay: float, pod_ref: str
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Every container exited with `code` and waits `delay` seconds in CrashLoopBackOff; not Ready."""
    t_start, t_now = format_timestamp(started), format_timestamp(now)

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj["status"]
        for cond in status.get("conditions", []):
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != "False":
                cond.update(status="False", reason="ContainersNotReady", lastTransitionTime=t_now)
        for cs in status.get("containerStatuses", []):
            message = f"back-off {delay:g}s restarting failed container={cs['name']} pod={pod_ref}"
            cs["lastState"] = {"terminated": finished_state(code, t_start, t_now, cs.get("containerID", ""))}
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            cs["ready"] = False
            cs["started"] = False
        return obj

    return fn


def _terminated(
    code: int, started: float, finished: float, *, deleted: bool
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Every container terminated with `code`; the pod Succeeded (all 0) or Failed."""
    t_start, t_end = format_timestamp(started), format_timestamp(finished)
    phase = "Succeeded" if code == 0 else "Failed"

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.setdefault("status", {})
        status["phase"] = phase
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        for cond in status.get("conditions", []):
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != "False":
                cond.update(status="False", reason=reason, lastTransitionTime=t_end)
        for cs in status.get("containerStatuses", []):
            running = (cs.get("state") or {}).get("running") or {}
            cs["state"] = {
                "terminated": finished_state(
                    code, running.get("startedAt") or t_start, t_end, cs.get("containerID", "")
                )
            }
            cs["ready"] = False
            cs["started"] = False
        if deleted and code == KILLED_EXIT_CODE:
            for cs in status.get("containerStatuses", []):
                cs["state"]["terminated"]["reason"] = "Error"
        return obj

    return fn
