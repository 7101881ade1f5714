"""Pure identity resolution for DRA devices.

Owns two indexes built from watched objects, and the rule that turns a pod's DRA entry
into a canonical device identity:

- ResourceClaims by (namespace, name): the allocation results `{request, driver, pool,
  device}` in order, the claim's uid (CDI device IDs embed it), and the uids of the pods its
  `status.reservedFor` lists (a pod whose kubelet reports nothing holds the devices only then).
- ResourceSlice devices by (driver, pool, device), as `gpuhealth.kube.slices` reads them, each
  as the exporter governs it (`GovernedDevice`): the node, the `uuid` attribute (the GPU UUID the
  NVIDIA driver publishes), and the taints the driver put on the device. A MIG device (its
  `parentUUID` attribute names its card) is its card here: its `uuid` is the card's, and its
  taints are all the taints on any MIG device of that card in the slice, so a pod on any
  partition is on the card and the card's health is its worst partition's (the card is the
  governed device, as on device plugins: `docs/quarantine.md`, "MIG: the card is the device").

The canonical identity is the GPU UUID where the slice gives one, else
`<driver>/<pool>/<device>`. Plain data in, plain data out; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from exporter.parse import MALFORMED_CLAIM, MALFORMED_SLICE, ResourceEntry
from gpuhealth.kube.slices import DeviceRef, DriverTaint, SliceDevice, parse_resource_slice


class ClaimResult(NamedTuple):
    """One allocation result (NamedTuples here: built per claim and per entry on hot paths)."""

    request: str
    driver: str
    pool: str
    device: str

    @property
    def ref(self) -> DeviceRef:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    namespace: str
    name: str
    uid: str
    results: tuple[ClaimResult, ...]
    by_device: dict[str, ClaimResult] = field(default_factory=dict, compare=False)
    """Results by device name (several pools may share a name: the first one wins here)."""
    reserved: frozenset[str] = frozenset()
    """The uids of the pods `status.reservedFor` lists (other consumers are not pods)."""

    def __post_init__(self) -> None:
        for result in self.results:
            self.by_device.setdefault(result.device, result)


@dataclass(frozen=True, slots=True)
class GovernedDevice:
    """A ResourceSlice device as the exporter governs it: a MIG device stands for its card."""

    sliced: SliceDevice
    """As its slice publishes it, but for the taints: its card's (`parse_slice`)."""
    health: tuple[str, str] = field(init=False, compare=False)
    """`slice_health(taints)`, computed once per slice event, read on every hand-back."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "health", slice_health(self.sliced.taints))

    @property
    def driver(self) -> str:
        return self.sliced.driver

    @property
    def pool(self) -> str:
        return self.sliced.pool

    @property
    def device(self) -> str:
        return self.sliced.device

    @property
    def node(self) -> str:
        return self.sliced.node

    @property
    def uuid(self) -> str:
        """The GPU UUID: the device's own, or a MIG device's card's (its `parentUUID`)."""
        return self.sliced.parent or self.sliced.uuid

    @property
    def mig_uuid(self) -> str:
        """A MIG device's own UUID (its `uuid` attribute); empty for a whole GPU."""
        return self.sliced.uuid if self.sliced.parent else ""

    @property
    def taints(self) -> tuple[DriverTaint, ...]:
        """The device's taints; a MIG device's: those on any MIG device of its card in the slice."""
        return self.sliced.taints

    @property
    def ref(self) -> DeviceRef:
        return self.sliced.ref


class Resolved(NamedTuple):
    """Where a DRA entry points: the result it maps to and the canonical identity."""

    driver: str
    pool: str
    device_name: str
    uuid: str

    @property
    def device(self) -> str:
        return self.uuid or f"{self.driver}/{self.pool}/{self.device_name}"

    @property
    def ref(self) -> DeviceRef:
        return (self.driver, self.pool, self.device_name)


UNHEALTHY_TAINTS = frozenset({"gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/xid", "gpu.nvidia.com/unhealthy"})
"""Driver taints that say the device is broken (the NVIDIA DRA driver's health keys: a lost GPU, a
fatal XID, and any other Unhealthy verdict of its health monitor) unless their effect is None."""
WARNING_EFFECT = "None"
"""The effect of a health taint the driver sets only to record an event: the NVIDIA DRA driver
taints an XID it classifies non-fatal (an application's error: 13, 31, 43, 45, 68, 109 and any it
is told to ignore) `gpu.nvidia.com/xid=<xid>:None`. The card is not broken by it: the device stays
Healthy, the taint's message and `gpu_device_driver_taint` carry the warning."""
UNKNOWN_TAINTS = frozenset({"gpu.nvidia.com/unmonitored"})
"""Driver taints that say the driver cannot tell (its health monitor is off for the device)."""
SLICE_HEALTHY_MESSAGE = "ResourceSlice: no driver health taint"
"""The message of a slice-reported Healthy: never one a kubelet writes, so a pod's first report
on a device that was idle is always a change (its source moves back to `pod`)."""


