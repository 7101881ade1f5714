"""Enforcement backends: how one kind of device is quarantined, behind one protocol.

A backend owns everything that differs between kinds of device: whether a device is one of
its own (`identify`, from what the API says about it, `responder.enforce.identity`), what its
enforcement is called in the record (`enforced_as`), whether gpuhealth's enforcement is
present, putting it in place and lifting it, which pods hold the device, and what a check's
pod asks for to get exactly that device (`device_request`). Nothing outside a backend asks
which path a record is on: `Backends` hands each record the backend its `spec.path` names, and
each backend names its own path (the CRD's enum and the metrics' `path` values are these).

`responder.enforce.shipped.enforcer` is the one declaration of the shipped backends, in the order
they claim a device: DRA (`responder.enforce.taint_rules`: a DeviceTaintRule) before device plugins
(`responder.enforce.node_annotation`: the node annotation the scheduler extender reads). Adding a
backend is one module with its class and one entry there.

`Backends.observe` reads what a pass needs once, for every record of it
(`responder.enforce.observed`): the ResourceSlices, what each backend reads by name (`listed`), and
the records' nodes. `Backends.identify` re-resolves a record's device on every pass from those
slices and, when a backend needs it, the node. The webhook records no path: the first pass
that a backend claims the device on sets it (a DRA device whose alert carried no `driver` label
is a DRA device from the start), and nothing is enforced before. The reconciler hands the
enforcement over when a later pass finds the identity changed.
`present`, `enforce` and `lift` take the pass's `Observed` (None, outside a pass: each reads
the API itself). Synchronous like the client; the reconciler runs it in a thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NODE, RESOURCE_SLICE, Resource
from gpuhealth.kube.slices import SliceDevice
from responder.enforce.identity import Identity, slice_devices
from responder.enforce.observed import Observed
from responder.reconcile.policy import Enforce
from responder.records import Quarantine


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """What a check's pod adds to get exactly the record's device."""

    container: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the check's container (its `resources`, its `env`)."""
    pod: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the pod's spec (`resourceClaims`, `nodeName`, `tolerations`, `runtimeClassName`)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Annotations of the pod."""
    objects: tuple[tuple[Resource, dict[str, Any]], ...] = ()
    """Objects the check needs, created before its Job and deleted with it (by name)."""


@dataclass(slots=True)
class Evidence:
    """What the API says about one record's device, read once per pass and only as needed."""

    slices: Sequence[SliceDevice]
    """Every device the cluster's ResourceSlices publish."""
    node: Callable[[], Mapping[str, Any] | None]
    """The node object (None: gone); read on the first call of the pass, then remembered."""
    partitions: tuple[str, ...] = ()
    """The device's MIG partitions (MIG UUIDs) as the health source saw them this pass (the
    exporter's NVML, `gpu_nvml_mig_device_info`); empty: none seen."""
    profiles: tuple[tuple[str, str], ...] = ()
    """(MIG UUID, profile) of those partitions whose profile the health source named."""


