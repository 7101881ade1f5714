"""What `kubectl gpuhealth devices` joins, as pure functions over plain data.

Three sources meet here, each read elsewhere: the exporters' device views (`(DeviceState, age)`
rows, `exporter.devices_view`), the `DeviceQuarantine` records (`responder.records`), and for
`--pod` the Pod and its ResourceClaims as the API returns them.

- `merge_views`: several exporters' rows as one list, one row per (node, device): node-mode
  DaemonSet pods each know their node, and a cluster-mode exporter may know the same device
  too; the freshest report (smallest status age) wins.
- `select`: the rows a listing shows (node, health, namespace of the pods holding a device,
  pods chosen by a label selector).
- `pod_devices`: a Pod's `allocatedResourcesStatus` entries (the kubelet's report now, parsed
  by `exporter.parse` as the exporter parses it), each resolved to the device key the exporter
  and the records use: the GPU UUID for device plugins; for DRA the claim's allocation result
  (`exporter.identity.match_result`), then the exporter's device with that driver, pool and
  name on the pod's node (its UUID when the slice gives one), else `<driver>/<pool>/<device>`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.devices_view import Row
from exporter.identity import ClaimInfo, match_result
from exporter.parse import parse_pod
from exporter.snapshot import DeviceState
from responder.records import Quarantine

DeviceKey = tuple[str, str]
"""(node, device) as the exporter and the records key a device."""


def merge_views(views: Iterable[Iterable[Row]]) -> list[Row]:
    """One row per (node, device), the freshest report kept; sorted by node and device."""
    best: dict[DeviceKey, Row] = {}
    for rows in views:
        for device, age in rows:
            key = (device.node, device.device)
            if key not in best or age < best[key][1]:
                best[key] = (device, age)
    return [best[key] for key in sorted(best)]


def select(
    rows: Iterable[Row],
    *,
    namespace: str | None,
    node: str | None = None,
    health: str | None = None,
    pods: Collection[tuple[str, str]] | None = None,
) -> list[Row]:
    """The rows to show: `namespace` None shows every device (idle ones too), a namespace only
    devices some pod of it holds; `pods` (namespace, name) pairs keep devices those pods hold."""
    shown = []
    for device, age in rows:
        if node is not None and device.node != node:
            continue
        if health is not None and device.health != health:
            continue
        if namespace is not None and not any(a.namespace == namespace for a in device.allocations):
            continue
        if pods is not None and not any((a.namespace, a.pod) in pods for a in device.allocations):
            continue
        shown.append((device, age))
    return shown


def records_by_device(records: Iterable[Quarantine]) -> dict[DeviceKey, Quarantine]:
    return {(r.spec.node, r.spec.device): r for r in records}


@dataclass(frozen=True, slots=True)
class PodDevice:
    """One device of a pod: the kubelet's report now, joined with the exporter and the records."""

    container: str
    resource: str
    """The entry's name: `nvidia.com/gpu` or `claim:<podClaimName>[/<request>]`."""
    resource_id: str
    """As the kubelet reports it (a `<uuid>::<n>` replica, a CDI ID, `<driver>/<pool>/<device>`)."""
    node: str
    device: str
    """The exporter's and the records' key on the node; empty when a DRA claim cannot be resolved."""
    health: str
    message: str
    exporter: Row | None
    """The exporter's view of the device (status age, versions, other holders); None if it has none."""
    quarantine: Quarantine | None


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims (generated names) a pod's DRA entries point at, to read them."""
    observation = parse_pod(pod)
    if observation is None:
        return []
    return sorted({e.claim for e in observation.entries if e.claim})


def pod_devices(
    pod: Mapping[str, Any],
    claims: Mapping[str, ClaimInfo],
    rows: Iterable[Row],
    records: Mapping[DeviceKey, Quarantine],
) -> list[PodDevice]:
    """Every allocatedResourcesStatus entry of `pod`, in container order, with its device key,
    the exporter's row and the record for it. `claims` by generated claim name."""
    observation = parse_pod(dict(pod))
    if observation is None:
        return []
    node = observation.node
    by_key: dict[DeviceKey, Row] = {}
    by_ref: dict[tuple[str, str, str, str], DeviceState] = {}
    for device, age in rows:
        by_key[(device.node, device.device)] = (device, age)
        if device.driver:
            by_ref[(device.node, device.driver, device.pool, device.device_name)] = device
    found = []
    for entry in observation.entries:
        if entry.is_dra:
            claim = claims.get(entry.claim)
            result = match_result(claim, entry) if claim is not None else None
            if result is None:
                key = ""
            else:
                known = by_ref.get((node, result.driver, result.pool, result.device))
                key = known.device if known is not None else f"{result.driver}/{result.pool}/{result.device}"
        else:
            key = entry.device
        found.append(
            PodDevice(
                container=entry.container,
                resource=entry.resource,
                resource_id=entry.resource_id,
                node=node,
                device=key,
                health=entry.health,
                message=entry.message,
                exporter=by_key.get((node, key)) if key else None,
                quarantine=records.get((node, key)) if key else None,
            )
        )
    return found
