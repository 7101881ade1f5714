"""Pure parsing of Pod objects into device health observations.

Owns the reading of `pod.status.containerStatuses[].allocatedResourcesStatus` for both
allocation paths, over the typed Structs of `exporter.decode` (the fast path) and over
plain dicts as orjson returns them (the tolerant path, for whatever the Structs' types
reject); never the client's models: deserialising into them costs about 22x a JSON parse.
Nothing here raises on bad input: every malformed piece is dropped or degraded and its
reason reported in `errors`, so the observer counts it and goes on.

- Device plugins: `name` is the extended resource, `resourceID` the device ID; an NVIDIA
  `<uuid>::<n>` is replica `n` of the physical `<uuid>`, and the physical one is the device.
- DRA: `name` is `claim:<podClaimName>` or `claim:<podClaimName>/<request>`; the pod claim
  name resolves to the generated ResourceClaim through `status.resourceClaimStatuses` (or
  `spec.resourceClaims[].resourceClaimName`). Which device of the claim an entry means is
  decided later by `exporter.identity`, which knows the claims.
- Only `containerStatuses` are read: the kubelet never fills init or ephemeral ones.
- A DRA pod's claims as its containers use them (`spec.containers[].resources.claims`) are read
  too, resolved to their ResourceClaims the same way, under the name the kubelet reports them by:
  where a kubelet writes no `allocatedResourcesStatus` (the `ResourceHealthStatus` gate off,
  before 1.36) the state holds them through the claim (`PodObservation.claimed`).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import orjson

from exporter.decode import (
    DecodeError,
    ExtendedClaimStatus,
    Pod,
    PodSpec,
    PodStatus,
    ResourceGroup,
    detached,
    plain_json,
    resource_groups,
)
from exporter.snapshot import HEALTH_VALUES
from gpuhealth.kube.watch import INVALID_JSON as INVALID_JSON  # watch lines: reasons of this vocabulary too
from gpuhealth.kube.watch import MALFORMED_EVENT as MALFORMED_EVENT

MAX_MESSAGE_CHARS: Final = 1024
"""The API limit on a health message; longer ones are cut and counted."""

CLAIM_PREFIX: Final = "claim:"

# Parse error reasons: a fixed vocabulary, since each becomes a metric label value.
MALFORMED_POD: Final = "malformed_pod"
MALFORMED_CONTAINER_STATUS: Final = "malformed_container_status"
MALFORMED_ENTRY: Final = "malformed_entry"
MISSING_RESOURCE_ID: Final = "missing_resource_id"
INVALID_HEALTH: Final = "invalid_health"
INVALID_MESSAGE: Final = "invalid_message"
MESSAGE_TOO_LONG: Final = "message_too_long"
CLAIM_UNRESOLVED: Final = "claim_unresolved"
MALFORMED_CLAIM: Final = "malformed_claim"
MALFORMED_SLICE: Final = "malformed_slice"
MALFORMED_LEASE: Final = "malformed_lease"
MALFORMED_PRODUCER: Final = "malformed_producer"
MALFORMED_NODE: Final = "malformed_node"

_HEALTH: Final = frozenset(HEALTH_VALUES)
_EMPTY: Final[dict[str, Any]] = {}
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
"""Pod phases the kubelet no longer updates; their devices are released."""


class ResourceEntry(NamedTuple):
    """One `allocatedResourcesStatus[].resources[]` item of one container.

    A NamedTuple rather than a frozen dataclass: built for every entry of every changed
    pod, where construction cost shows in the event-processing benchmark.
    """

    container: str
    resource: str
    """The entry's `name`: `nvidia.com/gpu` or `claim:<podClaimName>[/<request>]`."""
    resource_id: str
    health: str
    """One of HEALTH_VALUES (anything else was read as Unknown and counted)."""
    message: str
    position: int
    """Position among the entries of the same container and `name` (maps CDI IDs to results)."""
    device: str = ""
    """Device plugins: the physical device ID (replica suffix removed). Empty for DRA."""
    replica: str = ""
    """Device plugins: `n` of `<uuid>::<n>`, else empty."""
    pod_claim: str = ""
    """DRA: the pod's claim name (`podClaimName`)."""
    request: str = ""
    """DRA: the request name, empty when the entry names the whole claim."""
    claim: str = ""
    """DRA: the generated ResourceClaim name, empty while the pod does not say it yet."""

    @property
    def is_dra(self) -> bool:
        return bool(self.pod_claim)


