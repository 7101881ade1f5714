"""Fixtures shared by every test, and the marker policy.

Aspects covered here: no test may leave asyncio tasks running behind it; a test that starts
a real server carries the `integration` marker; no property test depends on the machine's
speed (the Hypothesis profile below). The harness's exporter sources (`sim:URL`) are offered here
as the `gpuhealth` command offers them (`gpuhealth_cli.sources`).

Markers (declared in pyproject.toml):
- `integration`: the test starts a real server: Prometheus or Alertmanager, a child process
  serving HTTP (`gpuhealth exporter`), or the simulated cluster. `pytest -m "not integration"`
  (`make unit`) is the fast loop and must stay under a minute; in-process aiohttp test
  servers, promtool/amtool and short-lived `gpuhealth` commands are fine there.
- `slow`: the test takes more than a few seconds, whatever it starts.
- `controlplane`: the test starts the real control plane (`simulator.controlplane`: etcd and
  the Kubernetes servers built from upstream); it is an integration test too, so it carries
  both. `pytest -m controlplane` runs that tier alone (`tests/controlplane/`).
The guards below hold these rules for Prometheus, Alertmanager, the simulated cluster and the
real control plane: an unmarked test that starts one fails with a hint, instead of slowing the
fast loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings

from gpuhealth_cli import sources as harness_sources

# Property tests judge what the code computes, never how fast the machine is: Hypothesis' own
# wall-clock checks (a 200 ms deadline per example, "input generation is slow") fail a correct
# test when the shared machine stalls a worker for a second. Tests may still set other limits.
settings.register_profile("gpuhealth", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpuhealth")

# The tests launch exporters with the harness's sources, in-process too (settings built directly),
# as the `gpuhealth` command does where the harness imports.
harness_sources.register()


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves tasks behind (they would leak into the next test)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        yield
        return
    before = asyncio.all_tasks(loop)
    yield
    # Give cancelled tasks a chance to finish before judging.
    for _ in range(3):
        await asyncio.sleep(0)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks(loop) - before if t is not current and not t.done()]
    if left:
        for task in left:
            task.cancel()
        pytest.fail(f"test left {len(left)} asyncio task(s) running: {[t.get_coro() for t in left]}")


SERVER_STARTERS = (
    "gpuhealth.testing.loopback._server",
    "simulator.testing.ClusterHandle.start",
)
"""Every way a test starts Prometheus, Alertmanager or the simulated cluster."""
CONTROL_PLANE_STARTERS = ("simulator.controlplane.cluster.ControlPlane.start",)
"""Every way a test starts the real control plane."""


def _refuse(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, targets: tuple[str, ...], marks: str
) -> None:
    for target in targets:

        def refuse(*args: Any, _target: str = target, **kwargs: Any) -> NoReturn:
            pytest.fail(
                f"{request.node.nodeid} starts a real server ({_target}): mark it {marks} "
                "(see tests/conftest.py)",
                pytrace=False,
            )

        monkeypatch.setattr(target, refuse)


@pytest.fixture(autouse=True)
def _servers_only_in_integration(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make an unmarked test that starts a real server fail, naming the marker it lacks.

    Fixtures of a wider scope (a module's cluster) are set up before this one and are not
    guarded: the real control plane's fixtures (tests/controlplane/conftest.py) check the marks
    of the module they serve themselves."""
    integration = request.node.get_closest_marker("integration") is not None
    controlplane = request.node.get_closest_marker("controlplane") is not None
    if not integration:
        _refuse(request, monkeypatch, SERVER_STARTERS, "@pytest.mark.integration")
    if not (integration and controlplane):
        _refuse(
            request,
            monkeypatch,
            CONTROL_PLANE_STARTERS,
            "@pytest.mark.integration and @pytest.mark.controlplane",
        )
