"""Server-side defaulting: the fields the apiserver fills in on an API client's write.

Pure functions over plain objects, run on every validated write (create, update, patch), before
validation, as the apiserver's decoder defaults before its strategies validate. Defaulting is
idempotent: a complete object is left as it is, so updates re-default harmlessly.

Covered: Pods (spec, containers, status.qosClass, and on create the admission-set
serviceAccountName, priority and the two NoExecute tolerations), pod templates of Deployments, ReplicaSets,
StatefulSets and Jobs plus those kinds' own defaults, Namespaces (finalizer and the
`kubernetes.io/metadata.name` label), Secrets' type. Anything else is stored as given.
The simulator's in-process writes (`validate=False`) skip this: the fleet writes complete objects
of its own and would only pay for it at 80,000 pods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.apiserver.values import parse_quantity

DEFAULT_TOLERATION_SECONDS = 300
"""The DefaultTolerationSeconds admission plugin's not-ready/unreachable toleration (seconds)."""
_DEFAULT_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _dict(parent: dict[str, Any], key: str) -> dict[str, Any] | None:
    """`parent[key]` as a mapping, created when absent; None when it holds something else."""
    value = parent.setdefault(key, {})
    return value if isinstance(value, dict) else None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def image_pull_policy(image: str) -> str:
    """Always for `:latest` or an untagged image, else IfNotPresent (a digest pins the image)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "Always"
    return "Always" if last.rsplit(":", 1)[1] == "latest" else "IfNotPresent"


def _container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = container.get("image")
    if isinstance(image, str) and image:
        container.setdefault("imagePullPolicy", image_pull_policy(image))
    resources = _dict(container, "resources")
    if resources is not None:
        limits = resources.get("limits")
        if isinstance(limits, dict) and limits:
            requests = _dict(resources, "requests")
            if requests is not None:
                for name, quantity in limits.items():
                    requests.setdefault(name, quantity)
    for port in _dicts(container.get("ports")):
        port.setdefault("protocol", "TCP")


def pod_spec(spec: dict[str, Any]) -> None:
    """Defaults of a PodSpec, in a pod or in a workload's pod template."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for container in _dicts(spec.get(key)):
            _container(container)


def _template(spec: dict[str, Any]) -> None:
    template = spec.get("template")
    if isinstance(template, dict):
        tspec = _dict(template, "spec")
        if tspec is not None:
            pod_spec(tspec)


def qos_class(spec: dict[str, Any]) -> str:
    """Guaranteed, Burstable or BestEffort from the containers' cpu and memory requests and limits."""
    containers = _dicts(spec.get("containers")) + _dicts(spec.get("initContainers"))
    any_set = False
    guaranteed = True
    for container in containers:
        resources = _mapping(container.get("resources"))
        requests, limits = _mapping(resources.get("requests")), _mapping(resources.get("limits"))
        for name in ("cpu", "memory"):
            request, limit = requests.get(name), limits.get(name)
            if request is not None or limit is not None:
                any_set = True
            if limit is None or request is None or _quantity(request) != _quantity(limit):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _quantity(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except ValueError:
        return value


def _pod(obj: dict[str, Any], create: bool) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    pod_spec(spec)
    status = obj.get("status")
    if isinstance(status, dict) and "qosClass" not in status:
        status["qosClass"] = qos_class(spec)
    if not create:
        return
    # What the ServiceAccount, Priority and DefaultTolerationSeconds admission plugins add on create.
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = account
    spec["serviceAccount"] = account
    if not spec.get("priorityClassName"):
        spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    if isinstance(tolerations, list):
        for key in _DEFAULT_TOLERATION_KEYS:
            covered = any(
                t.get("key") == key and t.get("effect") in (None, "", "NoExecute")
                for t in _dicts(tolerations)
            ) or any(not t.get("key") and t.get("operator") == "Exists" for t in _dicts(tolerations))
            if not covered:
                tolerations.append(
                    {
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                    }
                )


def _namespace(obj: dict[str, Any], create: bool) -> None:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        labels = _dict(meta, "labels")
        if labels is not None:
            labels[NAMESPACE_NAME_LABEL] = meta["name"]
    spec = _dict(obj, "spec")
    if spec is not None:
        spec.setdefault("finalizers", ["kubernetes"])


def _deployment(obj: dict[str, Any], create: bool) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    strategy = _dict(spec, "strategy")
    if strategy is not None:
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = _dict(strategy, "rollingUpdate")
            if rolling is not None:
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    _template(spec)


def _replicaset(obj: dict[str, Any], create: bool) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        _template(spec)


def _statefulset(obj: dict[str, Any], create: bool) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = _dict(spec, "updateStrategy")
    if strategy is not None:
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = _dict(strategy, "rollingUpdate")
            if rolling is not None:
                rolling.setdefault("partition", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    retention = _dict(spec, "persistentVolumeClaimRetentionPolicy")
    if retention is not None:
        retention.setdefault("whenDeleted", "Retain")
        retention.setdefault("whenScaled", "Retain")
    _template(spec)


def _job(obj: dict[str, Any], create: bool) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimitPerIndex") is None:
        spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if spec.get("podFailurePolicy") is None:
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    _job_selector(obj, spec)
    _template(spec)


def _job_selector(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    """The Job strategy's generated selector: the job's uid, also stamped on the pod template's labels."""
    if spec.get("manualSelector") is True:
        return
    meta = _mapping(obj.get("metadata"))
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not isinstance(name, str):
        return
    template = spec.get("template")
    if not isinstance(template, dict):
        return
    tmeta = _dict(template, "metadata")
    labels = _dict(tmeta, "labels") if tmeta is not None else None
    if labels is None:
        return
    if spec.get("selector") is None:
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels.setdefault("batch.kubernetes.io/controller-uid", uid)
    labels.setdefault("batch.kubernetes.io/job-name", name)
    labels.setdefault("controller-uid", uid)
    labels.setdefault("job-name", name)


def _secret(obj: dict[str, Any], create: bool) -> None:
    obj.setdefault("type", "Opaque")


_BY_KEY: dict[str, Callable[[dict[str, Any], bool], None]] = {
    "pods": _pod,
    "namespaces": _namespace,
    "secrets": _secret,
    "deployments.apps": _deployment,
    "replicasets.apps": _replicaset,
    "statefulsets.apps": _statefulset,
    "jobs.batch": _job,
}


def apply_defaults(resource: str, obj: dict[str, Any], *, create: bool = True) -> None:
    """Fill in, in place, the fields the apiserver defaults for this resource (a registry key).

    `create=False` for updates: the admission plugins' additions (a pod's service account,
    priority and not-ready/unreachable tolerations) happen on create only.
    """
    fn = _BY_KEY.get(resource)
    if fn is not None:
        fn(obj, create)


def apply_schema_defaults(obj: Any, schema: Any) -> None:
    """A custom resource's structural-schema `default`s, set in place where a field is absent."""
    if not isinstance(schema, dict):
        return
    if isinstance(obj, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if key not in obj and isinstance(sub, dict) and "default" in sub:
                    obj[key] = _copy(sub["default"])
                if key in obj:
                    apply_schema_defaults(obj[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for value in obj.values():
                apply_schema_defaults(value, additional)
    elif isinstance(obj, list):
        for value in obj:
            apply_schema_defaults(value, schema.get("items"))


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


__all__ = [
    "DEFAULT_TOLERATION_SECONDS",
    "NAMESPACE_NAME_LABEL",
    "apply_defaults",
    "apply_schema_defaults",
    "image_pull_policy",
    "pod_spec",
    "qos_class",
]
