"""The device-plugin backend: a quarantine is an entry in a node annotation (an executor).

Thin and idempotent: the node annotation `gpuhealth.io/quarantined-devices`, a JSON list of
device IDs, edited by read-modify-write at the node's resourceVersion (409: read again), and
read by the scheduler extender (`responder.extender.filter`). Nothing else on the node is touched:
no taint, no cordon, no label. In dry-run there is nothing to preview with, so nothing is
written.

The ramp (the release ladder's canary taint, `responder.ladder.CANARY_TAINT`) moves the device
from that list to a second annotation, `gpuhealth.io/ramping-devices`, a JSON object of device
ID to the number of opted-in pods the extender admits to the node for it (`ramp_pods`): pods
labelled `gpuhealth.io/canary-ok: "true"` may use the device, at most that many at a time,
while every other pod still counts it out. A failure on the ramp moves it back; the release
lifts both. The bound travels in the annotation, so the extender needs no setting of its own
and `kubectl get node -o yaml` shows what it admits.

A device is this backend's when no ResourceSlice publishes it (the DRA backend claims first)
and its node advertises the device plugin's resource (`nvidia.com/gpu`) in its capacity; a
record already on this path keeps it while nothing says otherwise, so the node is read only
when a record would change path. The pods that hold the device are those whose
`allocatedResourcesStatus` names it (`<uuid>`, or a time-sliced replica `<uuid>::<n>`).

A check's pod reaches the card through the kubelet (`route` "kubelet", the default): it asks
for one `nvidia.com/gpu`, pinned to the node with `spec.nodeName` (tolerating whatever taints
the node carries), while the card's hold has stepped aside (`responder.enforce.hold`): every
other free GPU of the node is taken by a holder, so the card is the one free device and the
kubelet can only give it that; which device it got is then read back before its result counts
(`responder.checks.jobs`). The other route ("visible-devices", for clusters whose NVIDIA
container toolkit accepts the variable from unprivileged containers, and for MIG cards, whose
partitions are several units) asks for no GPU and has the NVIDIA container runtime
(`runtimeClassName`, when configured) give the card through `NVIDIA_VISIBLE_DEVICES=<uuid>`; the
kubelet does not know the check uses the device then. Either way the reconciler starts no check
while a pod holds it (`holders`, `responder.enforce.holders`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import Conflict, NotFound
from gpuhealth.kube.resources import NODE, Resource
from gpuhealth.plugin_resources import GPU_RESOURCE
from responder.enforce.backends import DeviceRequest, Evidence
from responder.enforce.card_resources import card_units
from responder.enforce.hold import device_ids
from responder.enforce.hold_devices import PodDevices
from responder.enforce.hold_plan import Card
from responder.enforce.identity import Identity, resolve_capacity
from responder.enforce.observed import Observed
from responder.ladder import CANARY_TAINT
from responder.reconcile.policy import Enforce
from responder.records import Quarantine

log = logging.getLogger(__name__)

DEVICE_PLUGIN = "device-plugin"
"""This backend's `spec.path`: devices whose node advertises the device plugin's resource."""
NODE_ANNOTATION = "gpuhealth.io/quarantined-devices"
RAMP_ANNOTATION = "gpuhealth.io/ramping-devices"
"""Devices on the ramp: a JSON object of device ID to how many opted-in pods the scheduler
extender admits to the node for that device while it ramps."""
RAMP_PODS = 1
"""Opted-in pods admitted per ramping device by default: one workload's worth of bounded load."""
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's variable: the GPUs (uuids) a container sees."""
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
"""What of the driver the runtime mounts: `compute` for CUDA, `utility` for NVML and DCGM."""
RUNTIME_CLASS = "nvidia"
"""The RuntimeClass of NVIDIA's container runtime, as the GPU operator names it."""
KUBELET = "kubelet"
"""Check route: the card allocated to the check's pod by the kubelet, the hold stepping aside."""
VISIBLE_DEVICES_ROUTE = "visible-devices"
"""Check route: no GPU request; the NVIDIA runtime gives the card named in `NVIDIA_VISIBLE_DEVICES`."""
CHECK_ROUTES = (KUBELET, VISIBLE_DEVICES_ROUTE)


