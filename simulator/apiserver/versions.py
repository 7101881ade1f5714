"""Which Kubernetes version the simulated apiserver is, and what that changes in what it serves.

The simulated cluster speaks as Kubernetes 1.37 (the default) or 1.36. The difference gpuhealth
depends on is DeviceTaintRule: 1.37 serves it at `resource.k8s.io/v1` (stored there) and
`v1beta2`; 1.36 serves it only at `v1beta2`, and only when the `DRADeviceTaintRules` feature gate
is on (off by default, as on a real 1.36). `/version` and discovery follow from the same
choice, so a client that discovers the served versions at start sees what is really there.

Pure data: the store builds its registry from `builtin_resources()`. A resource a version does not
serve stays in the registry unserved (`ResourceInfo.served`): the simulator's own components may
read its (empty) table, while HTTP clients get 404 and discovery leaves it out, as on a real
server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from simulator.apiserver.resources import ResourceInfo, builtin_resources

SUPPORTED = ("1.36", "1.37")
DEFAULT = "1.37"
DEVICE_TAINT_RULES = "DRADeviceTaintRules"

_GATE_DEFAULTS: dict[str, dict[str, bool]] = {
    "1.36": {DEVICE_TAINT_RULES: False},
    "1.37": {DEVICE_TAINT_RULES: True},
}
_BUILD_DATES = {"1.36": "2026-04-22T00:00:00Z", "1.37": "2026-08-19T00:00:00Z"}


@dataclass(frozen=True)
class KubernetesVersion:
    """The simulated version and its feature gates (unset gates take that version's defaults)."""

    version: str = DEFAULT
    """"1.36" or "1.37"."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Gates set explicitly, e.g. {"DRADeviceTaintRules": True} on 1.36."""

    def __post_init__(self) -> None:
        if self.version not in SUPPORTED:
            raise ValueError(
                f"unsupported Kubernetes version {self.version!r}: "
                f"supported versions are {', '.join(SUPPORTED)}"
            )
        unknown = sorted(set(self.feature_gates) - set(_GATE_DEFAULTS[self.version]))
        if unknown:
            raise ValueError(f"unrecognized feature gate: {', '.join(unknown)}")

    @property
    def minor(self) -> str:
        return self.version.split(".")[1]

    def enabled(self, gate: str) -> bool:
        return bool(self.feature_gates.get(gate, _GATE_DEFAULTS[self.version][gate]))

    def info(self) -> dict[str, str]:
        """The body of `/version`."""
        return {
            "major": "1",
            "minor": self.minor,
            "emulationMajor": "1",
            "emulationMinor": self.minor,
            "minCompatibilityMajor": "1",
            "minCompatibilityMinor": str(int(self.minor) - 1),
            "gitVersion": f"v{self.version}.0",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": _BUILD_DATES[self.version],
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def adjust(self, info: ResourceInfo) -> ResourceInfo:
        """The built-in resource as this version serves it (possibly unserved)."""
        if info.key != "devicetaintrules.resource.k8s.io":
            return info
        if self.version == "1.36":
            info = dataclasses.replace(info, version="v1beta2", served_versions=("v1beta2",))
        if not self.enabled(DEVICE_TAINT_RULES):
            info = dataclasses.replace(info, served=False)
        return info

    def builtin_resources(self) -> list[ResourceInfo]:
        return [self.adjust(info) for info in builtin_resources()]


def parse_feature_gates(text: str) -> dict[str, bool]:
    """`Gate=true,Other=false` (the apiserver's --feature-gates syntax); ValueError names the bad part."""
    gates: dict[str, bool] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"invalid feature gate {part!r}: expected NAME=true or NAME=false")
        gates[name.strip()] = value.lower() == "true"
    return gates


__all__ = ["DEFAULT", "DEVICE_TAINT_RULES", "SUPPORTED", "KubernetesVersion", "parse_feature_gates"]
