"""Parsing pods into device observations.

Aspects covered: device-plugin entries and replicas, DRA entries with and without a
request and the claim-name resolution through status and spec, init containers ignored,
health values outside the API's three, malformed pieces dropped and counted, the
1024-character message limit, pod signatures, resourceVersion ordering, and (property
based) that arbitrary junk never raises while valid generated pods round-trip.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import parse
from exporter.parse import parse_pod, pod_signature
from gpuhealth.kube.meta import is_newer
from tests.exporter.fixtures.builders import container, pod, resource

UUID = "GPU-1b2c3d4e-0000-0000-0000-000000000001"


def test_device_plugin_entry_names_the_physical_device() -> None:
    obs = parse_pod(pod("p", container("main", ("nvidia.com/gpu", [resource(UUID, "Unhealthy")]))))
    assert obs is not None
    (entry,) = obs.entries
    assert (entry.container, entry.resource, entry.device, entry.health) == (
        "main",
        "nvidia.com/gpu",
        UUID,
        "Unhealthy",
    )
    assert not entry.is_dra
    assert obs.node == "node-1" and obs.namespace == "team-a" and obs.resource_version == "1"


def test_replica_ids_map_to_their_physical_device() -> None:
    obs = parse_pod(
        pod("p", container("main", ("nvidia.com/gpu", [resource(f"{UUID}::3"), resource(f"{UUID}::4")])))
    )
    assert obs is not None
    assert [(e.device, e.replica, e.position) for e in obs.entries] == [(UUID, "3", 0), (UUID, "4", 1)]


def test_dra_entry_with_request_resolves_its_claim_through_status() -> None:
    p = pod(
        "p",
        container(
            "main", ("claim:gpus/big", [resource("k8s.gpu.nvidia.com/claim=u-1-gpu-0", "Unknown", "stale")])
        ),
        claim_statuses={"gpus": "p-gpus-x7k2q"},
    )
    obs = parse_pod(p)
    assert obs is not None
    (entry,) = obs.entries
    assert (entry.pod_claim, entry.request, entry.claim) == ("gpus", "big", "p-gpus-x7k2q")
    assert (entry.health, entry.message, entry.device) == ("Unknown", "stale", "")
    assert entry.is_dra


def test_dra_entry_without_request_and_claim_named_in_spec() -> None:
    p = pod(
        "p",
        container("main", ("claim:shared", [resource("gpu.nvidia.com/node-1/gpu-2")])),
        spec_claims={"shared": "prealloc"},
    )
    obs = parse_pod(p)
    assert obs is not None
    (entry,) = obs.entries
    assert (entry.pod_claim, entry.request, entry.claim) == ("shared", "", "prealloc")


def test_dra_entry_whose_claim_is_not_named_yet_keeps_an_empty_claim() -> None:
    obs = parse_pod(pod("p", container("main", ("claim:gpus", [resource("x/y/z")]))))
    assert obs is not None
    assert obs.entries[0].claim == "" and obs.entries[0].pod_claim == "gpus"


def test_init_and_ephemeral_container_statuses_are_ignored() -> None:
    p = pod(
        "p",
        container("main", ("nvidia.com/gpu", [resource(UUID)])),
        init_containers=[container("init", ("nvidia.com/gpu", [resource("GPU-init")]))],
    )
    p["status"]["ephemeralContainerStatuses"] = [
        container("debug", ("nvidia.com/gpu", [resource("GPU-eph")]))
    ]
    obs = parse_pod(p)
    assert obs is not None
    assert [e.device for e in obs.entries] == [UUID]


def test_health_outside_the_three_values_reads_as_unknown_and_is_counted() -> None:
    p = pod(
        "p",
        container(
            "main",
            (
                "nvidia.com/gpu",
                [resource("GPU-a", "Degraded"), {"resourceID": "GPU-b"}, resource("GPU-c", "healthy")],
            ),
        ),
    )
    obs = parse_pod(p)
    assert obs is not None
    assert [e.health for e in obs.entries] == ["Unknown", "Unknown", "Unknown"]
    assert obs.errors == (parse.INVALID_HEALTH,) * 3


def test_malformed_entries_are_dropped_and_counted_while_good_ones_stay() -> None:
    p = pod(
        "p",
        container(
            "main",
            (
                "nvidia.com/gpu",
                ["junk", {"health": "Healthy"}, {"resourceID": ""}, resource(UUID), {"resourceID": 7}],
            ),
        ),
    )
    p["status"]["containerStatuses"].append("not-a-status")
    p["status"]["containerStatuses"].append(
        {"name": "c2", "allocatedResourcesStatus": [{"name": 3, "resources": 1}]}
    )
    obs = parse_pod(p)
    assert obs is not None
    assert [e.device for e in obs.entries] == [UUID]
    assert sorted(obs.errors) == sorted(
        [
            parse.MALFORMED_ENTRY,
            parse.MISSING_RESOURCE_ID,
            parse.MISSING_RESOURCE_ID,
            parse.MISSING_RESOURCE_ID,
            parse.MALFORMED_CONTAINER_STATUS,
            parse.MALFORMED_ENTRY,
        ]
    )


def test_a_1024_character_message_is_kept_whole_and_a_longer_one_cut() -> None:
    exact, longer = "x" * 1024, "y" * 1500
    p = pod(
        "p",
        container(
            "main",
            ("claim:g", [resource("a/b/c", "Unhealthy", exact), resource("a/b/d", "Unhealthy", longer)]),
        ),
    )
    obs = parse_pod(p)
    assert obs is not None
    assert obs.entries[0].message == exact
    assert obs.entries[1].message == "y" * 1024
    assert obs.errors == (parse.MESSAGE_TOO_LONG,)


def test_terminal_pods_are_marked() -> None:
    for phase, terminal in [("Running", False), ("Pending", False), ("Succeeded", True), ("Failed", True)]:
        obs = parse_pod(pod("p", container("main"), phase=phase))
        assert obs is not None and obs.terminal is terminal


def test_objects_without_identity_are_not_pods() -> None:
    assert parse_pod(None) is None
    assert parse_pod({"metadata": "x"}) is None
    assert parse_pod({"metadata": {"name": "p"}}) is None


def test_signature_ignores_unrelated_status_fields() -> None:
    a = pod("p", container("main", ("nvidia.com/gpu", [resource(UUID)])), rv=1)
    b = pod("p", container("main", ("nvidia.com/gpu", [resource(UUID)])), rv=2)
    b["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    b["status"]["containerStatuses"][0]["restartCount"] = 4
    c = pod("p", container("main", ("nvidia.com/gpu", [resource(UUID, "Unhealthy")])), rv=3)
    assert pod_signature(a) == pod_signature(b)
    assert pod_signature(a) != pod_signature(c)
    assert pod_signature({"status": {"containerStatuses": 5}}) is None


def test_resource_versions_compare_as_integers_where_numeric() -> None:
    assert is_newer("10", "9")
    assert not is_newer("9", "10")
    assert not is_newer("10", "10")
    assert is_newer("abc", "abd")  # opaque: only "different" can be told


# ----- properties -------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "containerStatuses",
        "allocatedResourcesStatus",
        "resources",
        "name",
        "resourceID",
        "health",
        "message",
        "nodeName",
        "uid",
        "namespace",
        "resourceClaimStatuses",
        "resourceClaimName",
        "phase",
    ]
)
_shaped = st.recursive(
    st.none() | st.integers() | st.text(max_size=6) | st.sampled_from(["Healthy", "claim:x/y", "GPU-1::2"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json, _shaped))
def test_arbitrary_junk_never_raises(obj: Any) -> None:
    parse_pod(obj)
    pod_signature(obj) if isinstance(obj, dict) else None
    if isinstance(obj, dict):
        obj.setdefault("metadata", {"name": "p", "namespace": "n"})
        parse_pod(obj)


_health = st.sampled_from(["Healthy", "Unhealthy", "Unknown"])
_message = st.text(max_size=1024)
_name = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _name,
            st.lists(st.tuples(st.booleans(), st.integers(0, 8), _health, _message), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=3,
        unique_by=lambda c: c[0],
    )
)
def test_valid_generated_pods_round_trip(
    containers: list[tuple[str, list[tuple[bool, int, str, str]]]],
) -> None:
    built = []
    expected = []
    for name, items in containers:
        dp = [(f"GPU-{n}::{n}" if replica else f"GPU-{n}", h, m) for replica, n, h, m in items]
        built.append(container(name, ("nvidia.com/gpu", [resource(i, h, m) for i, h, m in dp])))
        expected.extend((name, i.partition("::")[0], h, m) for i, h, m in dp)
    obs = parse_pod(pod("p", *built))
    assert obs is not None
    assert obs.errors == ()
    assert [(e.container, e.device, e.health, e.message) for e in obs.entries] == expected
