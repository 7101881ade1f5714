"""The API client as the services use it: one protocol, `gpuhealth.kube.client.KubeClient`'s calls.

Services take an `Api` rather than a `KubeClient`, so their tests pass fakes that implement
the calls they make. Pure: the protocol and the plain types of its calls, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from gpuhealth.kube.resources import Resource

PropagationPolicy = Literal["Foreground", "Background", "Orphan"]
"""What happens to dependents (ownerReferences) of a deleted object."""


class PatchType(StrEnum):
    """The patch formats every resource accepts (strategic merge is left out: built-ins only)."""

    MERGE = "application/merge-patch+json"
    """RFC 7386: a partial object; null deletes a key, lists are replaced whole."""
    JSON = "application/json-patch+json"
    """RFC 6902: a list of operations (`test` ops make it conditional)."""


@dataclass(frozen=True, slots=True)
class ObjectList:
    """All pages of a list, and the resourceVersion to watch from."""

    items: list[dict[str, Any]]
    resource_version: str


class Api(Protocol):
    def get(
        self, resource: Resource, name: str, *, namespace: str | None = ..., subresource: str | None = ...
    ) -> dict[str, Any]: ...

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = ...,
        label_selector: str | None = ...,
        field_selector: str | None = ...,
        page_size: int = ...,
    ) -> ObjectList: ...

    def create(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = ...,
        subresource: str | None = ...,
        dry_run: bool = ...,
    ) -> dict[str, Any]: ...

    def update(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        subresource: str | None = ...,
        dry_run: bool = ...,
    ) -> dict[str, Any]: ...

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = ...,
        patch_type: PatchType = ...,
        subresource: str | None = ...,
        dry_run: bool = ...,
    ) -> dict[str, Any]: ...

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = ...,
        uid: str | None = ...,
        resource_version: str | None = ...,
        propagation_policy: PropagationPolicy | None = ...,
        dry_run: bool = ...,
    ) -> dict[str, Any]: ...

    def served_versions(self, group: str, plural: str) -> tuple[str, ...]: ...

    def proxy_get(
        self,
        resource: Resource,
        name: str,
        path: str,
        *,
        namespace: str | None = ...,
        port: int | str = ...,
        scheme: str = ...,
    ) -> dict[str, Any]: ...
