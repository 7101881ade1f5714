"""The scenario model: the frozen data a scenario means, and the pod layout it implies.

Pure data and pure functions, no I/O and no imports from the rest of the simulator: the
scenario parser (`simulator.scenario`) builds these objects from YAML, the fleet
(`simulator.fleet`) runs them. The first-fit layout of the workloads' pods lives here too
because both sides need the same answer: validation refuses a fleet too small for its
workloads (a `ScenarioError` naming the workload), and the fleet builds exactly that layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuhealth.plugin_resources import GPU_RESOURCE, mig_resource

DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
DRA_DRIVER = "gpu.nvidia.com"

KEP4680_DRIVER = "kep4680"
"""The default DRA driver profile: an idealised NVIDIA driver that streams device health to the
kubelet (KEP-4680) and lifts its own Unhealthy taint at the next Healthy report."""
NVIDIA_DRIVER = "nvidia"
"""The NVIDIA DRA driver as it is (`kubernetes-sigs/dra-driver-nvidia-gpu` with its
NVMLDeviceHealthCheck gate): no KEP-4680 stream (the kubelet reports its devices Unknown), the
device taints `gpu.nvidia.com/xid`, `gpu.nvidia.com/gpu-lost` and `gpu.nvidia.com/unmonitored`,
kept until its kubelet plugin restarts."""
DRA_DRIVER_PROFILES = (KEP4680_DRIVER, NVIDIA_DRIVER)

DEVICE_FAULTS = frozenset(
    {"device-unhealthy", "device-unknown", "flap", "xid", "ecc", "row-remap-failure", "gpu-lost"}
    | {"health-watch"}
)
NODE_FAULTS = frozenset(
    {"kubelet-stop", "node-partition", "health-stream-broken", "health-stream-stale", "dra-plugin-restart"}
    | {"device-plugin-restart"}
)
FAULT_KINDS = DEVICE_FAULTS | NODE_FAULTS | {"recover"}
ACTIONS = frozenset({"scale", "delete-pods"})
"""Timeline entries that are a person's doing through the API (`action:`), not the hardware's:
`kubectl scale` of a Deployment (a patch of its `spec.replicas`), `kubectl delete pods -l`."""

CHECKPOINT_AFTER = 10.0
"""Default simulated seconds a workload's checkpoint agent takes to commit a requested checkpoint."""

DCGM_HOST_LABELS = ("hostname", "Hostname")
"""The label dcgm-exporter names the node with: `hostname` since its 2026 rename, `Hostname` before."""
DCGM_HEALTH_WATCHES = (
    "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL",
)  # fmt: skip
"""The health watches dcgm-exporter reports per GPU (`health_watch` of DCGM_EXP_GPU_HEALTH_STATUS)."""

# XIDs the NVIDIA device plugin and DRA driver ignore by default: application errors, not hardware.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class Settings:
    """Simulated periods, in simulated seconds (`--speed X` divides each by X in wall time)."""

    lease_renew_interval: float = 10.0
    """How often each kubelet renews its Lease (kubelet default 10 s)."""
    lease_duration_seconds: int = 40
    """Lease `spec.leaseDurationSeconds` (kubelet default 40 s)."""
    status_sync_interval: float = 10.0
    """Periodic pod status sync of each kubelet, where lazy DRA expiry is evaluated."""
    dra_health_timeout: float = 30.0
    """A DRA device whose last health report is older than this becomes Unknown (kubelet default 30 s)."""
    node_monitor_grace_period: float = 40.0
    """Without a Lease renewal for this long, the node lifecycle controller marks the node Unknown."""
    scheduler_initial_backoff: float = 1.0
    """An unschedulable pod's first retry after this long, doubling per attempt (kube-scheduler: 1 s)."""
    scheduler_max_backoff: float = 10.0
    """The longest wait between retries of an unschedulable pod (kube-scheduler: 10 s)."""
    seed: int = 0
    """Seeds generated names (pod suffixes, claim names) and each kubelet's choice among free devices
    (`simulator.fleet.device_manager`), so a scenario builds and places the same objects each run."""


