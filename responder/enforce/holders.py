"""Which pods hold a device: the one reading of it that migration and release share.

An adapter over the API, read-only: the pods on the record's node, of which the record's
backend (`responder.enforce.backends`) says which hold its device. The migrator moves the jobs of
these pods; the reconciler starts no probe while one of them (other than gpuhealth's own
checks) still holds the device: on DRA a check cannot get a device a running pod holds (its
timeout would count as the device's failure), and on device plugins it would share the card
with that pod (its runtime gives it the device whatever the kubelet allocated), so its verdict
would not be the device's alone.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.kube.api import Api
from gpuhealth.kube.resources import POD
from responder.enforce.backends import Backends
from responder.enforce.hold import CHECK_LABEL
from responder.enforce.hold_plan import HOLDER_LABEL
from responder.records import Quarantine

__all__ = ["CHECK_LABEL", "DeviceHolders", "pods_on_device"]


def pods_on_device(client: Api, backends: Backends, record: Quarantine) -> list[dict[str, Any]]:
    """Every pod on the record's node that holds its device (finished or not), gpuhealth's own
    holders aside: they are there to keep the device, never work to move or wait for."""
    node_pods = client.list(POD, field_selector=f"spec.nodeName={record.spec.node}").items
    holding = backends.of(record).holders(record, node_pods)
    return [p for p in holding if HOLDER_LABEL not in ((p.get("metadata") or {}).get("labels") or {})]


class DeviceHolders:
    """`of(record)`: the pods (`namespace/name`) that still hold the record's device."""

    def __init__(self, client: Api, backends: Backends) -> None:
        self._client = client
        self._backends = backends

    def of(self, record: Quarantine) -> tuple[str, ...]:
        held = []
        for pod in pods_on_device(self._client, self._backends, record):
            meta: dict[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
            if CHECK_LABEL in (meta.get("labels") or {}):
                continue  # gpuhealth's own probe or canary: it is meant to hold the device
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # a finished pod's containers no longer use the device
            held.append(f"{meta.get('namespace') or ''}/{meta.get('name') or ''}")
        return tuple(sorted(held))
