"""What the real control plane does around creates of a few built-in kinds, done by the store.

- Namespaces carry the `kubernetes.io/metadata.name` label (the apiserver sets it on every
  namespace write; here at create, which is where gpuhealth's clients meet it), the
  namespace controller's `kubernetes` finalizer and the Active phase.
- Every namespace gets a ServiceAccount `default`, as the service-account controller creates one
  (here at once, in the same call, so no client ever sees a namespace without it).
- Services get their ClusterIP (`service_ips.py`).
- The bootstrap objects a fresh cluster has: the `kubernetes` Service in `default` and the two
  system PriorityClasses.

The store calls `prepare_create` before validation, `after_create` after the commit and
`bootstrap` once; nothing here touches HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.apiserver import propagation, service_ips
from simulator.apiserver.errors import ApiError

if TYPE_CHECKING:
    from simulator.apiserver.resources import ResourceInfo
    from simulator.apiserver.store import Store

NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_SERVICE_ACCOUNT = "default"

_SYSTEM_PRIORITY_CLASSES = (
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, "
        "but can be moved to another node if necessary.",
    ),
)


def prepare_create(store: Store, info: ResourceInfo, obj: dict[str, Any]) -> None:
    """Server-set fields of an object about to be created."""
    if info.key == "namespaces":
        # The namespace controller's finalizer and the Active phase, as the namespace strategy sets them.
        if obj.get("spec") is None:
            obj["spec"] = {}
        if isinstance(obj["spec"], dict):
            obj["spec"].setdefault("finalizers", [propagation.NAMESPACE_FINALIZER])
        if obj.get("status") is None:
            obj["status"] = {}
        if isinstance(obj["status"], dict):  # anything else fails validation
            obj["status"].setdefault("phase", "Active")
        meta = obj["metadata"]
        labels = meta.get("labels")
        if labels is None or isinstance(labels, dict):  # anything else fails validation
            meta["labels"] = {**(labels or {}), NAME_LABEL: str(meta["name"])}
    elif info.key == "services":
        entries, _ = store.list_entries("services")
        used = {(e.fields or {}).get("spec.clusterIP", "") for e in entries}
        service_ips.allocate(obj, used, store.rng)
    elif info.key == "pods":
        _admit_runtime_class(store, obj)


RUNTIME_CLASSES = "runtimeclasses.node.k8s.io"


def _admit_runtime_class(store: Store, pod: dict[str, Any]) -> None:
    """The RuntimeClass admission plugin: a pod naming a RuntimeClass that does not exist is
    refused (403), worded as kube-apiserver words it."""
    spec = pod.get("spec")
    name = spec.get("runtimeClassName") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not name:
        return
    try:
        store.get(RUNTIME_CLASSES, name)
    except ApiError as exc:
        if exc.code != 404:
            raise
        pod_name = pod["metadata"].get("name", "")
        message = f'pods "{pod_name}" is forbidden: pod rejected: RuntimeClass "{name}" not found'
        raise ApiError(403, "Forbidden", message, details={"name": pod_name, "kind": "pods"}) from None


def after_create(store: Store, info: ResourceInfo, obj: dict[str, Any]) -> None:
    """What controllers add right after an object exists."""
    if info.key == "namespaces":
        namespace = str(obj["metadata"]["name"])
        store.create(
            "serviceaccounts",
            {"metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}},
            validate=False,
        )


def bootstrap(store: Store) -> None:
    """The objects a freshly installed cluster has besides its namespaces."""
    store.create(
        "services",
        {
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {"component": "apiserver", "provider": "kubernetes"},
            },
            "spec": {
                "clusterIP": service_ips.kubernetes_service_ip(),
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}],
                "sessionAffinity": "None",
                "type": "ClusterIP",
            },
        },
        validate=False,
    )
    for name, value, description in _SYSTEM_PRIORITY_CLASSES:
        store.create(
            "priorityclasses.scheduling.k8s.io",
            {
                "metadata": {"name": name},
                "value": value,
                "description": description,
                "preemptionPolicy": "PreemptLowerPriority",
            },
            validate=False,
        )


__all__ = ["DEFAULT_SERVICE_ACCOUNT", "NAME_LABEL", "after_create", "bootstrap", "prepare_create"]
