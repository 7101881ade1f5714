"""The resource registry of the simulated cluster: which resources exist and how they behave.

A `ResourceInfo` says everything the store and the HTTP layer need about one resource: group,
served versions, kind, scope, subresources and the fields a fieldSelector may use. The
`Registry` holds the built-in resources gpuhealth uses and the ones that CustomResourceDefinitions
add at run time; discovery documents are rendered from it.

Store keys name a resource by its plural with the group, as kubectl does: "pods",
"leases.coordination.k8s.io", "devicequarantines.gpuhealth.io".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.apiserver.errors import ApiError

_METADATA_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource."""

    group: str
    """API group; "" for the core group."""
    version: str
    """Storage version: objects are kept with this apiVersion and rewritten on read for the others."""
    plural: str
    singular: str
    kind: str
    namespaced: bool
    served_versions: tuple[str, ...] = ()
    """All versions served (storage version first when empty)."""
    subresources: tuple[str, ...] = ()
    """Subresources besides the main one ("status", "eviction")."""
    short_names: tuple[str, ...] = ()
    field_paths: tuple[str, ...] = ()
    """Dotted paths a fieldSelector may name, besides metadata.name and metadata.namespace."""
    generation: bool = True
    """Whether metadata.generation is kept (objects with a spec)."""
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, hash=False)
    """openAPIV3Schema per version, for custom resources only."""
    custom: bool = False
    """Defined by a CustomResourceDefinition (served generically, no strategic-merge patch)."""
    served: bool = True
    """False for a built-in this Kubernetes version (or its feature gates) does not serve over HTTP."""
    categories: tuple[str, ...] = ()
    """Discovery categories (`kubectl get all` lists the "all" ones)."""

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def versions(self) -> tuple[str, ...]:
        return self.served_versions or (self.version,)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def selectable_fields(self) -> tuple[str, ...]:
        return _METADATA_FIELDS + self.field_paths

    def api_version(self, version: str | None = None) -> str:
        v = version or self.version
        return f"{self.group}/{v}" if self.group else v

    def list_kind(self) -> str:
        return f"{self.kind}List"


def builtin_resources() -> list[ResourceInfo]:
    """Every built-in resource as Kubernetes 1.37 serves it (`versions.py` adjusts for others)."""
    resource_versions = ("v1", "v1beta2")
    return [
        ResourceInfo(
            "",
            "v1",
            "pods",
            "pod",
            "Pod",
            True,
            subresources=("status", "eviction"),
            short_names=("po",),
            categories=("all",),
            field_paths=(
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ),
        ),
        ResourceInfo(
            "",
            "v1",
            "nodes",
            "node",
            "Node",
            False,
            subresources=("status",),
            short_names=("no",),
            field_paths=("spec.unschedulable",),
        ),
        ResourceInfo(
            "",
            "v1",
            "events",
            "event",
            "Event",
            True,
            short_names=("ev",),
            generation=False,
            field_paths=(
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ),
        ),
        ResourceInfo(
            "", "v1", "configmaps", "configmap", "ConfigMap", True, short_names=("cm",), generation=False
        ),
        ResourceInfo(
            "",
            "v1",
            "namespaces",
            "namespace",
            "Namespace",
            False,
            subresources=("status",),
            short_names=("ns",),
            field_paths=("status.phase",),
            generation=False,
        ),
        ResourceInfo("coordination.k8s.io", "v1", "leases", "lease", "Lease", True, generation=False),
        # Workload controllers' kinds (simulator/fleet: ReplicaSet, Deployment, StatefulSet controllers).
        ResourceInfo(
            "apps",
            "v1",
            "deployments",
            "deployment",
            "Deployment",
            True,
            subresources=("status",),
            short_names=("deploy",),
        ),
        ResourceInfo(
            "apps",
            "v1",
            "replicasets",
            "replicaset",
            "ReplicaSet",
            True,
            subresources=("status",),
            short_names=("rs",),
        ),
        ResourceInfo(
            "apps",
            "v1",
            "statefulsets",
            "statefulset",
            "StatefulSet",
            True,
            subresources=("status",),
            short_names=("sts",),
        ),
        ResourceInfo(
            "",
            "v1",
            "replicationcontrollers",
            "replicationcontroller",
            "ReplicationController",
            True,
            subresources=("status",),
            short_names=("rc",),
            field_paths=("status.replicas",),
            categories=("all",),
        ),
        ResourceInfo(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "poddisruptionbudget",
            "PodDisruptionBudget",
            True,
            subresources=("status",),
            short_names=("pdb",),
        ),
        ResourceInfo(
            "batch",
            "v1",
            "jobs",
            "job",
            "Job",
            True,
            subresources=("status",),
            field_paths=("status.successful",),
            categories=("all",),
        ),
        ResourceInfo(
            "resource.k8s.io",
            "v1",
            "resourceclaims",
            "resourceclaim",
            "ResourceClaim",
            True,
            served_versions=resource_versions,
            subresources=("status",),
        ),
        ResourceInfo(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            "resourceslice",
            "ResourceSlice",
            False,
            served_versions=resource_versions,
            field_paths=("spec.nodeName", "spec.driver"),
        ),
        ResourceInfo(
            "resource.k8s.io",
            "v1",
            "devicetaintrules",
            "devicetaintrule",
            "DeviceTaintRule",
            False,
            served_versions=resource_versions,
            subresources=("status",),
        ),
        ResourceInfo(
            "resource.k8s.io",
            "v1",
            "resourceclaimtemplates",
            "resourceclaimtemplate",
            "ResourceClaimTemplate",
            True,
            served_versions=resource_versions,
        ),
        ResourceInfo(
            "resource.k8s.io",
            "v1",
            "deviceclasses",
            "deviceclass",
            "DeviceClass",
            False,
            served_versions=resource_versions,
        ),
        ResourceInfo(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            False,
            subresources=("status",),
            short_names=("crd", "crds"),
            categories=("api-extensions",),
        ),
        *_served_kinds(),
    ]


