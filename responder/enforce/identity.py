"""Which device a record names, as the API says it is: the identity that picks its backend.

Pure: no I/O. The alert that opened a record says what the exporter knew (a `driver` label
when the device's `gpu_device_info` series was there, a UUID); the webhook records that and no
path. The reconciler resolves the identity from the API on every pass, the first one choosing
the backend, and when a later one differs from the record's, hands the enforcement over to the
backend of the new one (each backend names its own path, `Identity.path`):
- a device one of the node's ResourceSlices publishes (by its `uuid` attribute, or by
  driver/pool/device) is a DRA device (`resolve_slice`), whatever the alert carried;
- a device no slice publishes on a node that advertises the device plugin's resource in its
  capacity is a device-plugin device (`resolve_capacity`);
- neither (a slice being republished, a node being read): the record keeps what it has, since
  a moment's absence is no evidence that the device changed.
Which backend asks which question, and in what order, is `responder.enforce.backends`'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.kube.slices import SliceDevice, parse_resource_slice
from gpuhealth.plugin_resources import gpu_resource
from responder.records import QuarantineSpec, device_uuid


@dataclass(frozen=True, slots=True)
class Identity:
    path: str
    """The backend that enforces on this device (its `path`: `responder.enforce.backends`)."""
    uuid: str = ""
    driver: str = ""
    pool: str = ""
    device_name: str = ""
    partitions: tuple[str, ...] = ()
    """A MIG card's partitions where the evidence names them, as its path names them: MIG UUIDs
    on the device-plugin path, the driver's MIG device names in `pool` on DRA; empty: none seen."""
    profiles: tuple[tuple[str, str], ...] = ()
    """Device plugins: (MIG UUID, profile) of the partitions whose profile the evidence names."""

    def applied(self, spec: QuarantineSpec) -> QuarantineSpec:
        """`spec` naming this identity (the UUID and the partitions are kept where the evidence
        gives none: a lost card lists no partitions, and a moment's absence changes nothing)."""
        return replace(
            spec,
            path=self.path,
            uuid=self.uuid or spec.uuid,
            driver=self.driver,
            pool=self.pool,
            device_name=self.device_name,
            partitions=self.partitions or spec.partitions,
            profiles=self.profiles or spec.profiles,
        )

    def of(self, spec: QuarantineSpec) -> bool:
        """Whether `spec` already names this identity."""
        return self.applied(spec) == spec


def slice_devices(obj: Any) -> list[SliceDevice]:
    """The devices of one ResourceSlice of a node (`gpuhealth.kube.slices`); a malformed slice,
    or one of no node, has none (a malformed device entry is left out)."""
    parsed = parse_resource_slice(obj)
    return list(parsed.devices) if parsed is not None and parsed.node else []


def resolve_slice(spec: QuarantineSpec, devices: Iterable[SliceDevice], path: str) -> Identity | None:
    """The DRA identity (on `path`, the DRA backend's) of the record's device if a slice on its
    node publishes it, else None.

    A MIG card (the NVIDIA DRA driver publishes its MIG devices, each naming the card in
    `parentUUID`, and not the card) is identified as the card with its MIG devices' names as its
    partitions, sorted; its `device_name` is the first of them."""
    uuid = device_uuid(spec.device, spec.uuid)
    devices = list(devices)
    if uuid:
        carved = sorted(
            (d for d in devices if d.node == spec.node and d.parent == uuid), key=lambda d: d.device
        )
        if carved:
            first = carved[0]
            names = tuple(d.device for d in carved if (d.driver, d.pool) == (first.driver, first.pool))
            return Identity(
                path,
                uuid=uuid,
                driver=first.driver,
                pool=first.pool,
                device_name=first.device,
                partitions=names,
            )
    for d in devices:
        if d.node != spec.node:
            continue
        named = f"{d.driver}/{d.pool}/{d.device}" == spec.device or (
            (d.driver, d.pool, d.device) == (spec.driver, spec.pool, spec.device_name)
        )
        if (uuid and d.uuid == uuid) or named:
            return Identity(path, uuid=d.uuid, driver=d.driver, pool=d.pool, device_name=d.device)
    return None


def resolve_capacity(
    spec: QuarantineSpec, node_status: Mapping[str, Any] | None, path: str
) -> Identity | None:
    """The device-plugin identity (on `path`, the device-plugin backend's) of the record's
    device if its node advertises the plugin's resource (`nvidia.com/gpu`, or with MIG strategy
    mixed a `nvidia.com/mig-<profile>`; `node_status`: the node's status; None: the node is
    gone), else None. A device the record knows no UUID of cannot be named on this path."""
    uuid = device_uuid(spec.device, spec.uuid)
    capacity = (node_status or {}).get("capacity") or {}
    advertised = any(
        gpu_resource(str(name)) and str(value or "0") not in ("", "0") for name, value in capacity.items()
    )
    if not uuid or not advertised:
        return None
    return Identity(path, uuid=uuid)