class ExtendedAllocation(NamedTuple):
    """Devices a container holds through a claim's request, with no health said about them.

    One `requestMappings[]` item of `status.extendedResourceClaimStatus` (KEP-5004): the
    scheduler's special claim (the kubelet writes no allocatedResourcesStatus for such pods:
    kubernetes#139939); or one `spec.containers[].resources.claims[]` item of a DRA pod
    (`PodObservation.claimed`)."""

    container: str
    resource: str
    """The extended resource, `nvidia.com/gpu`; for a DRA pod's claim, the name the kubelet
    reports it by: `claim:<podClaimName>[/<request>]`."""
    claim: str
    """The ResourceClaim's name (the special one for KEP-5004)."""
    request: str
    """The claim's request that serves it (its name is the scheduler's; read, never derived);
    empty where a container uses the whole claim."""


class PodObservation(NamedTuple):
    """What one Pod object says about devices, with the reasons of anything dropped."""

    uid: str
    namespace: str
    name: str
    node: str
    resource_version: str
    terminal: bool
    """Succeeded or Failed: the kubelet no longer updates it and its devices are released."""
    entries: tuple[ResourceEntry, ...]
    errors: tuple[str, ...] = ()
    extended: tuple[ExtendedAllocation, ...] = ()
    """Devices held through a DRA-backed extended resource: allocations without reports."""
    claimed: tuple[ExtendedAllocation, ...] = ()
    """The pod's DRA claims as its containers use them, those whose ResourceClaim the pod names:
    held with no report where its kubelet writes none on them (`PodLayout.resolve_silent`)."""


def pod_signature(pod: dict[str, Any]) -> bytes | None:
    """The parts of a Pod that observations depend on, serialised for comparison.

    Most pod updates change nothing device-related (conditions, probes, restarts); equal
    signatures let the state skip parsing and treat the event as a confirmation. Bytes
    rather than the parsed pieces: serialising the fresh event's pieces and comparing one
    compact value costs about half of a deep comparison against the previous event's
    dicts, which are cold in the CPU cache by then (and keeping them alive would hold
    thousands of small objects per pod). None when the pod is too malformed to have one.
    The claims of `spec.containers` (`PodObservation.claimed`) are left out: the API refuses to
    change them, so they cannot move between two versions of one pod.
    """
    try:
        status = pod.get("status") or _EMPTY
        spec = pod.get("spec") or _EMPTY
        statuses = status.get("containerStatuses") or ()
        if statuses.__class__ is list and len(statuses) == 1 and statuses[0].__class__ is dict:
            # The usual pod, one container: a flat tuple (no per-container list to build,
            # about 30% cheaper). Its shape differs from the general one's, so the two never
            # compare equal, and one pod always takes the same path for the same content.
            cs = statuses[0]
            return orjson.dumps(
                (
                    spec.get("nodeName"),
                    status.get("phase"),
                    cs.get("name"),
                    cs.get("allocatedResourcesStatus"),
                    status.get("resourceClaimStatuses"),
                    spec.get("resourceClaims"),
                    status.get("extendedResourceClaimStatus"),
                )
            )
        return orjson.dumps(
            (
                spec.get("nodeName"),
                status.get("phase"),
                [(cs.get("name"), cs.get("allocatedResourcesStatus")) for cs in statuses],
                status.get("resourceClaimStatuses"),
                spec.get("resourceClaims"),
                status.get("extendedResourceClaimStatus"),
            )
        )
    except (AttributeError, TypeError, orjson.JSONEncodeError):
        return None


def _claim_names(pod: dict[str, Any], errors: list[str]) -> dict[str, str]:
    """podClaimName -> generated ResourceClaim name, from spec and status."""
    names: dict[str, str] = {}
    spec = pod.get("spec")
    status = pod.get("status")
    for source in (
        spec.get("resourceClaims") if isinstance(spec, dict) else None,
        status.get("resourceClaimStatuses") if isinstance(status, dict) else None,
    ):
        if not source:
            continue
        if not isinstance(source, list):
            errors.append(MALFORMED_POD)
            continue
        for item in source:
            if not isinstance(item, dict):
                errors.append(MALFORMED_POD)
                continue
            pod_claim, claim = item.get("name"), item.get("resourceClaimName")
            if isinstance(pod_claim, str) and isinstance(claim, str) and claim:
                names[pod_claim] = claim
    return names


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def is_terminal_status(status: Any) -> bool:
    """Whether a Pod dict's `status` says Succeeded or Failed (anything malformed is not)."""
    phase = status.get("phase") if isinstance(status, dict) else None
    return isinstance(phase, str) and phase in TERMINAL_PHASES


