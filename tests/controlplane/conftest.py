"""The real control plane, started once per test session and version (one per xdist worker).

Every test here carries `integration` and `controlplane` (tests/conftest.py; `_marked` checks
it here, since a session fixture is set up before the function-level guard). Without the
pinned builds the tier is skipped, naming the command that builds them (`make test` builds
them first).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulator.controlplane import ControlPlane, ControlPlaneError, ControlPlaneSettings
from simulator.controlplane.binaries import KUBERNETES_BINARIES, binary
from tests.support.controlplane import install


@pytest.fixture(autouse=True)
def _marked(request: pytest.FixtureRequest) -> None:
    """Every test of this tier carries both marks, so `-m "not integration"` never starts it."""
    missing = [m for m in ("integration", "controlplane") if request.node.get_closest_marker(m) is None]
    if missing:
        pytest.fail(
            f"{request.node.nodeid} uses the real control plane: mark it "
            + " and ".join(f"@pytest.mark.{m}" for m in missing)
            + " (see tests/conftest.py)",
            pytrace=False,
        )


def require_builds(kubernetes: str) -> None:
    """Skip unless etcd and the Kubernetes binaries of `kubernetes` are built."""
    try:
        binary("etcd")
        for name in KUBERNETES_BINARIES:
            binary(name, kubernetes)
    except ControlPlaneError as exc:
        pytest.skip(str(exc))


def _plane(tmp_path_factory: pytest.TempPathFactory, kubernetes: str) -> Iterator[ControlPlane]:
    require_builds(kubernetes)
    workdir = tmp_path_factory.mktemp(f"controlplane-{kubernetes}")
    with ControlPlane(ControlPlaneSettings(kubernetes=kubernetes, workdir=workdir)) as plane:
        yield plane


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Kubernetes 1.37: DeviceTaintRule at resource.k8s.io/v1."""
    yield from _plane(tmp_path_factory, "1.37")


@pytest.fixture(scope="session")
def plane_136(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Kubernetes 1.36: DeviceTaintRule at v1beta2, behind DRADeviceTaintRules."""
    yield from _plane(tmp_path_factory, "1.36")


@pytest.fixture(scope="session")
def installed(plane: ControlPlane) -> ControlPlane:
    """1.37 with the CRDs and the enforcing overlay applied (namespace, accounts, RBAC)."""
    install(plane)
    return plane


@pytest.fixture(scope="session")
def installed_136(plane_136: ControlPlane) -> ControlPlane:
    install(plane_136)
    return plane_136