MIG_SINGLE = "single"
MIG_MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class MigLayout:
    """MIG on every GPU of a node group: each card split alike into `partitions` instances of
    `profile` (`1g.10gb`: one compute slice, 10 GB), as the MIG manager lays them out.

    How the NVIDIA device plugin advertises them (`strategy`, `docs/scenarios.md`): `single`
    as `nvidia.com/gpu`, one device per partition; `mixed` as `nvidia.com/mig-<profile>`. Either
    way a partition's device ID is its MIG UUID, and a fault of the card is a fault of every
    partition on it. On DRA (the NVIDIA DRA driver's profile) the driver publishes each partition
    as a ResourceSlice device of its own (`simulator.fleet.mig.dra_device_name`) and `strategy`,
    the device plugin's, is `single`, unused."""

    strategy: Literal["single", "mixed"]
    profile: str
    partitions: int

    @property
    def resource(self) -> str:
        """The extended resource the device plugin advertises the partitions as."""
        return GPU_RESOURCE if self.strategy == MIG_SINGLE else mig_resource(self.profile)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    name: str
    count: int
    name_prefix: str
    gpus_per_node: int
    path: Literal["device-plugin", "dra"]
    shared_replicas: int
    """Device-plugin time-slicing: replicas per GPU (`<uuid>::<n>`); 0 means no sharing."""
    product: str
    memory: str
    labels: Mapping[str, str]
    line: int | None = None
    dra_driver: str = KEP4680_DRIVER
    """DRA groups: which DRA driver profile serves the nodes (`DRA_DRIVER_PROFILES`); one per fleet."""
    extended_resource: bool = False
    """DRA only: the driver's DeviceClass carries `extendedResourceName: nvidia.com/gpu` (KEP-5004),
    so pods that request `nvidia.com/gpu` are served by DRA on these nodes (their allocatable has
    none of it). A DeviceClass is cluster-wide: every DRA group of a scenario says the same."""
    dcgm_host_label: str | None = None
    """dcgm-exporter runs on these nodes and names the node with this label (`hostname` or
    `Hostname`, `DCGM_HOST_LABELS`); None: no dcgm-exporter."""
    mig: MigLayout | None = None
    """MIG partitions on every GPU of the group (device-plugin path, or DRA with the `nvidia`
    driver profile); None: whole GPUs."""
    resource_health_status: bool = True
    """The kubelets' `ResourceHealthStatus` feature: False, as before Kubernetes 1.36 or with the
    gate off, they write no pod's `allocatedResourcesStatus` (nothing in a pod's status names its
    devices or their health)."""

    def node_names(self) -> list[str]:
        return [f"{self.name_prefix}{i}" for i in range(self.count)]

    @property
    def slots_per_gpu(self) -> int:
        """Allocatable units per GPU: its MIG partitions, its time-slicing replicas, or 1."""
        if self.mig is not None:
            return self.mig.partitions
        return max(1, self.shared_replicas)

    @property
    def resource(self) -> str:
        """The extended resource a device-plugin node advertises its GPUs as."""
        return self.mig.resource if self.mig is not None else GPU_RESOURCE


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    namespace: str
    kind: Literal["Deployment", "Job"]
    replicas: int
    gpus_per_pod: int
    checkpoint: Literal["annotation", "none"]
    topology: Literal["fixed", "shardable"]
    path: Literal["device-plugin", "dra"] | None
    """Place pods only on nodes of this path; None: any."""
    node_group: str | None
    """Place pods only on nodes of this group; None: any."""
    init_container: bool
    dra_claim: Literal["template", "direct"]
    """DRA pods reference a claim generated from a template, or a claim created up front."""
    dra_status_name: Literal["request", "claim"]
    """`allocatedResourcesStatus[].name` form: `claim:gpus/gpus` (request) or `claim:gpus` (claim)."""
    complete_after: float | None
    """Job pods succeed this many simulated seconds after start (then they are never updated)."""
    line: int | None = None
    checkpoint_after: float | None = CHECKPOINT_AFTER
    """checkpoint: annotation: simulated seconds from a checkpoint request to its commit; None: never."""
    checkpoint_fails: bool = False
    """checkpoint: annotation: the agent answers every request with a failure instead of a commit."""
    serving_gate: bool = False
    """The pods declare the readiness gate `gpuhealth.io/serving` and the workload sets the
    condition True once it serves (`docs/workloads.md`, stopping new requests)."""
    resource: str = GPU_RESOURCE
    """The extended resource its pods request on the device-plugin path: `nvidia.com/gpu`, or on a
    group of MIG strategy mixed (which it must name as its `node_group`) `nvidia.com/mig-<profile>`."""
    canary: bool = False
    """The workload opts in to devices on gpuhealth's ramp: its pods carry the label
    `gpuhealth.io/canary-ok: "true"` (device plugins: the scheduler extender admits them), its DRA
    claim request tolerates the `gpuhealth.io/canary` taint."""
    error_ratio: float = 0.0
    """Share of its requests the workload fails on its own, whatever its devices (an application
    bug, a bad deployment): the business SLO failing on healthy devices (`docs/layers.md`)."""
    extended_resource: bool = False
    """The pods are written for device plugins (`nvidia.com/gpu: N` in the container's requests,
    no claim); on a DRA node the scheduler serves them through the DeviceClass that maps the
    resource (KEP-5004): a special ResourceClaim and `status.extendedResourceClaimStatus`."""