def parse_pod(pod: Any) -> PodObservation | None:
    """Read a Pod dict; None when it lacks the identity needed to track it at all."""
    if not isinstance(pod, dict):
        return None
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return None
    uid = _text(meta.get("uid"))
    namespace = _text(meta.get("namespace"))
    name = _text(meta.get("name"))
    if not (namespace and name):
        return None
    errors: list[str] = []
    spec = pod.get("spec")
    status = pod.get("status")
    if spec is not None and not isinstance(spec, dict):
        errors.append(MALFORMED_POD)
        spec = None
    if status is not None and not isinstance(status, dict):
        errors.append(MALFORMED_POD)
        status = None
    node = _text(spec.get("nodeName")) if spec else ""
    terminal = is_terminal_status(status)
    entries: list[ResourceEntry] = []
    statuses = status.get("containerStatuses") if status else None
    claim_names: dict[str, str] | None = None
    if statuses:
        if isinstance(statuses, list):
            claim_names = _claim_names(pod, errors)
            for cs in statuses:
                _parse_container(cs, claim_names, entries, errors)
        else:
            errors.append(MALFORMED_POD)
    extended = _extended_dict(status.get("extendedResourceClaimStatus") if status else None, errors)
    claimed: tuple[ExtendedAllocation, ...] = ()
    uses = _container_claims_dict(spec.get("containers") if spec else None, errors)
    if uses:
        if claim_names is None:
            claim_names = _claim_names(pod, errors)
        claimed = _holdings(uses, claim_names)
    return PodObservation(
        uid=uid or f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        node=node,
        resource_version=_text(meta.get("resourceVersion")),
        terminal=terminal,
        entries=tuple(entries),
        errors=tuple(errors),
        extended=extended,
        claimed=claimed,
    )


def _container_claims_dict(containers: Any, errors: list[str]) -> list[tuple[str, str, str]]:
    """(container, pod claim, request) of each `spec.containers[].resources.claims[]` item of a
    Pod dict; a piece of the wrong type counts and says nothing."""
    if not containers:
        return []
    if not isinstance(containers, list):
        errors.append(MALFORMED_POD)
        return []
    out = []
    for c in containers:
        resources = c.get("resources") if isinstance(c, dict) else None
        claims = resources.get("claims") if isinstance(resources, dict) else None
        if not claims:
            continue
        if not isinstance(claims, list):
            errors.append(MALFORMED_POD)
            continue
        container = c.get("name")
        for item in claims:
            name = item.get("name") if isinstance(item, dict) else None
            request = item.get("request") if isinstance(item, dict) else None
            if name is None:
                continue  # as the Struct path reads it: nothing to hold
            if not isinstance(name, str) or (request is not None and not isinstance(request, str)):
                errors.append(MALFORMED_POD)
                continue
            if isinstance(container, str):
                out.append((container, name, request or ""))
    return out


def _container_claims_struct(spec: PodSpec | None) -> list[tuple[str, str, str]]:
    """`_container_claims_dict` over the decoded Struct (msgspec checked the types)."""
    out = []
    for c in (spec.containers if spec is not None else None) or ():
        claims = c.resources.claims if c.resources is not None else None
        for item in claims or ():
            if item.name is None:
                continue
            if c.name is not None:
                out.append((c.name, item.name, item.request or ""))
    return out


def _holdings(
    uses: list[tuple[str, str, str]], claim_names: dict[str, str]
) -> tuple[ExtendedAllocation, ...]:
    """The container claims whose ResourceClaim the pod names, under the name the kubelet reports
    them by (`claim:<podClaimName>[/<request>]`, as `_parse_container` reads it back)."""
    out = []
    for container, pod_claim, request in uses:
        claim = claim_names.get(pod_claim, "")
        if not (container and pod_claim and claim):
            continue
        resource = f"{CLAIM_PREFIX}{pod_claim}/{request}" if request else f"{CLAIM_PREFIX}{pod_claim}"
        out.append(ExtendedAllocation(container, resource, claim, request))
    return tuple(out)


