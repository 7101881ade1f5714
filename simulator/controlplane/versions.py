"""What each Kubernetes minor needs switched on for gpuhealth's DRA path (pure data).

1.37 serves DeviceTaintRule at `resource.k8s.io/v1`, on by default: nothing to add. 1.36
serves it only at `v1beta2`, behind the `DRADeviceTaintRules` feature gate (off by default)
and with the beta API version itself off by default (new beta APIs are), so both are turned
on. Gates given by the user are added on top and win; the components validate their names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

SUPPORTED = ("1.36", "1.37")
DEFAULT = "1.37"

_GATES: dict[str, dict[str, bool]] = {
    "1.36": {"DRADeviceTaintRules": True},
    "1.37": {},
}
_RUNTIME_CONFIG: dict[str, tuple[str, ...]] = {
    "1.36": ("resource.k8s.io/v1beta2=true",),
    "1.37": (),
}


@dataclass(frozen=True)
class ComponentVersion:
    """The Kubernetes minor the control plane runs, and the feature gates asked for."""

    kubernetes: str = DEFAULT
    feature_gates: Mapping[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kubernetes not in SUPPORTED:
            raise ValueError(
                f"unsupported Kubernetes version {self.kubernetes!r}: supported: {', '.join(SUPPORTED)}"
            )

    def gates(self) -> dict[str, bool]:
        """Every component's feature gates: the version's needs, then the user's."""
        return {**_GATES[self.kubernetes], **self.feature_gates}

    def gate_flags(self) -> list[str]:
        gates = self.gates()
        if not gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))]

    def runtime_config(self) -> tuple[str, ...]:
        return _RUNTIME_CONFIG[self.kubernetes]

    @property
    def taint_rule_version(self) -> str:
        """The resource.k8s.io version DeviceTaintRule is served at."""
        return "v1" if self.kubernetes == "1.37" else "v1beta2"
