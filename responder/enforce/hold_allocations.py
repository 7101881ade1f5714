"""The node exporter's allocations from Prometheus, for the hold (an adapter; urllib, blocking).

`PrometheusAllocations.devices(node)`: one instant query of `gpu_device_allocation_info` for
the node (`exporter.metrics`), each pod's device IDs by (namespace, pod). When it is asked, and
what the hold does with the answer, is `responder.enforce.hold_devices`'s. Any failure raises
`AllocationsUnavailable` ("not known yet").
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

from responder.enforce.hold_devices import AllocationsUnavailable, PodKey
from responder.migrate.readings import quote


def allocation_query(node: str) -> str:
    """The node's device-plugin allocations (`claim=""`: a DRA claim's devices are not the hold's)."""
    return f'max by (namespace, pod, device) (gpu_device_allocation_info{{node="{quote(node)}", claim=""}})'


def parse_allocations(body: Any, query: str) -> dict[PodKey, tuple[str, ...]]:
    """(namespace, pod) -> its device IDs, sorted, from an instant-vector answer (pure).
    AllocationsUnavailable for an answer that is not a success with a vector; a sample without
    the three labels is dropped."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise AllocationsUnavailable(f"query {query}: {error or 'not a success answer'}")
    data = body.get("data")
    if (
        not isinstance(data, dict)
        or data.get("resultType") != "vector"
        or not isinstance(data.get("result"), list)
    ):
        raise AllocationsUnavailable(f"query {query}: expected an instant vector")
    found: dict[PodKey, set[str]] = {}
    for sample in data["result"]:
        labels = sample.get("metric") if isinstance(sample, dict) else None
        if not isinstance(labels, dict):
            continue
        namespace, pod, device = labels.get("namespace"), labels.get("pod"), labels.get("device")
        if isinstance(namespace, str) and isinstance(pod, str) and isinstance(device, str) and pod and device:
            found.setdefault((namespace, pod), set()).add(device)
    return {key: tuple(sorted(ids)) for key, ids in found.items()}


class PrometheusAllocations:
    """`AllocationSource` over Prometheus' HTTP API (urllib, blocking)."""

    def __init__(self, url: str, *, timeout_seconds: float = 5.0) -> None:
        self._url = url.rstrip("/")
        self._timeout = timeout_seconds

    def devices(self, node: str) -> dict[PodKey, tuple[str, ...]]:
        query = allocation_query(node)
        address = f"{self._url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(address, timeout=self._timeout) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise AllocationsUnavailable(f"query {query} at {self._url}: {exc}") from exc
        return parse_allocations(body, query)