def _extended_dict(raw: Any, errors: list[str]) -> tuple[ExtendedAllocation, ...]:
    """`status.extendedResourceClaimStatus` of a Pod dict; a malformed one counts and says nothing."""
    if raw is None:
        return ()
    claim = raw.get("resourceClaimName") if isinstance(raw, dict) else None
    mappings = raw.get("requestMappings") if isinstance(raw, dict) else None
    if not isinstance(claim, str) or not claim or not isinstance(mappings, list):
        errors.append(MALFORMED_POD)
        return ()
    out = []
    for item in mappings:
        fields = [_text(item.get(k)) if isinstance(item, dict) else "" for k in _MAPPING_KEYS]
        if not all(fields):
            errors.append(MALFORMED_POD)
            continue
        container, resource, request = fields
        out.append(ExtendedAllocation(container, resource, claim, request))
    return tuple(out)


_MAPPING_KEYS = ("containerName", "resourceName", "requestName")


def _extended_struct(raw: ExtendedClaimStatus | None, errors: list[str]) -> tuple[ExtendedAllocation, ...]:
    """`_extended_dict` over the decoded Struct."""
    if raw is None:
        return ()
    claim = raw.resource_claim_name
    if not claim or raw.request_mappings is None:
        errors.append(MALFORMED_POD)
        return ()
    out = []
    for m in raw.request_mappings:
        if not (m.container_name and m.resource_name and m.request_name):
            errors.append(MALFORMED_POD)
            continue
        out.append(ExtendedAllocation(m.container_name, m.resource_name, claim, m.request_name))
    return tuple(out)


def _parse_container(
    cs: Any, claim_names: dict[str, str], entries: list[ResourceEntry], errors: list[str]
) -> None:
    # One loop with the per-entry checks inline and positional NamedTuple construction: a
    # new pod's 8 entries are parsed on every pod replacement (measured: about 40% less
    # than a helper call per entry with keyword construction).
    if not isinstance(cs, dict):
        errors.append(MALFORMED_CONTAINER_STATUS)
        return
    allocated = cs.get("allocatedResourcesStatus")
    if not allocated:
        return
    container = cs.get("name")
    if not isinstance(container, str) or not isinstance(allocated, list):
        errors.append(MALFORMED_CONTAINER_STATUS)
        return
    health_values = _HEALTH
    for group in allocated:
        if not isinstance(group, dict):
            errors.append(MALFORMED_ENTRY)
            continue
        resource = group.get("name")
        resources = group.get("resources")
        if not isinstance(resource, str) or not resource or not isinstance(resources, list):
            if resources or resource:
                errors.append(MALFORMED_ENTRY)
            continue
        pod_claim = request = claim = ""
        dra = resource.startswith(CLAIM_PREFIX)
        if dra:
            pod_claim, _, request = resource[len(CLAIM_PREFIX) :].partition("/")
            if not pod_claim:
                errors.append(MALFORMED_ENTRY)
                continue
            claim = claim_names.get(pod_claim, "")
        index = 0
        for item in resources:
            if not isinstance(item, dict):
                errors.append(MALFORMED_ENTRY)
                continue
            resource_id = item.get("resourceID")
            if not isinstance(resource_id, str) or not resource_id:
                errors.append(MISSING_RESOURCE_ID)
                continue
            health = item.get("health")
            if not isinstance(health, str) or health not in health_values:
                # An unknown or missing value is not evidence of anything: read it as Unknown.
                errors.append(INVALID_HEALTH)
                health = "Unknown"
            message = item.get("message")
            if message is None:
                message = ""
            elif not isinstance(message, str):
                errors.append(INVALID_MESSAGE)
                message = ""
            elif len(message) > MAX_MESSAGE_CHARS:
                errors.append(MESSAGE_TOO_LONG)
                message = message[:MAX_MESSAGE_CHARS]
            if dra:
                device = replica = ""
            else:
                device, _, replica = resource_id.partition("::")
                if not device:
                    errors.append(MISSING_RESOURCE_ID)
                    continue
            entries.append(
                ResourceEntry(
                    container,
                    resource,
                    resource_id,
                    health,
                    message,
                    index,
                    device,
                    replica,
                    pod_claim,
                    request,
                    claim,
                )
            )
            index += 1


# ----- the typed fast path ------------------------------------------------------------
# The same reading over `exporter.decode` Structs, whose types msgspec already checked:
# only the value checks remain. It must give exactly what `parse_pod` gives for the dict
# the Struct came from (tests/exporter/test_decode_pods.py checks both on the same pods).