class Backend(Protocol):
    path: str
    """The `spec.path` of the records this backend enforces (`dra`, `device-plugin`)."""
    listed: tuple[Resource, ...]
    """Cluster-scoped resources whose objects `present` reads by name: listed once per pass."""
    holds_card: bool
    """Whether the node hands this backend's devices to pods without the scheduler's say (device
    plugins: the kubelet), so that a quarantined card is taken by holder pods
    (`responder.enforce.hold`)."""

    def identify(self, record: Quarantine, evidence: Evidence) -> Identity | None:
        """The device's identity if it is one of this backend's; None if not (or not known)."""
        ...

    def enforced_as(self, record: Quarantine) -> str:
        """What the record's `status.enforced` calls this backend's enforcement of it."""
        ...

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        """Whether the enforcement gpuhealth owns for the record exists: as `wanted` (the taint
        the record's phase holds: a rule's taint, which of a node's annotations lists the device
        and with what bound), or in any form when None. Read from `seen`, the pass's reads."""
        ...

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        """Put the enforcement in place; what it writes is applied over `seen`."""
        ...

    def lift(self, record: Quarantine, seen: Observed | None = None) -> None:
        """Remove what gpuhealth put in place (never what anyone else did)."""
        ...

    def holders(self, record: Quarantine, node_pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Those of the node's pods that hold the record's device (finished or not)."""
        ...

    def device_request(self, record: Quarantine, name: str, namespace: str) -> DeviceRequest:
        """What the check `name` (its Job's name) in `namespace` asks for to get the device."""
        ...


class UnknownBackend(RuntimeError):
    """A record names a path no backend of this responder enforces."""


class Backends:
    """The backends a responder enforces with, looked up by the record's path."""

    def __init__(self, client: Api, backends: Iterable[Backend]) -> None:
        self._client = client
        self.ordered = tuple(backends)
        self._by_path = {b.path: b for b in self.ordered}
        if len(self._by_path) != len(self.ordered):
            raise ValueError(f"backend paths repeat: {[b.path for b in self.ordered]}")
        self.paths = tuple(self._by_path)
        """The `spec.path` values of this responder's records, in the order the backends claim."""

    def of(self, record: Quarantine) -> Backend:
        try:
            return self._by_path[record.spec.path]
        except KeyError:
            raise UnknownBackend(
                f"{record.name}: no backend enforces path {record.spec.path!r} "
                f"(this responder has {', '.join(self._by_path)})"
            ) from None

    # ----- what the reconciler asks (responder.reconcile.reconciler.Enforcement) --------------------------

    def slices(self) -> list[SliceDevice]:
        """Every published ResourceSlice device (one list: once per pass)."""
        try:
            listed = self._client.list(RESOURCE_SLICE).items
        except NotFound:
            return []  # the cluster serves no DRA: every device is a device plugin's
        return [d for obj in listed for d in slice_devices(obj)]

    def observe(
        self, nodes: Collection[str] = (), *, list_nodes: bool = False, page_size: int = 500
    ) -> Observed:
        """What one pass reads for its records, once: the slices, every object of each backend's
        `listed` resources (paged), and when `list_nodes`, the `nodes` named (one paged list of
        the nodes, keeping those; a node not found is gone); other nodes are read on first use."""
        listed: dict[Resource, dict[str, dict[str, Any]]] = {}
        for backend in self.ordered:
            for resource in backend.listed:
                if resource not in listed:
                    items = self._client.list(resource, page_size=page_size).items
                    listed[resource] = {str(o["metadata"]["name"]): o for o in items}
        known: dict[Resource, dict[str, dict[str, Any] | None]] = {}
        if list_nodes and nodes:
            wanted: dict[str, dict[str, Any] | None] = dict.fromkeys(nodes)
            for obj in self._client.list(NODE, page_size=page_size).items:
                name = str(obj["metadata"]["name"])
                if name in wanted:
                    wanted[name] = obj
            known[NODE] = wanted
        return Observed(self._client, slices=self.slices(), listed=listed, known=known)

    def identify(
        self,
        record: Quarantine,
        seen: Observed,
        partitions: tuple[str, ...] = (),
        profiles: tuple[tuple[str, str], ...] = (),
    ) -> Quarantine:
        """`record` naming its device as the API says it is now, by the first backend that claims
        it; unchanged when none does. `seen`: the pass's reads (its node read when first needed);
        `partitions`: the device's MIG partitions as the health source saw them this pass, and
        `profiles` their MIG profiles."""
        node = record.spec.node

        def read_node() -> Mapping[str, Any] | None:
            return seen.get(NODE, node)

        evidence = Evidence(seen.slices, read_node, partitions, profiles)
        for backend in self.ordered:
            identity = backend.identify(record, evidence)
            if identity is not None:
                return (
                    record
                    if identity.of(record.spec)
                    else replace(record, spec=identity.applied(record.spec))
                )
        return record

    def enforced_as(self, record: Quarantine) -> str:
        return self.of(record).enforced_as(record)

    def holds_card(self, record: Quarantine) -> bool:
        """Whether the record's card is taken by holder pods (its backend's `holds_card`)."""
        return self.of(record).holds_card

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        return self.of(record).present(record, wanted, seen)

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        self.of(record).enforce(record, effect, seen)

    def unenforce(self, record: Quarantine, seen: Observed | None = None) -> None:
        self.of(record).lift(record, seen)
