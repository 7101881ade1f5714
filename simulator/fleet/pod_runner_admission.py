"""The kubelet's admission of a pod bound to its node, for the pod workers (`pod_runner`) only.

CPU, memory and `nvidia.com/gpu` must fit what the node has left, else the pod is rejected: phase
Failed with reason `OutOf<resource>` and a warning event. GPUs are allocated as the device manager
does (any free device the plugin reports Healthy, `device_manager`), except a scenario's initial
pods beside a control plane the fleet does not own (`initial_layout`); DRA devices come from the
claims' `status.allocation`, and a pod whose claims are not allocated yet waits. A pod that gets
no device sees what its `NVIDIA_VISIBLE_DEVICES` names; one naming a GPU the node lacks, or a
DCGM program its image does not have, cannot start (StartError).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.plugin_resources import GPU_RESOURCE
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet import mig, programs
from simulator.fleet.device_manager import allocate
from simulator.fleet.health import HEALTHY
from simulator.fleet.initial_layout import InitialLayout
from simulator.fleet.node_api import NodeApi
from simulator.fleet.pod_runner_spec import (
    Rejection,
    RunSpec,
    claim_names,
    claim_status_name,
    extended_claim,
    node_fit,
    qos_class,
    run_spec,
    start_error,
    visible_gpus,
)
from simulator.fleet.state import DeviceDriver, SimNode, SimPod
from simulator.fleet.timers import Timers
from simulator.model import DRA_DRIVER, Slot, Workload

_API_WORKLOAD = Workload(
    name="", namespace="", kind="Deployment", replicas=0, gpus_per_pod=0, checkpoint="none",
    topology="fixed", path=None, node_group=None, init_container=False, dra_claim="direct",
    dra_status_name="claim", complete_after=None,
)  # fmt: skip
"""What an API pod's `SimPod.workload` holds: no scenario workload (never replaced, never a Job)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A pod the node took: its record (devices allocated on the node) and how it runs."""

    sim: SimPod
    spec: RunSpec
    visible: tuple[int, ...]
    """GPUs (indexes) the runtime exposes through `NVIDIA_VISIBLE_DEVICES`, beside any allocated."""


EventWriter = Callable[..., None]
"""The pod workers' event writer: (pod, node, reason, message, *, warning, container)."""


class PodAdmission:
    """The admission of every simulated kubelet (one object for all nodes, as `PodRunner`)."""

    def __init__(
        self,
        api: NodeApi,
        timers: Timers,
        drivers: Mapping[str, DeviceDriver],
        event: EventWriter,
        layout: InitialLayout | None = None,
    ) -> None:
        self._api = api
        self._timers = timers
        self._drivers = drivers
        self._event = event
        self._layout = layout
        """The scenario's initial pods' devices, where the fleet does not write those pods itself."""
        self._pod_index = itertools.count(1 << 22)  # pod IPs apart from the scenario's pods

    def admit(self, node: SimNode, obj: dict[str, Any]) -> Admitted | Rejection | None:
        """The pod admitted with its devices taken from the node, the reason it does not fit
        (`reject` writes it), or None while its claims are not allocated (the kubelet retries)."""
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
                    return None
                slots = found
            else:
                picked = self._pick_devices(node, spec, obj)
                if isinstance(picked, Rejection):
                    rejection = picked
                else:
                    slots = picked
        if rejection is not None:
            return rejection
        visible: tuple[int, ...] = ()
        if not slots and spec.visible:
            # No device from the kubelet: the runtime exposes what the env names (the
            # kubelet's allocation, when there is one, is what the container gets instead).
            found_visible = visible_gpus(
                spec.visible, tuple(g.uuid for g in node.gpus), tuple(g.partitions for g in node.gpus)
            )
            if found_visible is None:
                spec = start_error(spec)
            else:
                visible = found_visible
        if any(programs.missing_program(c) for c in (*spec.init, *spec.containers)):
            spec = start_error(spec)  # `exec: "dcgmi": executable file not found`
        sim.slots = slots
        for slot in slots:
            if slot in node.free:
                node.free.remove(slot)
            node.gpus[slot.gpu].allocated += 1
        return Admitted(sim, spec, visible)

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
                    sim.resource_name = claim_status_name(spec, pod_claim.get("name", ""))
            named = mig.dra_slots(node.group.mig, len(node.gpus))
            slots.extend(named[d] for d in devices if d in named)
        return tuple(slots)

    def reject(self, node: SimNode, obj: dict[str, Any], rejection: Rejection) -> None:
        """The pod does not fit: phase Failed with the reason, and a warning event."""
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
