"""Resource types and their REST paths (gpuhealth.kube.resources).

Aspects: core and named groups; collections across and within namespaces; objects and
subresources; scope checked (no namespace for cluster-scoped resources, one required for
namespaced objects); names are exactly one escaped path segment.
"""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.resources import LEASE, NODE, POD, RESOURCE_CLAIM, RESOURCE_SLICE, STATUS, Resource


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (POD.path(), "/api/v1/pods"),
        (POD.path("default"), "/api/v1/namespaces/default/pods"),
        (POD.path("default", "p"), "/api/v1/namespaces/default/pods/p"),
        (POD.path("default", "p", STATUS), "/api/v1/namespaces/default/pods/p/status"),
        (NODE.path(), "/api/v1/nodes"),
        (NODE.path(name="gpu-0", subresource=STATUS), "/api/v1/nodes/gpu-0/status"),
        (
            LEASE.path("kube-node-lease", "gpu-0"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-0",
        ),
        (RESOURCE_CLAIM.path(), "/apis/resource.k8s.io/v1/resourceclaims"),
        (RESOURCE_SLICE.path(name="s"), "/apis/resource.k8s.io/v1/resourceslices/s"),
    ],
)
def test_paths(path: str, expected: str) -> None:
    assert path == expected


def test_api_version() -> None:
    assert (POD.api_version, LEASE.api_version) == ("v1", "coordination.k8s.io/v1")


def test_scope_is_checked() -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        NODE.path("default")
    with pytest.raises(ValueError, match="needs its namespace"):
        POD.path(name="p")
    with pytest.raises(ValueError, match="subresource"):
        POD.path("default", subresource=STATUS)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/"])
def test_names_that_are_not_one_segment_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="one non-empty path segment"):
        POD.path("default", name)


@given(st.text(min_size=1).filter(lambda s: "/" not in s and s not in (".", "..")))
def test_a_name_is_one_escaped_segment(name: str) -> None:
    path = Resource("example.com", "v1", "widgets", namespaced=False).path(name=name)
    head, _, segment = path.rpartition("/")
    assert head == "/apis/example.com/v1/widgets"
    assert unquote(segment) == name
