"""Where the pinned upstream builds of the control plane's binaries are.

`tools/upstream/build.py` builds them once per machine into a cache outside the work tree and
knows where each lies; this asks it (loading the script from the repository) rather than
repeating its layout. A binary that is not built yet is an error that says how to build it.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from simulator.controlplane.process import ControlPlaneError

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "upstream" / "build.py"
KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


@cache
def _build_module() -> ModuleType:
    if not BUILD_SCRIPT.is_file():
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} is missing: the real control plane runs from a checkout of the repository"
        )
    spec = importlib.util.spec_from_file_location("gpuhealth_upstream_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def binary(name: str, kubernetes: str | None = None) -> Path:
    """The built `name` (for the Kubernetes binaries, of minor `kubernetes`, e.g. "1.37")."""
    build = _build_module()
    component = build.component_of(name, kubernetes)
    path = Path(build.binary_path(name, kubernetes))
    if not path.is_file():
        raise ControlPlaneError(
            f"{name} {component.version} is not built: run "
            f"`python3 tools/upstream/build.py {component.name}` "
            f"(about {component.minutes} min the first time; cached in {path.parent})"
        )
    return path