@dataclass(frozen=True, slots=True)
class DeviceRef:
    node: str
    gpu: int


@dataclass(frozen=True, slots=True)
class Fault:
    """One timeline entry; which optional fields are set depends on `kind`."""

    at: float
    kind: str
    device: DeviceRef | None = None
    node: str | None = None
    duration: float | None = None
    times: int | None = None
    period: float | None = None
    xid: int | None = None
    message: str | None = None
    unhealthy: bool | None = None
    corrected: int = 0
    uncorrected: int = 0
    line: int | None = None
    reset: Literal["clears", "fails"] | None = None
    """device-unhealthy: the fault leaves the card needing a reset (a GPU program on it fails
    until one): `clears` a reset clears it (a sticky fatal XID's state), `fails` no reset can
    (a hardware fault: the card stays failed); None: no reset is needed."""
    watch: str | None = None
    """health-watch: the DCGM health watch that fails (`DCGM_HEALTH_WATCHES`) until the device recovers."""
    namespace: str | None = None
    """Actions: the namespace of the Deployment scaled or of the pods deleted."""
    workload: str | None = None
    """scale: the Deployment's name (a workload of the scenario)."""
    replicas: int | None = None
    """scale: the Deployment's new `spec.replicas`."""
    selector: str | None = None
    """delete-pods: the label selector of the pods deleted (`kubectl delete pods -l`)."""

    @property
    def is_action(self) -> bool:
        """A person's doing through the API (`ACTIONS`), not a fault of the hardware."""
        return self.kind in ACTIONS

    def target(self) -> str:
        if self.device is not None:
            return f"{self.device.node}/gpu-{self.device.gpu}"
        if self.kind == "scale":
            return f"deployment {self.namespace}/{self.workload}"
        if self.kind == "delete-pods":
            where = f" on {self.node}" if self.node is not None else ""
            return f"pods -n {self.namespace} -l {self.selector}{where}"
        return self.node or "?"

    def describe(self) -> str:
        """One line for progress output."""
        parts = [self.kind, self.target()]
        if self.xid is not None:
            parts.append(f"xid={self.xid}")
        if self.kind == "ecc":
            parts.append(f"corrected+={self.corrected} uncorrected+={self.uncorrected}")
        if self.watch is not None:
            parts.append(f"watch={self.watch}")
        if self.replicas is not None:
            parts.append(f"replicas={self.replicas}")
        if self.times is not None:
            parts.append(f"times={self.times} period={_fmt_seconds(self.period or 0)}")
        if self.duration is not None:
            parts.append(f"for {_fmt_seconds(self.duration)}")
        if self.reset is not None:
            parts.append(f"(needs a reset, which {'clears it' if self.reset == 'clears' else 'fails'})")
        note = _FAULT_NOTES.get(self.kind)
        if self.kind == "xid" and not self.unhealthy:
            note = "application error: device health unchanged"
        if note:
            parts.append(f"({note})")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": self.at, ("action" if self.is_action else "fault"): self.kind}
        if self.device is not None:
            out["device"] = {"node": self.device.node, "gpu": self.device.gpu}
        if self.node is not None:
            out["node"] = self.node
        for key, value in (
            ("duration", self.duration),
            ("times", self.times),
            ("period", self.period),
            ("xid", self.xid),
            ("message", self.message),
            ("unhealthy", self.unhealthy),
            ("reset", self.reset),
            ("watch", self.watch),
            ("namespace", self.namespace),
            ("workload", self.workload),
            ("replicas", self.replicas),
            ("selector", self.selector),
        ):
            if value is not None:
                out[key] = value
        if self.kind == "ecc":
            out["corrected"] = self.corrected
            out["uncorrected"] = self.uncorrected
        return out


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    settings: Settings
    fleet: tuple[NodeGroup, ...]
    workloads: tuple[Workload, ...]
    timeline: tuple[Fault, ...]
    nodes: Mapping[str, NodeGroup] = field(default_factory=dict)
    """Every node name -> its group."""
    demo: Mapping[str, Any] = field(default_factory=dict)
    """How `gpuhealth demo` runs it (replicas, process kills...): read and checked by the demo only."""
    responder: Mapping[str, Any] = field(default_factory=dict)
    """Responder configuration overrides (the `--config` schema) for this scenario; checked by the demo."""
    expect: Mapping[str, Any] = field(default_factory=dict)
    """The outcome the scenario must produce end to end; checked by the demo (`demo.expectations`)."""
    janitor: float | None = None
    """A reset controller (NVSentinel's janitor, `simulator.fleet.janitor`) runs in the cluster
    and takes this many simulated seconds per GPU reset; None: none is installed."""

    def gpu_count(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.fleet)

    def dra_driver(self) -> str | None:
        """The DRA driver profile of the fleet's DRA nodes (one per fleet); None without DRA nodes."""
        return next((g.dra_driver for g in self.fleet if g.path == DRA), None)


