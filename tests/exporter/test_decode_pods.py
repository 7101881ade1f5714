"""The typed pod fast path (msgspec Structs) against the tolerant dict path.

Aspects covered: both parsers read the same observation from any pod whose types fit the
Structs (fixture pods of both allocation paths, and generated junk); the state is the
same whichever path the pods took; junk types fall back to the dict path and are counted
per entry as before; an unknown health string on the fast path reads as Unknown and is
counted; a health or message change inside an otherwise identical decoded pod is applied;
ERROR events (a Status, not a Pod) and bookmarks still decode; a listed dict pod and its
watched Struct updates share a signature (the update only confirms); list pages decode into
Structs (a page with a pod the Structs reject into dicts) and a relist folded page by page
ends where one given the whole list does, pods gone from it removed.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import parse
from exporter import state_pods as state
from exporter.decode import Pod, decode_pod_event, decode_pod_page, pod_from_dict
from exporter.observer import _resource_version, decode_event
from exporter.parse import parse_pod, parse_pod_struct
from exporter.state import CLAIMS, PODS, SLICES, DeviceStateStore
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)


def line(event_type: str, obj: Any) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj})


def fixture_pods() -> list[dict[str, Any]]:
    """Pods of every shape the parser knows: replicas, DRA with and without request, bad values."""
    dra = container(
        "main",
        ("claim:gpus/req", [resource("k8s.gpu.nvidia.com/claim=x-gpu-0", "Unhealthy", "XID 79")]),
        ("claim:whole", [resource("gpu-1")]),
    )
    return [
        pod("dp", container("main", ("nvidia.com/gpu", [resource(U0), resource(f"{U1}::3", "Unknown")]))),
        pod("dra", dra, claim_statuses={"gpus": "dra-gpus"}, spec_claims={"whole": "shared"}, rv=2),
        pod("bad", container("main", ("nvidia.com/gpu", [resource(U0, "Sick"), resource("")])), rv=3),
        pod("long", container("c", ("nvidia.com/gpu", [resource(U1, "Unhealthy", "x" * 1500)])), rv=4),
        pod("two", container("a", ("claim:", [resource("r")])), container("b"), phase="Succeeded", rv=5),
        pod("empty", container("main", ("", [])), node="", phase="Pending", rv=6),
        _unreported_dra(),
        {"metadata": {"name": "no-namespace"}},
        {"metadata": {"namespace": "ns", "name": "bare"}},
    ]


def _unreported_dra() -> dict[str, Any]:
    """A DRA pod whose kubelet writes no allocatedResourcesStatus: its containers' claims only."""
    obj = pod("silent", container("main"), container("side"), claim_statuses={"gpus": "dra-gpus"}, rv=9)
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus", "request": "req"}]}
    obj["spec"]["containers"][1]["resources"] = {"claims": [{"name": "gpus"}, {"name": "other"}]}
    return obj


@pytest.mark.parametrize("obj", fixture_pods())
def test_both_parsers_read_the_same_observation(obj: dict[str, Any]) -> None:
    struct = pod_from_dict(obj)
    assert struct is not None
    assert parse_pod_struct(struct) == parse_pod(obj)
    decoded = decode_pod_event(line("MODIFIED", obj)).object
    assert decoded == struct