def _served_kinds() -> list[ResourceInfo]:
    """Kinds served as stored objects: what most clients and tools expect to find, with no
    controller behind them here beyond what `kinds.py` does at create."""
    return [
        ResourceInfo(
            "",
            "v1",
            "services",
            "service",
            "Service",
            True,
            subresources=("status",),
            short_names=("svc",),
            field_paths=("spec.clusterIP", "spec.type"),
            generation=False,
            categories=("all",),
        ),
        ResourceInfo(
            "",
            "v1",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            True,
            short_names=("sa",),
            generation=False,
        ),
        ResourceInfo("", "v1", "secrets", "secret", "Secret", True, field_paths=("type",), generation=False),
        ResourceInfo(
            "", "v1", "endpoints", "endpoints", "Endpoints", True, short_names=("ep",), generation=False
        ),
        ResourceInfo(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "endpointslice",
            "EndpointSlice",
            True,
            generation=False,
        ),
        ResourceInfo(
            "events.k8s.io",
            "v1",
            "events",
            "event",
            "Event",
            True,
            short_names=("ev",),
            generation=False,
        ),
        *(
            ResourceInfo(
                "rbac.authorization.k8s.io", "v1", plural, plural[:-1], kind, namespaced, generation=False
            )
            for plural, kind, namespaced in (
                ("roles", "Role", True),
                ("rolebindings", "RoleBinding", True),
                ("clusterroles", "ClusterRole", False),
                ("clusterrolebindings", "ClusterRoleBinding", False),
            )
        ),
        ResourceInfo(
            "apiregistration.k8s.io",
            "v1",
            "apiservices",
            "apiservice",
            "APIService",
            False,
            subresources=("status",),
            categories=("api-extensions",),
        ),
        ResourceInfo(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "priorityclass",
            "PriorityClass",
            False,
            short_names=("pc",),
            generation=False,
        ),
        # What the NVIDIA container toolkit installs (`nvidia`); a pod naming a missing one is refused.
        ResourceInfo(
            "node.k8s.io",
            "v1",
            "runtimeclasses",
            "runtimeclass",
            "RuntimeClass",
            False,
            generation=False,
        ),
    ]


CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"


