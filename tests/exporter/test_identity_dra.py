"""DRA identity resolution: claims, slices and how an entry finds its device.

Aspects covered: claim and slice parsing (v1 and the v1beta1 `basic` shape, plain or
domain-qualified `uuid` attribute, taints), malformed objects reported by reason, the
matching of resourceIDs to allocation results (driver/pool/device with a pool name that
contains '/', CDI names by claim uid or suffix, position as the last resort, requests
and sub-requests), and which slice changes the index reports.
"""

from __future__ import annotations

from typing import Any

from exporter import parse
from exporter.identity import (
    ClaimInfo,
    ClaimResult,
    IdentityIndex,
    match_result,
    parse_claim,
    parse_slice,
    split_ref,
)
from exporter.parse import ResourceEntry
from exporter.snapshot import DriverTaint
from tests.exporter.fixtures.builders import DRIVER, claim, slice_


def entry(resource_id: str, request: str = "", position: int = 0, claim_name: str = "c") -> ResourceEntry:
    name = f"claim:pc/{request}" if request else "claim:pc"
    return ResourceEntry(
        "main", name, resource_id, "Healthy", "", position, pod_claim="pc", request=request, claim=claim_name
    )


def claim_info(*results: tuple[str, str, str, str], uid: str = "uid-1") -> ClaimInfo:
    return ClaimInfo("ns", "c", uid, tuple(ClaimResult(*r) for r in results))


def test_claims_parse_with_results_in_order_and_malformed_ones_are_reported() -> None:
    parsed = parse_claim(
        claim("c", [("a", DRIVER, "p", "gpu-1"), ("b", DRIVER, "p", "gpu-0")], namespace="ns")
    )
    assert isinstance(parsed, ClaimInfo)
    assert [r.device for r in parsed.results] == ["gpu-1", "gpu-0"]
    unallocated: dict[str, Any] = {"metadata": {"name": "c", "namespace": "ns"}, "status": {}}
    assert parse_claim(unallocated) == ClaimInfo("ns", "c", "", ())
    assert parse_claim({"metadata": {"name": "c"}}) == parse.MALFORMED_CLAIM
    bad = claim("c", [("a", DRIVER, "p", "gpu-1")])
    del bad["status"]["allocation"]["devices"]["results"][0]["pool"]
    assert parse_claim(bad) == parse.MALFORMED_CLAIM


def test_slices_parse_v1_and_v1beta1_with_uuid_and_taints() -> None:
    taint = {
        "gpu-1": [{"key": "gpu.nvidia.com/gpu-lost", "value": "true", "effect": "NoExecute"}, {"key": 3}]
    }
    parsed = parse_slice(slice_("s", "node-1", {"gpu-0": "GPU-a", "gpu-1": None}, taints=taint))
    assert not isinstance(parsed, str)
    name, devices = parsed
    assert name == "s"
    assert [(d.device, d.uuid, d.node, d.pool) for d in devices] == [
        ("gpu-0", "GPU-a", "node-1", "node-1"),
        ("gpu-1", "", "node-1", "node-1"),
    ]
    assert devices[1].taints == (DriverTaint("gpu.nvidia.com/gpu-lost", "NoExecute", "true"),)
    beta = slice_("s", "node-1", {})
    beta["spec"]["devices"] = [
        {"name": "gpu-0", "basic": {"attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-b"}}}}
    ]
    parsed_beta = parse_slice(beta)
    assert not isinstance(parsed_beta, str) and parsed_beta[1][0].uuid == "GPU-b"
    assert parse_slice({"metadata": {"name": "s"}, "spec": {"driver": DRIVER}}) == parse.MALFORMED_SLICE


def test_driver_pool_device_ids_name_the_result_even_with_slashes_in_the_pool() -> None:
    assert split_ref(f"{DRIVER}/rack-1/node-1/gpu-3") == (DRIVER, "rack-1/node-1", "gpu-3")
    assert split_ref("k8s.gpu.nvidia.com/claim=uid-gpu-0") is None
    info = claim_info(("r", DRIVER, "rack-1/node-1", "gpu-2"), ("r", DRIVER, "rack-1/node-1", "gpu-3"))
    assert match_result(info, entry(f"{DRIVER}/rack-1/node-1/gpu-3")) == info.results[1]
    assert match_result(info, entry(f"{DRIVER}/rack-1/node-1/gpu-9")) is None


def test_cdi_ids_match_by_claim_uid_then_by_suffix_then_by_position() -> None:
    info = claim_info(("r", DRIVER, "p", "gpu-1"), ("r", DRIVER, "p", "gpu-11"), uid="uid-1")
    assert match_result(info, entry("k8s.gpu.nvidia.com/claim=uid-1-gpu-1")) == info.results[0]
    assert match_result(info, entry("k8s.gpu.nvidia.com/claim=other-gpu-11")) == info.results[1]
    assert match_result(info, entry("opaque-id", position=1)) == info.results[1]
    assert match_result(info, entry("opaque-id", position=2)) is None


def test_requests_and_sub_requests_narrow_the_candidates() -> None:
    info = claim_info(("small", DRIVER, "p", "gpu-0"), ("big/a100", DRIVER, "p", "gpu-5"))
    assert match_result(info, entry("opaque", request="big")) == info.results[1]
    assert match_result(info, entry("opaque", request="small")) == info.results[0]


def test_index_resolves_uuid_and_reports_changed_slice_devices() -> None:
    index = IdentityIndex()
    parsed = parse_slice(slice_("s", "node-1", {"gpu-0": "GPU-a", "gpu-1": "GPU-b"}))
    assert not isinstance(parsed, str)
    assert index.put_slice(*parsed) == {(DRIVER, "node-1", "gpu-0"), (DRIVER, "node-1", "gpu-1")}
    assert index.put_slice(*parsed) == set()
    changed = parse_slice(
        slice_("s", "node-1", {"gpu-0": "GPU-a"}, taints={"gpu-0": [{"key": "k", "effect": "NoSchedule"}]})
    )
    assert not isinstance(changed, str)
    assert index.put_slice(*changed) == {(DRIVER, "node-1", "gpu-0"), (DRIVER, "node-1", "gpu-1")}
    info = parse_claim(claim("c", [("", DRIVER, "node-1", "gpu-0")], namespace="ns"))
    assert isinstance(info, ClaimInfo) and index.put_claim(info)
    resolved = index.resolve("ns", entry("x"))
    assert resolved is not None and (resolved.device, resolved.device_name) == ("GPU-a", "gpu-0")
    assert index.resolve("other-ns", entry("x")) is None
    assert index.drop_slice("s") == {(DRIVER, "node-1", "gpu-0")}
    resolved = index.resolve("ns", entry("x"))
    assert resolved is not None and resolved.device == f"{DRIVER}/node-1/gpu-0"