_keys = st.sampled_from(
    ["metadata", "spec", "status", "containerStatuses", "allocatedResourcesStatus", "resources", "name",
     "resourceID", "health", "message", "nodeName", "uid", "namespace", "resourceClaimStatuses",
     "resourceClaims", "resourceClaimName", "resourceVersion", "phase", "containers", "claims", "request"]
)  # fmt: skip
_shaped = st.recursive(
    st.none() | st.integers() | st.text(max_size=6) | st.sampled_from(["Healthy", "claim:x/y", "GPU-1::2"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_keys, _shaped, max_size=4))
def test_any_pod_the_structs_accept_reads_the_same_on_both_paths(obj: dict[str, Any]) -> None:
    obj.setdefault("metadata", {"name": "p", "namespace": "n"})
    struct = pod_from_dict(obj)
    if struct is not None:
        assert parse_pod_struct(struct) == parse_pod(obj)


def _dra_world(store: DeviceStateStore) -> None:
    store.apply_event(SLICES, "ADDED", slice_("s", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    store.apply_event(CLAIMS, "ADDED", claim("dra-gpus", [("req", DRIVER, "node-1", "gpu-0")]))
    store.apply_event(CLAIMS, "ADDED", claim("shared", [("", DRIVER, "node-1", "gpu-1")]))


def test_the_state_is_the_same_whichever_path_the_pods_took(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [("ADDED", p) for p in fixture_pods()]
    events.append(
        ("MODIFIED", pod("dp", container("main", ("nvidia.com/gpu", [resource(U0, "Unhealthy")])), rv=7))
    )
    events.append(("DELETED", pod("long", rv=8)))
    fast = DeviceStateStore(clock)
    _dra_world(fast)
    for event_type, obj in events:
        decoded = decode_event(line(event_type, obj), PODS)
        assert not isinstance(decoded, str) and decoded[1].__class__ is Pod
        fast.apply_event(PODS, *decoded)
    monkeypatch.setattr(state, "pod_from_dict", lambda obj: None)  # every pod takes the dict path
    tolerant = DeviceStateStore(clock)
    _dra_world(tolerant)
    for event_type, obj in events:
        decoded = decode_event(line(event_type, obj))
        assert not isinstance(decoded, str) and isinstance(decoded[1], dict)
        tolerant.apply_event(PODS, *decoded)
    assert fast.snapshot().devices == tolerant.snapshot().devices
    assert fast.stats.parse_errors == tolerant.stats.parse_errors
    assert fast.stats.parse_errors[parse.INVALID_HEALTH] == 1
    assert fast.stats.parse_errors[parse.MISSING_RESOURCE_ID] == 1


def test_junk_types_fall_back_to_the_dict_path_and_are_counted(store: DeviceStateStore) -> None:
    junk = pod("p", container("main", ("nvidia.com/gpu", [resource(U0), {"resourceID": U1, "health": 5}])))
    junk["status"]["containerStatuses"].append("not a container status")
    decoded = decode_event(line("ADDED", junk), PODS)
    assert not isinstance(decoded, str) and isinstance(decoded[1], dict)
    store.apply_event(PODS, *decoded)
    assert store.stats.parse_errors[parse.INVALID_HEALTH] == 1
    assert store.stats.parse_errors[parse.MALFORMED_CONTAINER_STATUS] == 1
    d0, d1 = store.device("node-1", U0), store.device("node-1", U1)
    assert d0 is not None and d0.health == "Healthy"
    assert d1 is not None and d1.health == "Unknown"
    # Junk only inside the allocated resources: the event decodes, that container falls back.
    inner = pod("q", container("main", ("nvidia.com/gpu", [resource(U0, "Unhealthy"), {"resourceID": 7}])))
    decoded = decode_event(line("ADDED", inner), PODS)
    assert not isinstance(decoded, str) and decoded[1].__class__ is Pod
    store.apply_event(PODS, *decoded)
    assert store.stats.parse_errors[parse.MISSING_RESOURCE_ID] == 1
    d0 = store.device("node-1", U0)
    assert d0 is not None and d0.health == "Unhealthy"
    # Lines that are not events at all are reasons, never exceptions.
    assert decode_event(b"{not json", PODS) == parse.INVALID_JSON
    assert decode_event(b'{"object": {}}', PODS) == parse.MALFORMED_EVENT
    assert decode_event(b"[1, 2]", PODS) == parse.MALFORMED_EVENT
    assert decode_event(line("ADDED", [1]), PODS) == ("ADDED", [1])
    store.apply_event(PODS, "ADDED", [1])
    assert store.stats.parse_errors[parse.MALFORMED_POD] == 1
    assert sum(store.stats.parse_errors.values()) == 4


def test_an_unknown_health_string_on_the_fast_path_is_unknown_and_counted(store: DeviceStateStore) -> None:
    decoded = decode_event(
        line("ADDED", pod("p", container("m", ("nvidia.com/gpu", [resource(U0, "Ok")])))), PODS
    )
    assert not isinstance(decoded, str) and decoded[1].__class__ is Pod
    store.apply_event(PODS, *decoded)
    d = store.device("node-1", U0)
    assert d is not None and d.health == "Unknown"
    assert store.stats.parse_errors[parse.INVALID_HEALTH] == 1


def _dp(health: str, rv: int, message: str | None = None, restarts: int = 0) -> bytes:
    obj = pod(
        "p", container("main", ("nvidia.com/gpu", [resource(U0, health, message), resource(U1)])), rv=rv
    )
    obj["status"]["containerStatuses"][0]["restartCount"] = restarts
    return line("MODIFIED", obj)


def test_a_change_inside_an_otherwise_identical_decoded_pod_is_applied(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    def apply(raw: bytes) -> None:
        decoded = decode_event(raw, PODS)
        assert not isinstance(decoded, str) and decoded[1].__class__ is Pod
        store.apply_event(PODS, *decoded)

    apply(_dp("Healthy", 1))
    clock.advance(10)
    apply(_dp("Healthy", 2, restarts=4))  # unrelated fields only: a confirmation
    d = store.device("node-1", U0)
    assert d is not None and (d.status_version, d.observed_at) == (1, clock.now())
    apply(_dp("Unhealthy", 3, restarts=4))
    d = store.device("node-1", U0)
    assert d is not None and (d.health, d.status_version) == ("Unhealthy", 2)
    apply(_dp("Unhealthy", 4, message="XID 79"))
    d = store.device("node-1", U0)
    assert d is not None and (d.message, d.status_version) == ("XID 79", 3)
    assert store.stats.status_changes == 4


def test_a_listed_dict_pod_and_its_watched_struct_update_share_a_signature(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.relist(PODS, [orjson.loads(_dp("Healthy", 1))["object"]])
    clock.advance(10)
    decoded = decode_event(_dp("Healthy", 2, restarts=1), PODS)
    assert not isinstance(decoded, str)
    store.apply_event(PODS, *decoded)
    d = store.device("node-1", U0)
    assert d is not None and (d.status_version, d.observed_at) == (1, clock.now())
    assert store.stats.status_changes == 2  # the two creations, nothing since


def page(pods: list[Any], rv: str = "9", token: str = "") -> bytes:
    meta = {"resourceVersion": rv, **({"continue": token} if token else {})}
    return orjson.dumps({"kind": "PodList", "metadata": meta, "items": pods})


def test_a_pod_list_page_decodes_into_structs_or_whole_into_dicts() -> None:
    pods = fixture_pods()
    decoded = decode_pod_page(page(pods, token="next"))
    assert (decoded.continue_token, decoded.resource_version) == ("next", "9")
    assert [p.__class__ for p in decoded.items] == [Pod] * len(pods)
    assert decoded.items == [decode_pod_event(line("ADDED", p)).object for p in pods]
    junk = pod("junk", container("main", ("nvidia.com/gpu", [resource(U1)])))
    junk["status"]["containerStatuses"].append("not a container status")
    fallback = decode_pod_page(page([pods[0], junk]))
    assert fallback.items == [pods[0], junk] and fallback.resource_version == "9"
    with pytest.raises(ValueError, match="not JSON"):
        decode_pod_page(b"{")


def test_a_relist_folded_page_by_page_ends_as_a_whole_one(clock: ManualClock) -> None:
    before = [pod("gone", container("main", ("nvidia.com/gpu", [resource(U1)])))]
    pods = [p for p in fixture_pods() if p["metadata"].get("name") != "long"]
    whole, paged = DeviceStateStore(clock), DeviceStateStore(clock)
    for store in (whole, paged):
        _dra_world(store)
        store.relist(PODS, before)
    whole.relist(PODS, pods)
    seen: set[Any] = set()
    for start in range(0, len(pods), 3):
        paged.relist_page(PODS, decode_pod_page(page(pods[start : start + 3])).items, seen)
    assert paged.device("node-1", U1) is not None  # not yet: only the end of the list removes
    paged.relist_end(PODS, seen)
    assert paged.snapshot().devices == whole.snapshot().devices
    assert all(d.allocations[0].pod != "gone" for d in paged.snapshot().devices.values() if d.allocations)


def test_error_events_and_bookmarks_still_decode() -> None:
    gone = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
    assert decode_event(line("ERROR", gone), PODS) == ("ERROR", gone)
    bookmark = decode_event(line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "42"}}), PODS)
    assert not isinstance(bookmark, str) and bookmark[0] == "BOOKMARK"
    assert _resource_version(bookmark[1]) == "42"
    assert _resource_version(Pod()) is None
    assert _resource_version({"metadata": {"resourceVersion": "7"}}) == "7"
