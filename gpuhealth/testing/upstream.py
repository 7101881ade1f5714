"""Where the pinned upstream servers are: Prometheus, Alertmanager, etcd and Kubernetes.

`tools/upstream/build.py` builds them from their Go modules into a cache outside the work
tree (`make demo` builds Prometheus and Alertmanager, `make test` everything). This module
finds a built binary through that script, so the pins live in one place; an explicit path
in `GPUHEALTH_<NAME>` (for example `GPUHEALTH_PROMETHEUS`, `GPUHEALTH_KUBE_APISERVER`)
takes precedence, for a machine that has its own builds. Nothing here builds: a missing
binary is an error that says which command builds it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPOSITORY / "tools" / "upstream" / "build.py"


class UpstreamMissing(RuntimeError):
    """A pinned upstream binary is not built (or not where its override says)."""


@cache
def _build_script() -> ModuleType:
    if not BUILD_SCRIPT.exists():
        raise UpstreamMissing(f"{BUILD_SCRIPT} is missing: upstream binaries are found through a checkout")
    spec = importlib.util.spec_from_file_location("gpuhealth_upstream_build", BUILD_SCRIPT)
    if spec is None or spec.loader is None:
        raise UpstreamMissing(f"cannot load {BUILD_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _override(binary: str) -> str:
    return "GPUHEALTH_" + binary.upper().replace("-", "_")


def version_of(binary: str, kubernetes: str | None = None) -> str:
    """The pinned release a binary is built from ("3.16.0", "v1.37.2")."""
    version: str = _build_script().component_of(binary, kubernetes).version
    return version


def binary(binary: str, kubernetes: str | None = None) -> str:
    """The path of a built upstream binary; `kubernetes` picks the minor ("1.36") for Kubernetes ones."""
    explicit = os.environ.get(_override(binary))
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise UpstreamMissing(f"{_override(binary)}={explicit} is not an executable file")
        return explicit
    script = _build_script()
    try:
        component = script.component_of(binary, kubernetes)
    except KeyError as err:
        raise UpstreamMissing(str(err.args[0])) from None
    path: Path = script.install_dir(component) / binary
    if not script.built(component):
        build = f"python3 tools/upstream/build.py {component.name}"
        raise UpstreamMissing(
            f"`{binary}` {component.version} is not built: run `{build}` (or `make tools`;"
            f" first run about {component.minutes} min on 2 cores, then cached in {path.parent})"
        )
    return str(path)