def slice_health(taints: tuple[DriverTaint, ...]) -> tuple[str, str]:
    """(health, message) a ResourceSlice's driver taints give a device no pod holds.

    The most severe taint wins; taints of other keys say nothing about health (Healthy as
    the driver publishes the device). A health taint with effect None that says the device is
    broken (`WARNING_EFFECT`) is a warning: Healthy, with the taint as its message."""
    unknown = warning = ""
    for taint in taints:
        if taint.key in UNHEALTHY_TAINTS:
            if taint.effect != WARNING_EFFECT:
                return "Unhealthy", f"ResourceSlice taint {_taint_text(taint)}"
            if not warning:
                warning = f"ResourceSlice taint {_taint_text(taint)} (non-fatal: a warning)"
        elif taint.key in UNKNOWN_TAINTS and not unknown:
            unknown = f"ResourceSlice taint {_taint_text(taint)}"
    if unknown:
        return "Unknown", unknown
    return "Healthy", warning or SLICE_HEALTHY_MESSAGE


def _taint_text(taint: DriverTaint) -> str:
    """`key=value:effect`, or `key:effect` for a taint without a value (kubectl's spelling)."""
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_claim(obj: Any) -> ClaimInfo | str:
    """A ResourceClaim dict as ClaimInfo, or the parse error reason."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return MALFORMED_CLAIM
    meta = obj["metadata"]
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    if not (namespace and name):
        return MALFORMED_CLAIM
    results: list[ClaimResult] = []
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    raw = devices.get("results") if isinstance(devices, dict) else None
    if raw is not None and not isinstance(raw, list):
        return MALFORMED_CLAIM
    for item in raw or ():
        if not isinstance(item, dict):
            return MALFORMED_CLAIM
        result = ClaimResult(  # positional: a claim's results are parsed on every pod replacement
            _text(item.get("request")),
            _text(item.get("driver")),
            _text(item.get("pool")),
            _text(item.get("device")),
        )
        if not (result.driver and result.pool and result.device):
            return MALFORMED_CLAIM
        results.append(result)
    return ClaimInfo(
        namespace=namespace,
        name=name,
        uid=_text(meta.get("uid")),
        results=tuple(results),
        reserved=_reserved_pods(status.get("reservedFor") if isinstance(status, dict) else None),
    )


def _reserved_pods(raw: Any) -> frozenset[str]:
    """The pod uids of `status.reservedFor`; a malformed item says no pod (never the claim
    malformed: its allocation still names the devices of pods that report on them)."""
    if not isinstance(raw, list):
        return frozenset()
    return frozenset(
        _text(item.get("uid"))
        for item in raw
        if isinstance(item, dict)
        and item.get("resource") == "pods"
        and not item.get("apiGroup")
        and item.get("uid")
    )


def parse_slice(obj: Any) -> tuple[str, tuple[GovernedDevice, ...]] | str:
    """A ResourceSlice dict (`gpuhealth.kube.slices.parse_resource_slice`) as (slice name,
    devices as governed), or the parse error reason: a slice without a name, driver or pool, or
    with a device entry that is not an object with a name, is malformed."""
    parsed = parse_resource_slice(obj)
    if parsed is None or not parsed.name or parsed.malformed_devices:
        return MALFORMED_SLICE
    card_taints: dict[str, list[DriverTaint]] = {}
    for sliced in parsed.devices:
        if sliced.parent:
            held = card_taints.setdefault(sliced.parent, [])
            held.extend(t for t in sliced.taints if t not in held)
    devices = tuple(
        GovernedDevice(replace(sliced, taints=tuple(card_taints[sliced.parent])) if sliced.parent else sliced)
        for sliced in parsed.devices
    )
    return parsed.name, devices


def split_ref(resource_id: str) -> DeviceRef | None:
    """`<driver>/<pool>/<device>` as a DeviceRef (pool names may themselves contain '/')."""
    driver, sep, rest = resource_id.partition("/")
    pool, sep2, device = rest.rpartition("/")
    if not (sep and sep2 and driver and pool and device) or "=" in resource_id:
        return None
    return (driver, pool, device)


def match_result(claim: ClaimInfo, entry: ResourceEntry) -> ClaimResult | None:
    """Which allocation result of `claim` the entry reports on.

    In order of confidence: a `<driver>/<pool>/<device>` resourceID names it outright; a
    CDI ID (`vendor/class=<claimUID>-<device>`) ends with the device name; otherwise the
    entry's position among its container's entries for this name picks the result of that
    position among the claim's results for the request (the kubelet lists them in order).
    """
    resource_id = entry.resource_id
    _, eq, cdi_name = resource_id.partition("=")
    if eq and claim.uid and cdi_name.startswith(claim.uid):
        # The usual `<claimUID>-<device>`: an exact look-up, no scan (checked first: it is
        # how the NVIDIA DRA driver names devices, and a new pod resolves all of its own).
        exact = claim.by_device.get(cdi_name[len(claim.uid) + 1 :])
        if exact is not None and (not entry.request or exact.request.partition("/")[0] == entry.request):
            return exact
    candidates = [r for r in claim.results if r.request == entry.request] if entry.request else claim.results
    if not candidates:
        # Sub-requests (`request/sub`) appear as such in results; match their parent too.
        candidates = [r for r in claim.results if r.request.partition("/")[0] == entry.request]
    ref = None if eq else split_ref(resource_id)
    if ref is not None:
        for result in claim.results:
            if result.ref == ref:
                return result
        return None
    if eq:
        named = [r for r in candidates if cdi_name == r.device or cdi_name.endswith(f"-{r.device}")]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            # Device names that are suffixes of each other (gpu-1, gpu-11): take the longest.
            return max(named, key=lambda r: len(r.device))
    if entry.position < len(candidates):
        return candidates[entry.position]
    return None


@dataclass(slots=True)
class IdentityIndex:
    """Claims and slice devices seen so far (mutated by the state, in one thread)."""

    claims: dict[tuple[str, str], ClaimInfo] = field(default_factory=dict)
    slices: dict[str, tuple[GovernedDevice, ...]] = field(default_factory=dict)
    devices: dict[DeviceRef, GovernedDevice] = field(default_factory=dict)

    def put_claim(self, claim: ClaimInfo) -> bool:
        """Store a claim; True when its results, uid or reservations changed."""
        key = (claim.namespace, claim.name)
        previous = self.claims.get(key)
        self.claims[key] = claim
        return (
            previous is None
            or previous.results != claim.results
            or previous.uid != claim.uid
            or previous.reserved != claim.reserved
        )

    def drop_claim(self, namespace: str, name: str) -> bool:
        return self.claims.pop((namespace, name), None) is not None

    def put_slice(self, name: str, devices: tuple[GovernedDevice, ...]) -> set[DeviceRef]:
        """Store a slice's devices; the refs whose uuid, taints or presence changed."""
        changed = self.drop_slice(name, keep=devices)
        self.slices[name] = devices
        for device in devices:
            if self.devices.get(device.ref) != device:
                changed.add(device.ref)
            self.devices[device.ref] = device
        return changed

    def drop_slice(self, name: str, keep: tuple[GovernedDevice, ...] = ()) -> set[DeviceRef]:
        """Forget a slice's devices (except those in `keep`); the refs that went away."""
        kept = {d.ref for d in keep}
        gone = set()
        for device in self.slices.pop(name, ()):
            if device.ref not in kept and self.devices.get(device.ref) == device:
                del self.devices[device.ref]
                gone.add(device.ref)
        return gone

    def resolve(self, namespace: str, entry: ResourceEntry) -> Resolved | None:
        """The device a DRA entry reports on, or None while its claim is unknown."""
        if not entry.claim:
            return None
        claim = self.claims.get((namespace, entry.claim))
        if claim is None:
            return None
        return self.resolve_in(claim, entry)

    def resolve_in(self, claim: ClaimInfo, entry: ResourceEntry) -> Resolved | None:
        """`resolve` once the entry's claim was looked up (a pod's entries share their claim)."""
        result = match_result(claim, entry)
        if result is None:
            return None
        sliced = self.devices.get((result.driver, result.pool, result.device))
        return Resolved(result.driver, result.pool, result.device, sliced.uuid if sliced is not None else "")

    def taints(self, ref: DeviceRef) -> tuple[DriverTaint, ...]:
        sliced = self.devices.get(ref)
        return sliced.taints if sliced is not None else ()
