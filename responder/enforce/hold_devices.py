"""Which device each pod on a node got, for the hold: the kubelet's word, else the exporter's.

The hold (`responder.enforce.hold`) needs to know which device each of its holders got, and
which devices the node's other pods use. The kubelet says so in a pod's
`status.containerStatuses[].allocatedResourcesStatus` (Kubernetes 1.36+). Where it does not (an
older kubelet, or the `ResourceHealthStatus` feature off) the other place that names a pod's
devices is the node exporter's `gpu_device_allocation_info{node, device, namespace, pod, ...}`
(`exporter.metrics`), read here from Prometheus: one instant query per node per pass, and only
while a running pod that asks for devices has no kubelet report (never on a node whose kubelet
reports them).

Pure but for the source it is given (`responder.enforce.hold_allocations` reads Prometheus,
blocking: the reconciler calls the hold in a thread), and in memory. A failed query is
"not known yet", never an answer: the hold waits (`Filling`) and, once `fill_timeout_seconds`
is past, reads `AllocationUnreadable` with the sources tried in its message. What the exporter
named for a pod is remembered by the pod's uid for the pod's life (the kubelet never moves a
running container to another device), so an outage of Prometheus after a hold stands does not
undo it; it is in memory only (a new leader asks again).

Limits of the fallback, where the kubelet names more than the exporter's series do:
- units: the exporter's `device` is the physical GPU, never the replica (`<uuid>::<n>`) nor a MIG
  partition (node mode folds partitions onto their card), so the hold cannot tell the card's
  units apart from it: not used for a MIG card, nor on a node labelled with more than one replica
  (`nvidia.com/gpu.replicas`), nor where its answer names one device for two pods (a GPU shared
  without the label);
- the series are as fresh as the last scrape: a pod just started is "not known yet" for a scrape
  interval or two (well inside the fill timeout's default of 60 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from responder.enforce.hold_plan import Card

log = logging.getLogger(__name__)

KUBELET = "the kubelet's allocatedResourcesStatus (Kubernetes 1.36+)"
"""How a message names the first source."""
EXPORTER = "the node exporter's gpu_device_allocation_info in Prometheus"
"""How a message names the fallback."""

ANSWER_SECONDS = 1.0
"""How long one answer serves a node's reads: those of one pass (a fresher one would name
nothing new: the series change once a scrape interval), never a pass a second later."""

PodKey = tuple[str, str]
"""(namespace, pod name), as the exporter labels a pod's allocation."""


class AllocationsUnavailable(RuntimeError):
    """Prometheus gave no readable answer (down, an error, not a vector)."""