def info_from_crd(crd: dict[str, Any]) -> ResourceInfo:
    """The resource a CustomResourceDefinition defines; ApiError 422 when the CRD is malformed."""
    name = str((crd.get("metadata") or {}).get("name", ""))

    def bad(field_path: str, message: str) -> ApiError:
        return ApiError(
            422,
            "Invalid",
            f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: {field_path}: {message}',
            details={"name": name, "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition"},
        )

    spec = crd.get("spec")
    if not isinstance(spec, dict):
        raise bad("spec", "Required value")
    group = spec.get("group")
    names = spec.get("names")
    if not isinstance(group, str) or "." not in group:
        raise bad("spec.group", "Invalid value: should be a domain with at least one dot")
    if not isinstance(names, dict) or not isinstance(names.get("plural"), str) or not names.get("kind"):
        raise bad("spec.names", "Required value: plural and kind are required")
    plural = names["plural"]
    if name != f"{plural}.{group}":
        raise bad("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        raise bad("spec.scope", 'Unsupported value: supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        raise bad("spec.versions", "Required value")
    served: list[str] = []
    storage: str | None = None
    schemas: dict[str, dict[str, Any]] = {}
    status = False
    selectable: list[str] = []
    for i, v in enumerate(versions):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            raise bad(f"spec.versions[{i}].name", "Required value")
        if v.get("served", True):
            served.append(v["name"])
        if v.get("storage"):
            if storage is not None:
                raise bad(
                    "spec.versions", "Invalid value: must have exactly one version marked as storage version"
                )
            storage = v["name"]
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if isinstance(schema, dict):
            schemas[v["name"]] = schema
        if "status" in (v.get("subresources") or {}):
            status = True
        for sf in v.get("selectableFields") or []:
            path = str(sf.get("jsonPath", "")).lstrip(".") if isinstance(sf, dict) else ""
            if path and path not in selectable:
                selectable.append(path)
    if storage is None:
        raise bad("spec.versions", "Invalid value: must have exactly one version marked as storage version")
    # Storage version first, then the others in the CRD's order.
    ordered = tuple([storage] + [v for v in served if v != storage]) if storage in served else tuple(served)
    return ResourceInfo(
        group,
        storage,
        plural,
        str(names.get("singular") or names["kind"].lower()),
        str(names["kind"]),
        scope == "Namespaced",
        served_versions=ordered,
        subresources=("status",) if status else (),
        short_names=tuple(str(s) for s in names.get("shortNames") or ()),
        categories=tuple(str(c) for c in names.get("categories") or ()),
        field_paths=tuple(selectable),
        schemas=schemas,
        custom=True,
    )


class Registry:
    """The resources served now: the built-ins plus those that CRDs define."""

    def __init__(self, builtins: list[ResourceInfo] | None = None) -> None:
        self._by_key: dict[str, ResourceInfo] = {
            info.key: info for info in (builtin_resources() if builtins is None else builtins)
        }

    def get(self, key: str) -> ResourceInfo:
        """The resource with this store key; ApiError 404 when none is served."""
        info = self._by_key.get(key)
        if info is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({key})")
        return info

    def find(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        """The resource served at group/version/plural, if any."""
        info = self._by_key.get(f"{plural}.{group}" if group else plural)
        if info is None or not info.served or version not in info.versions:
            return None
        return info

    def add(self, info: ResourceInfo) -> None:
        existing = self._by_key.get(info.key)
        if existing is not None and not existing.custom:
            raise ApiError(409, "Conflict", f"resource {info.key} is built in and cannot be redefined")
        self._by_key[info.key] = info

    def remove(self, key: str) -> None:
        info = self._by_key.get(key)
        if info is not None and info.custom:
            del self._by_key[key]

    def all(self) -> list[ResourceInfo]:
        return list(self._by_key.values())

    def in_group_version(self, group: str, version: str) -> list[ResourceInfo]:
        return [i for i in self._by_key.values() if i.served and i.group == group and version in i.versions]

    def groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """Named API groups (core excluded) with their served versions, preferred first."""
        seen: dict[str, list[str]] = {}
        for info in self._by_key.values():
            if not info.group or not info.served:
                continue
            versions = seen.setdefault(info.group, [])
            for v in info.versions:
                if v not in versions:
                    versions.append(v)
        return [(g, tuple(vs)) for g, vs in seen.items()]