def pod_struct_signature(pod: Pod) -> tuple[PodSpec | None, PodStatus | None]:
    """A decoded pod's signature: its spec and status Structs hold only what devices depend on.

    They compare by value in C (the allocated resources as raw JSON bytes), and hold nothing
    unrelated (conditions, restart counts), so equal pairs mean nothing device-related
    moved. Never equal to a dict pod's bytes signature. Keep one with `kept_signature`.
    """
    return (pod.spec, pod.status)


def kept_signature(signature: object) -> object:
    """A signature to store: a Struct one stops referencing its event's whole buffer."""
    if signature.__class__ is tuple:
        spec, status = signature
        return (spec, detached(status))
    return signature


def parse_pod_struct(pod: Pod) -> PodObservation | None:
    """`parse_pod` over a decoded Pod Struct; None when it lacks the identity to track it."""
    meta = pod.metadata
    if meta is None:
        return None
    namespace = meta.namespace or ""
    name = meta.name or ""
    if not (namespace and name):
        return None
    errors: list[str] = []
    spec, status = pod.spec, pod.status
    node = (spec.node_name or "") if spec is not None else ""
    terminal = status is not None and status.phase in TERMINAL_PHASES
    entries: list[ResourceEntry] = []
    statuses = status.container_statuses if status is not None else None
    uses = _container_claims_struct(spec)
    claim_names: dict[str, str] = {}
    if statuses or uses:
        for source in (
            spec.resource_claims if spec is not None else None,
            status.resource_claim_statuses if status is not None else None,
        ):
            for ref in source or ():
                if ref.name is not None and ref.resource_claim_name:
                    claim_names[ref.name] = ref.resource_claim_name
    for cs in statuses or ():
        try:
            groups = resource_groups(cs.allocated_resources_status)
        except DecodeError:
            # Types the Structs reject: this container takes the tolerant dict path,
            # which counts each malformed piece (the raw bytes are valid JSON: the
            # event's decode checked them).
            allocated = plain_json(cs.allocated_resources_status)
            _parse_container(
                {"name": cs.name, "allocatedResourcesStatus": allocated}, claim_names, entries, errors
            )
            continue
        _parse_container_struct(cs.name, groups, claim_names, entries, errors)
    extended = _extended_struct(status.extended_resource_claim_status if status is not None else None, errors)
    return PodObservation(
        meta.uid or f"{namespace}/{name}",
        namespace,
        name,
        node,
        meta.resource_version or "",
        terminal,
        tuple(entries),
        tuple(errors),
        extended,
        _holdings(uses, claim_names) if uses else (),
    )


def _parse_container_struct(
    container: str | None,
    allocated: tuple[ResourceGroup, ...] | None,
    claim_names: dict[str, str],
    entries: list[ResourceEntry],
    errors: list[str],
) -> None:
    # Mirrors _parse_container check for check (see there for why it is one inline loop).
    if not allocated:
        return
    if container is None:
        errors.append(MALFORMED_CONTAINER_STATUS)
        return
    health_values = _HEALTH
    for group in allocated:
        resource = group.name
        resources = group.resources
        if not resource or resources is None:
            if resources or resource:
                errors.append(MALFORMED_ENTRY)
            continue
        pod_claim = request = claim = ""
        dra = resource.startswith(CLAIM_PREFIX)
        if dra:
            pod_claim, _, request = resource[len(CLAIM_PREFIX) :].partition("/")
            if not pod_claim:
                errors.append(MALFORMED_ENTRY)
                continue
            claim = claim_names.get(pod_claim, "")
        index = 0
        for item in resources:
            resource_id = item.resource_id
            if not resource_id:
                errors.append(MISSING_RESOURCE_ID)
                continue
            health = item.health
            if health is None or health not in health_values:
                errors.append(INVALID_HEALTH)
                health = "Unknown"
            message = item.message
            if message is None:
                message = ""
            elif len(message) > MAX_MESSAGE_CHARS:
                errors.append(MESSAGE_TOO_LONG)
                message = message[:MAX_MESSAGE_CHARS]
            if dra:
                device = replica = ""
            else:
                device, _, replica = resource_id.partition("::")
                if not device:
                    errors.append(MISSING_RESOURCE_ID)
                    continue
            entries.append(
                ResourceEntry(
                    container,
                    resource,
                    resource_id,
                    health,
                    message,
                    index,
                    device,
                    replica,
                    pod_claim,
                    request,
                    claim,
                )
            )
            index += 1
