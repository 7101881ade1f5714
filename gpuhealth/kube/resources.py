"""Resource types and the REST paths built from them, so no call site glues a URL together.

A `Resource` is what the apiserver serves at `/api/v1/...` (core group) or
`/apis/GROUP/VERSION/...`: a plural name, and whether objects live in a namespace. Paths
check their parts: a cluster-scoped resource takes no namespace, a namespaced object needs
one, names are single path segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

STATUS: Final = "status"
"""The status subresource: writes there change only `.status`, elsewhere `.status` is ignored."""


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource type of one API version (`Resource("", "v1", "pods", namespaced=True)`)."""

    group: str
    """API group; empty for the core group (pods, nodes, namespaces)."""
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The objects' `apiVersion`: `v1` or `GROUP/VERSION`."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The path of a collection (all namespaces when `namespace` is None), an object or a subresource."""
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.plural} are cluster-scoped: no namespace")
        if name is not None and self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} are namespaced: an object needs its namespace")
        if subresource is not None and name is None:
            raise ValueError("a subresource belongs to an object: give its name")
        parts = ["/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"]
        if namespace is not None:
            parts += ("namespaces", _segment(namespace, "namespace"))
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name, "name"))
        if subresource is not None:
            parts.append(_segment(subresource, "subresource"))
        return "/".join(parts)


def _segment(value: str, what: str) -> str:
    # A slash (or a dot segment) would name another path than the one meant; other
    # characters some names allow (":" in RBAC names) are escaped, as the official client does.
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"invalid {what} {value!r}: must be one non-empty path segment")
    return quote(value, safe="")


POD: Final = Resource("", "v1", "pods", namespaced=True)
NODE: Final = Resource("", "v1", "nodes", namespaced=False)
NAMESPACE: Final = Resource("", "v1", "namespaces", namespaced=False)
LEASE: Final = Resource("coordination.k8s.io", "v1", "leases", namespaced=True)
RESOURCE_CLAIM: Final = Resource("resource.k8s.io", "v1", "resourceclaims", namespaced=True)
RESOURCE_SLICE: Final = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
CONFIG_MAP: Final = Resource("", "v1", "configmaps", namespaced=True)