_FAULT_NOTES = {
    "device-unknown": "the driver stops reporting; DRA: Unknown after the timeout, at a sync",
    "ecc": "NVML counters only",
    "row-remap-failure": "NVML counters only",
    "health-watch": "DCGM's health watch only: the driver and the kubelet see nothing",
    "health-stream-broken": "DRA: all devices Unknown; device plugin: all Unhealthy",
    "health-stream-stale": "DRA: the plugin crash-loops, pod status keeps its last health (lazy expiry)",
    "dra-plugin-restart": "the NVIDIA DRA driver's kubelet plugin restarts: its device taints are gone",
    "device-plugin-restart": "the NVIDIA device plugin restarts: every device Healthy until a new fault",
}


def _fmt_seconds(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


# ---------------------------------------------------------------------------- the pods' layout


@dataclass(frozen=True, slots=True)
class Slot:
    """One allocatable unit: a whole GPU, or one time-slicing replica of it."""

    gpu: int
    replica: int | None = None
    """The time-slicing replica, or on a MIG card the partition; None: the whole GPU."""


@dataclass(frozen=True, slots=True)
class PodPlacement:
    workload: int
    """Index of the workload in the scenario."""
    ordinal: int
    """The pod's number within its workload (0..replicas-1)."""
    node: str
    slots: tuple[Slot, ...]


class PlacementError(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


def node_slots(group: NodeGroup) -> list[Slot]:
    """A node's slots in allocation order.

    Shared replicas are ordered replica-major, so consecutive pods land on different GPUs
    before a GPU is shared (what time-slicing users expect from a balanced plugin).
    """
    if group.mig is not None:
        # Partitions card by card: a MIG card is filled before the next one is used, as the
        # plugin lists a node's MIG devices parent by parent.
        return [Slot(g, p) for g in range(group.gpus_per_node) for p in range(group.mig.partitions)]
    if group.shared_replicas:
        return [Slot(g, r) for r in range(group.shared_replicas) for g in range(group.gpus_per_node)]
    return [Slot(g) for g in range(group.gpus_per_node)]


def eligible(workload: Workload, group: NodeGroup) -> bool:
    if workload.node_group is not None and workload.node_group != group.name:
        return False
    if workload.extended_resource and group.path == DRA and not group.extended_resource:
        return False  # no DeviceClass maps `nvidia.com/gpu` there: nothing can serve the request
    if group.resource != workload.resource:
        return False  # a MIG mixed group offers only its `nvidia.com/mig-<profile>`
    return workload.path is None or workload.path == group.path


def place_workloads(scenario: Scenario) -> list[PodPlacement]:
    """First-fit placement of every workload pod, in scenario order; PlacementError when one does not fit."""
    nodes: list[tuple[str, NodeGroup]] = [(name, g) for g in scenario.fleet for name in g.node_names()]
    slots_of = {g.name: node_slots(g) for g in scenario.fleet}
    used = dict.fromkeys((name for name, _ in nodes), 0)
    out: list[PodPlacement] = []
    for wi, workload in enumerate(scenario.workloads):
        candidates = [(name, g) for name, g in nodes if eligible(workload, g)]
        if workload.replicas and not candidates:
            raise PlacementError(
                wi,
                f"no node in the fleet matches the workload's path or nodeGroup and offers "
                f"{workload.resource} (a MIG group of strategy mixed offers only its "
                "nvidia.com/mig-<profile>, to workloads naming it)",
            )
        cursor = 0  # free slots only shrink, so the first node that fits moves forward
        for ordinal in range(workload.replicas):
            while cursor < len(candidates):
                name, group = candidates[cursor]
                if len(slots_of[group.name]) - used[name] >= workload.gpus_per_pod:
                    break
                cursor += 1
            else:
                free = sum(len(slots_of[g.name]) - used[n] for n, g in candidates)
                raise PlacementError(
                    wi,
                    f"{workload.replicas} pods of {workload.gpus_per_pod} GPUs do not fit: "
                    f"only {ordinal} placed ({free} GPU slots left on matching nodes)",
                )
            start = used[name]
            used[name] = start + workload.gpus_per_pod
            out.append(PodPlacement(wi, ordinal, name, tuple(slots_of[group.name][start : used[name]])))
    return out