class AllocationSource(Protocol):
    def devices(self, node: str) -> Mapping[PodKey, tuple[str, ...]]:
        """Each pod's device IDs on `node` as last exported; AllocationsUnavailable when unknown."""
        ...


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """One pass's reading of a node's pods: `of(pod)` is the kubelet's word where it gave one,
    else what the exporter named (empty: not known)."""

    kubelet: Callable[[Mapping[str, Any]], tuple[str, ...]]
    exported: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Pod uid -> device IDs the exporter named (only pods without a kubelet report)."""
    tried: tuple[str, ...] = (KUBELET,)
    """The sources asked this pass, each with what came of it (for `AllocationUnreadable`)."""

    def of(self, pod: Mapping[str, Any]) -> tuple[str, ...]:
        return self.kubelet(pod) or self.exported.get(_uid(pod), ())


class PodDevices:
    """`read(node, pods, now)`: a `NodeDevices` for one pass of a hold on `node`.

    `kubelet`: the device IDs the kubelet reports for a pod (`responder.enforce.hold.device_ids`).
    `source`: the exporter's allocations (None: not configured, the kubelet's word only)."""

    def __init__(
        self, kubelet: Callable[[Mapping[str, Any]], tuple[str, ...]], source: AllocationSource | None = None
    ) -> None:
        self._kubelet = kubelet
        self._source = source
        self._named: dict[str, dict[str, tuple[str, ...]]] = {}
        """Node -> pod uid -> its device IDs as the exporter named them, for as long as the pod is
        listed on the node (bounded by the nodes ever held: a few entries each)."""
        self._answers: dict[str, tuple[float, Mapping[PodKey, tuple[str, ...]] | str]] = {}
        """Node -> (when it was asked, its answer or why none): one query per node per pass
        however many records on it are read, by the hold and by the backend (the moves, the
        release's wait), each at its own `now` within the pass (`ANSWER_SECONDS`)."""

    def read(self, node: str, pods: Sequence[Mapping[str, Any]], now: float, card: Card) -> NodeDevices:
        """`pods`: every pod bound to the node (holders included); `card`: the card held (the
        exporter's series are not used where they cannot tell its units apart)."""
        listed = {_uid(p): p for p in pods if _uid(p)}
        named = self._named[node] = {u: ids for u, ids in self._named.get(node, {}).items() if u in listed}
        wanting = [p for p in listed.values() if _wants(p, self._kubelet)]
        if not wanting:
            return NodeDevices(self._kubelet)
        if self._source is None:
            return NodeDevices(self._kubelet, tried=(KUBELET, f"{EXPORTER} (not configured)"))
        if unnamed := _unnamed_units(card):
            return NodeDevices(self._kubelet, tried=(KUBELET, f"{EXPORTER} (not used: {unnamed})"))
        unknown = [p for p in wanting if _uid(p) not in named]
        note = "answered"
        if unknown:
            answer = self._answer(node, now)
            if isinstance(answer, str):
                note = f"no answer: {answer}"
            elif shared := _shared(answer):
                # Two pods on one GPU: it is shared (time-slicing without the label), and the
                # series name the GPU, not the replica: nothing they said of this node stands.
                named.clear()
                note = (
                    f"not used: {shared} named for several pods, a shared GPU whose replicas it does not name"
                )
                return NodeDevices(self._kubelet, tried=(KUBELET, f"{EXPORTER} ({note})"))
            else:
                for pod in unknown:
                    if answer.get(_key(pod)):
                        named[_uid(pod)] = answer[_key(pod)]
                missing = sorted(_key(p)[1] for p in unknown if _uid(p) not in named)
                if missing:
                    note = f"no series yet for {', '.join(missing)}"
        return NodeDevices(self._kubelet, dict(named), (KUBELET, f"{EXPORTER} ({note})"))

    def _answer(self, node: str, now: float) -> Mapping[PodKey, tuple[str, ...]] | str:
        cached = self._answers.get(node)
        if cached is not None and 0.0 <= now - cached[0] < ANSWER_SECONDS:
            return cached[1]
        assert self._source is not None
        answer: Mapping[PodKey, tuple[str, ...]] | str
        try:
            answer = self._source.devices(node)
        except AllocationsUnavailable as exc:
            log.warning("hold on %s: the exporter's allocations unreadable: %s", node, exc)
            answer = str(exc)
        self._answers = {
            node: (now, answer),
            **{n: a for n, a in self._answers.items() if 0.0 <= now - a[0] < ANSWER_SECONDS},
        }
        return answer


def _unnamed_units(card: Card) -> str:
    """Why the exporter's series cannot tell the card's units apart ("": they can): its `device`
    is the GPU, never a MIG partition (node mode folds them onto their card) or a replica."""
    if card.partitions:
        return "a MIG card, whose partitions it names as the card"
    if card.replicas > 1:  # GPU feature discovery labels an unshared GPU 1
        return "time-sliced GPUs, whose replicas it does not name"
    return ""


def _shared(answer: Mapping[PodKey, tuple[str, ...]]) -> str:
    """A device the answer names for more than one pod ("": none)."""
    seen: set[str] = set()
    for ids in answer.values():
        for device in ids:
            if device in seen:
                return device
            seen.add(device)
    return ""


def _wants(pod: Mapping[str, Any], kubelet: Callable[[Mapping[str, Any]], tuple[str, ...]]) -> bool:
    """A pod the kubelet should have named devices for and did not: running, asking for a device
    resource (`nvidia.com/...`: whole GPUs and MIG partitions alike), no report."""
    if (pod.get("status") or {}).get("phase") != "Running" or kubelet(pod):
        return False
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = (container or {}).get("resources") or {}
        for part in ("limits", "requests"):
            if any(str(name).startswith("nvidia.com/") for name in (resources.get(part) or {})):
                return True
    return False


def _key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")