class NodeAnnotation:
    path = DEVICE_PLUGIN
    holds_card = True
    """The kubelet hands the card to pods itself: holder pods take it (`responder.enforce.hold`)."""
    listed: tuple[Resource, ...] = ()
    """Nothing listed of its own: the node is the pass's (`Backends.observe`)."""

    def __init__(
        self,
        client: Api,
        *,
        runtime_class: str = RUNTIME_CLASS,
        ramp_pods: int = RAMP_PODS,
        route: str = KUBELET,
        devices: PodDevices | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`runtime_class`: the check pods' `runtimeClassName` (empty: the node's default runtime).
        `ramp_pods`: opted-in pods the extender admits per device while it ramps. `route`: how a
        check's pod gets the card (`CHECK_ROUTES`). `devices`: which device each pod got where
        the kubelet does not say (before 1.36: the node exporter's, shared with the hold; None:
        the kubelet's word only), asked at `clock`'s time."""
        if isinstance(ramp_pods, bool) or not isinstance(ramp_pods, int) or not 1 <= ramp_pods <= 64:
            raise ValueError(f"ramp_pods must be a whole number from 1 to 64, not {ramp_pods!r}")
        if route not in CHECK_ROUTES:
            raise ValueError(f"route must be one of {', '.join(CHECK_ROUTES)}, not {route!r}")
        self._client = client
        self._runtime_class = runtime_class
        self._ramp_pods = ramp_pods
        self.route = route
        self._devices = devices
        self._clock = clock or SystemClock()

    def identify(self, record: Quarantine, evidence: Evidence) -> Identity | None:
        if record.spec.path == self.path:
            # No slice publishes the device (the DRA backend asked first): nothing says it moved,
            # and the node need not be read.
            return Identity(
                self.path, uuid=record.spec.uuid, partitions=evidence.partitions, profiles=evidence.profiles
            )
        node = evidence.node()
        found = resolve_capacity(record.spec, None if node is None else node.get("status"), self.path)
        return (
            None
            if found is None
            else replace(found, partitions=evidence.partitions, profiles=evidence.profiles)
        )

    def enforced_as(self, record: Quarantine) -> str:
        return f"Node/{record.spec.node}"

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        node = (seen or Observed(self._client)).get(NODE, record.spec.node)
        if node is None:
            raise NotFound(f"nodes {record.spec.node} not found")
        ids, on_list, on_ramp = entries(record), set(listed(node)), ramping(node)
        quarantined = all(i in on_list for i in ids)
        ramps = [on_ramp.get(i) for i in ids]
        if wanted is None or wanted.effect == "None":  # dry-run: nothing is written on this path
            return any(i in on_list for i in ids) or any(r is not None for r in ramps)
        if wanted.taint_key == CANARY_TAINT:
            return all(r == self._ramp_pods for r in ramps) and not any(i in on_list for i in ids)
        return quarantined and all(r is None for r in ramps)

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        if effect.effect != "None":  # dry-run: nothing to preview with on this path
            self._edit(record, RAMPING if effect.taint_key == CANARY_TAINT else QUARANTINED, seen)

    def lift(self, record: Quarantine, seen: Observed | None = None) -> None:
        self._edit(record, None, seen)

    def holders(self, record: Quarantine, node_pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        # A MIG card is held by the pods on any of its partitions.
        devices = (record.spec.uuid or record.spec.device, *record.spec.partitions)
        of: Callable[[Mapping[str, Any]], tuple[str, ...]] = device_ids
        if self._devices is not None:
            # Before 1.36 the kubelet names no pod's devices: the node exporter's word (the
            # pod-resources List) for those it does not, so that a card's pods are moved and
            # waited for there too.
            card = Card(record.spec.uuid or record.spec.device, record.spec.partitions)
            of = self._devices.read(record.spec.node, node_pods, self._clock.now(), card).of
        return [p for p in node_pods if any(_holds(of(p), d) for d in devices)]

    def through_kubelet(self, record: Quarantine) -> bool:
        return through_kubelet(self.route, record, node_reader(self._client, record))

    def device_request(self, record: Quarantine, name: str, namespace: str) -> DeviceRequest:
        pod: dict[str, Any] = {
            "nodeName": record.spec.node,  # no scheduler: the extender would refuse the device
            "tolerations": [{"operator": "Exists"}],  # whatever taints the node carries
        }
        if self._runtime_class:
            pod["runtimeClassName"] = self._runtime_class
        capabilities = {"name": DRIVER_CAPABILITIES, "value": "compute,utility"}
        # The node is read for a MIG card on the kubelet's route only: its strategy names the units.
        mig = bool(record.spec.partitions) and self.route == KUBELET
        node = node_reader(self._client, record)() if mig else None
        if through_kubelet(self.route, record, lambda: node):
            units = card_units(record, node)
            # One GPU from the kubelet (a MIG card: as many units as its partitions, of the
            # resources its node's MIG strategy names), while the hold has stepped aside: the
            # card's are the only free ones. The plugin's Allocate sets NVIDIA_VISIBLE_DEVICES to
            # what it gave.
            gpu = {resource: str(n) for resource, n in (units or {GPU_RESOURCE: 1}).items()}
            resources = {"limits": dict(gpu), "requests": dict(gpu)}
            return DeviceRequest(container={"env": [capabilities], "resources": resources}, pod=pod)
        # No `nvidia.com/gpu` request: the device plugin would hand over any free Healthy GPU
        # (and never the quarantined one while it reports Unhealthy). The runtime gives this one.
        env = [
            # A MIG card: every partition (CUDA reaches a MIG card only through its MIG devices),
            # so the check tests the whole card, as the quarantine covers it.
            {
                "name": VISIBLE_DEVICES,
                "value": ",".join(record.spec.partitions or (record.spec.uuid or record.spec.device,)),
            },
            capabilities,
        ]
        return DeviceRequest(container={"env": env}, pod=pod)

    def _edit(self, record: Quarantine, state: str | None, seen: Observed | None) -> None:
        """Make the device listed as `state` (QUARANTINED, RAMPING) and nowhere else; None: nowhere.
        A MIG card is listed as its partitions, each one unit of the node's GPU resource."""
        ids = set(entries(record))
        # Lifting takes the card's own entry too, in case its partitions became known meanwhile.
        gone = ids | {record.spec.device}
        reads = seen or Observed(self._client)
        name = record.spec.node

        def attempt() -> None:
            node = reads.get(NODE, name)
            if node is None:
                if state is not None:
                    raise NotFound(f"nodes {name} not found")
                return  # the node is gone, and the annotations with it
            current, ramp = listed(node), ramping(node)
            wanted = [d for d in current if d not in gone]
            if state == QUARANTINED:
                wanted = sorted({*wanted, *ids})
            wanted_ramp = {d: n for d, n in ramp.items() if d not in gone}
            if state == RAMPING:
                wanted_ramp.update(dict.fromkeys(ids, self._ramp_pods))
            if wanted == current and wanted_ramp == ramp:
                return
            meta = node.get("metadata") or {}
            annotations = dict(meta.get("annotations") or {})
            ordered = dict(sorted(wanted_ramp.items()))
            for key, value in ((NODE_ANNOTATION, wanted), (RAMP_ANNOTATION, ordered)):
                if value:
                    annotations[key] = orjson.dumps(value).decode()
                else:
                    annotations.pop(key, None)
            try:
                changed = {**node, "metadata": {**meta, "annotations": annotations}}
                reads.wrote(NODE, name, self._client.update(NODE, changed))
            except Conflict:
                reads.reread(NODE, name)  # the node changed since the pass read it: edit it as it is now
                raise

        retry_on_conflict(attempt, what=f"Node {record.spec.node}")


QUARANTINED = "quarantined"
"""Listed in `gpuhealth.io/quarantined-devices`: no pod may use the device."""
RAMPING = "ramping"
"""Listed in `gpuhealth.io/ramping-devices`: opted-in pods only, up to the bound."""


def through_kubelet(
    route: str, record: Quarantine, read_node: Callable[[], Mapping[str, Any] | None] | None = None
) -> bool:
    """Whether a device-plugin record's checks get its card from the kubelet on `route`. A MIG
    card does where the resources its partitions are units of are known (`card_resources.card_units`:
    the node's MIG strategy, as the label of the node `read_node` reads says, read only for such a
    card; under `mixed` every partition's profile): the check asks for as many units of each as
    the card has, and with the hold stepped aside they are the only free ones. Otherwise (a node
    without the label, a profile not known): the runtime's route."""
    if record.spec.path != DEVICE_PLUGIN or route != KUBELET:
        return False
    if not record.spec.partitions:
        return True
    return card_units(record, read_node() if read_node is not None else None) is not None


def node_reader(client: Api, record: Quarantine) -> Callable[[], dict[str, Any] | None]:
    """Reads the record's Node when called (gone: None)."""

    def read() -> dict[str, Any] | None:
        try:
            return client.get(NODE, record.spec.node)
        except NotFound:
            return None

    return read


def entries(record: Quarantine) -> tuple[str, ...]:
    """What the annotations list for the record's device: a MIG card's partitions (the device
    plugin's device IDs, each one unit of the node's GPU resource, so the extender counts the
    whole card out), else the device itself."""
    return record.spec.partitions or (record.spec.device,)


def listed(node: dict[str, Any]) -> list[str]:
    """The devices the node annotation lists; an unreadable value lists none (and is logged)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION)
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("node annotation %s is not JSON: %r", NODE_ANNOTATION, raw[:200])
        return []
    return sorted(v for v in value if isinstance(v, str)) if isinstance(value, list) else []


def ramping(node: Mapping[str, Any]) -> dict[str, int]:
    """The devices the ramp annotation lists, with the opted-in pods admitted for each; an
    unreadable value lists none (logged), an entry whose bound is not a whole number >= 1 counts 1."""
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(RAMP_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not raw or not isinstance(raw, str):
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("node annotation %s is not JSON: %r", RAMP_ANNOTATION, raw[:200])
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(d): n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
        for d, n in sorted(value.items())
    }


def _holds(ids: Sequence[str], device: str) -> bool:
    """Whether a pod given `ids` holds `device` (time-sliced replicas of one GPU are advertised
    as `<uuid>::<n>`)."""
    return any(rid == device or rid.startswith(device + "::") for rid in ids)
