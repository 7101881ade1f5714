"""Typed partial decoding of Pod watch events (the exporter's hot path).

Owns the msgspec Structs that hold only what the exporter reads of a Pod, and the ways
into them: a watch line (`decode_pod_event`), a page of a pod list (`decode_pod_page`)
and an already parsed dict (`pod_from_dict`, for anything that came through orjson).

Why: msgspec decoding a pod event into these Structs skips every field the exporter does
not read (conditions, images, labels, owner references ...) and builds no dicts for them;
measured at about 45% of the cost of `orjson.loads` of the full event, with the
allocated resources kept as raw JSON until needed. The Structs are frozen and compare by
value, so a pod's `(spec, status)` pair is its signature as it is (see
`exporter.parse.pod_struct_signature`); `gc=False` since they hold no cycles.

Strict types are the fast path only: anything whose types do not match (a health that is
a number, a container status that is a string ...) fails here, and the caller falls back
to the tolerant dict path of `exporter.parse`, which counts each malformed piece. Value
checks (an unknown health string, an empty resourceID, a message over the limit) are
`exporter.parse`'s on both paths.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from gpuhealth.kube.pages import Page, decode_page


class Resource(msgspec.Struct, frozen=True, gc=False):
    """One `allocatedResourcesStatus[].resources[]` item."""

    resource_id: str | None = msgspec.field(default=None, name="resourceID")
    health: str | None = None
    message: str | None = None


class ResourceGroup(msgspec.Struct, frozen=True, gc=False):
    """One `allocatedResourcesStatus[]` group: an extended resource or a DRA claim."""

    name: str | None = None
    resources: tuple[Resource, ...] | None = None


class ContainerStatus(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    name: str | None = None
    allocated_resources_status: msgspec.Raw = msgspec.Raw()
    """The field's JSON as it came (empty when absent), decoded by `resource_groups` only
    when the pod's signature moved: most events repeat it byte for byte, and skipping it
    costs a quarter of decoding it; comparing the bytes costs less than comparing Structs."""


class ClaimRef(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    """`spec.resourceClaims[]` or `status.resourceClaimStatuses[]`: pod claim name -> claim."""

    name: str | None = None
    resource_claim_name: str | None = None


class RequestMapping(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    """`status.extendedResourceClaimStatus.requestMappings[]`: which request of the special claim
    serves which extended resource of which container (KEP-5004)."""

    container_name: str | None = None
    resource_name: str | None = None
    request_name: str | None = None


class ExtendedClaimStatus(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    """`status.extendedResourceClaimStatus`: the claim kube-scheduler made for the pod's DRA-backed
    extended resources."""

    resource_claim_name: str | None = None
    request_mappings: tuple[RequestMapping, ...] | None = None


class ContainerClaim(msgspec.Struct, frozen=True, gc=False):
    """`spec.containers[].resources.claims[]`: a pod claim (and request) the container uses."""

    name: str | None = None
    request: str | None = None


class ContainerResources(msgspec.Struct, frozen=True, gc=False):
    claims: tuple[ContainerClaim, ...] | None = None


class ContainerSpec(msgspec.Struct, frozen=True, gc=False):
    """A container of `spec.containers`, reduced to the claims it uses (immutable in the API)."""

    name: str | None = None
    resources: ContainerResources | None = None


class PodSpec(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    node_name: str | None = None
    resource_claims: tuple[ClaimRef, ...] | None = None
    containers: tuple[ContainerSpec, ...] | None = None


class PodStatus(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    phase: str | None = None
    container_statuses: tuple[ContainerStatus, ...] | None = None
    resource_claim_statuses: tuple[ClaimRef, ...] | None = None
    extended_resource_claim_status: ExtendedClaimStatus | None = None


class PodMeta(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    uid: str | None = None
    namespace: str | None = None
    name: str | None = None
    resource_version: str | None = None


class Pod(msgspec.Struct, frozen=True, gc=False):
    """A Pod reduced to what device observations depend on, plus its identity."""

    metadata: PodMeta | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None


class PodEvent(msgspec.Struct, frozen=True, gc=False):
    type: str
    object: Pod | None = None


class ListMeta(msgspec.Struct, frozen=True, gc=False):
    resource_version: str | None = msgspec.field(default=None, name="resourceVersion")
    continue_token: str | None = msgspec.field(default=None, name="continue")


class PodList(msgspec.Struct, frozen=True, gc=False):
    """A page of a pod list: each pod as its partial Struct, never as a dict."""

    metadata: ListMeta | None = None
    items: list[Pod] | None = None


_pod_event_decoder = msgspec.json.Decoder(PodEvent)
_pod_list_decoder = msgspec.json.Decoder(PodList)
_pod_decoder = msgspec.json.Decoder(Pod)
_groups_decoder = msgspec.json.Decoder(tuple[ResourceGroup, ...] | None)

DecodeError = msgspec.DecodeError
"""Raised for invalid JSON and, as its subclass ValidationError, for mismatching types."""


def decode_pod_event(line: bytes) -> PodEvent:
    """A pod watch line as a PodEvent; raises DecodeError where the fast path does not apply."""
    return _pod_event_decoder.decode(line)


def decode_pod_page(body: bytes) -> Page:
    """A pod list page with its pods as Structs (`gpuhealth.kube.pages.PageDecoder`).

    The list's 15,000 pods of a 10,000-node fleet are about 180 MiB as dicts and a small
    part of that as these Structs. Their raw fields point into the page's bytes, which stay
    alive until the pods are applied (the state keeps only `detached` copies). Where some
    pod's types do not fit, the page is read as plain dicts instead, and each pod takes the
    state's own way in (`pod_from_dict`, else the tolerant dict path).
    """
    try:
        page = _pod_list_decoder.decode(body)
    except msgspec.DecodeError:
        return decode_page(body)
    meta = page.metadata or ListMeta()
    return Page(page.items or [], meta.continue_token or "", meta.resource_version or None)


def pod_from_dict(obj: Any) -> Pod | None:
    """A parsed Pod dict as a Pod Struct; None where its types do not fit (use the dict path).

    Through compact JSON, so the raw fields read as a watch event's would: a pod listed
    as a dict and its watched updates then compare equal where nothing moved (orjson keeps
    the key order it parsed, and the apiserver's JSON is compact too).
    """
    if not isinstance(obj, dict):
        return None
    try:
        return _pod_decoder.decode(orjson.dumps(obj))
    except (msgspec.DecodeError, orjson.JSONEncodeError):
        return None


def resource_groups(raw: msgspec.Raw) -> tuple[ResourceGroup, ...] | None:
    """A container's `allocatedResourcesStatus`; raises DecodeError where its types do not fit."""
    if not raw:
        return None
    return _groups_decoder.decode(raw)


def plain_json(raw: msgspec.Raw) -> Any:
    """A raw field as plain JSON values (dicts and lists), for the tolerant dict path."""
    return msgspec.json.decode(raw)


def detached(status: PodStatus | None) -> PodStatus | None:
    """`status` owning its raw fields' bytes, so keeping it does not pin the event's buffer."""
    if status is None or not status.container_statuses:
        return status
    return msgspec.structs.replace(
        status,
        container_statuses=tuple(
            msgspec.structs.replace(cs, allocated_resources_status=cs.allocated_resources_status.copy())
            for cs in status.container_statuses
        ),
    )
