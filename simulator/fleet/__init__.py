"""The simulated fleet: nodes with kubelets, GPUs, device plugins and DRA drivers.

Layering: `placement` and `health` are pure (plain data in, decisions out), `objects` builds
Kubernetes object shapes, `kubelet` is the runtime that applies the timeline and writes into
the in-process store.
"""

from simulator.fleet.kubelet import DeviceHealthChanged, FaultApplied, Fleet, FleetEvent, NodeChanged

__all__ = ["DeviceHealthChanged", "FaultApplied", "Fleet", "FleetEvent", "NodeChanged"]
