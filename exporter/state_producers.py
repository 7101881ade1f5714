"""DRA drivers' health producers: whether each node's producer of a slice-health driver is up.

Owns the producer pods seen on each node and, by (node, driver), the `ProducerState` folded from
them (kept after its last pod is gone, so a node whose producer left says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from exporter import parse
from exporter.snapshot import ProducerState
from exporter.state_table import DeviceTable
from gpuhealth.kube.meta import parse_rfc3339


class _ProducerPod(NamedTuple):
    node: str
    ready: bool
    since: float | None
    """When it left Ready (its Ready condition's lastTransitionTime); None while Ready or unknown."""


class HealthProducers:
    """Each node's health producer pods, by driver, and the state they fold into."""

    def __init__(self, table: DeviceTable, now: Callable[[], float]) -> None:
        self._table = table
        self._now = now
        self.pods: dict[tuple[str, str], _ProducerPod] = {}
        """By (driver, namespace/name): the health producer pods seen on a node."""
        self.states: dict[tuple[str, str], ProducerState] = {}
        """By (node, driver): each node's health producer, kept after its last pod is gone."""

    def apply_producer(self, driver: str, event_type: str, obj: Any) -> None:
        """One event of a pod of `driver`'s health producer (`HealthProducer`): its node and readiness.

        Ready is the pod's Ready condition; its lastTransitionTime, when it turned False, is when
        the producer stopped confirming. A pod not yet on a node says nothing about one.
        """
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        if not (isinstance(name, str) and name and isinstance(namespace, str)):
            self._table.stats.parse_errors[parse.MALFORMED_PRODUCER] += 1
            return
        key = (driver, f"{namespace}/{name}")
        if event_type == "DELETED":
            self.pod_gone(key)
            return
        spec = obj.get("spec")
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        if not isinstance(node, str) or not node:
            return
        ready, since = _pod_ready(obj.get("status"))
        previous = self.pods.get(key)
        self.pods[key] = _ProducerPod(node, ready, since)
        if previous is not None and previous.node != node:
            self._changed(previous.node, driver)
        self._changed(node, driver)

    def pod_gone(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key, None)
        if pod is not None:
            self._changed(pod.node, key[0], gone_at=self._now())

    def node_gone(self, node: str) -> None:
        """The node was deleted: its producers' states go with it."""
        for key in [k for k in self.states if k[0] == node]:
            del self.states[key]
            self._table.snapshot = None

    def relist_end(self, driver: str, seen: set[Any]) -> None:
        for key in [k for k in self.pods if k[0] == driver and k[1] not in seen]:
            self.pod_gone(key)

    def _changed(self, node: str, driver: str, *, gone_at: float | None = None) -> None:
        """Fold the node's producer pods of `driver` into its ProducerState.

        Ready while any pod is. Down since: kept while it stays down (a replacement pod that is
        not Ready yet does not restart the count); on going down, the latest moment a pod left
        Ready (its condition's transition, or the deletion the exporter saw).
        """
        pods = [p for (d, _), p in self.pods.items() if d == driver and p.node == node]
        previous = self.states.get((node, driver))
        if any(p.ready for p in pods):
            state = ProducerState(node, driver, True)
        elif previous is not None and previous.down_since is not None:
            state = previous
        else:
            moments = [p.since if p.since is not None else self._now() for p in pods]
            if gone_at is not None:
                moments.append(gone_at)
            state = ProducerState(node, driver, False, max(moments) if moments else self._now())
        if state != previous:
            self.states[(node, driver)] = state
            self._table.snapshot = None


def _pod_ready(status: Any) -> tuple[bool, float | None]:
    """(Ready, when it turned not Ready) from a pod's status; no Ready condition: not Ready."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, None
            return False, parse_rfc3339(condition.get("lastTransitionTime"))
    return False, None
