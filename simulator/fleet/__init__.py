"""The simulated fleet: one class per real component, wired by `Fleet` around shared state.

Layering inside the package:
- pure, no store and no clock: `health` (device state, the kubelet's health rules),
  `placement` (the scheduler's device filters), `objects` (Kubernetes object shapes),
  `state` (the shared node and pod records), `events`; `node_api` (the node agents' one way to
  the API server, and its in-process adapter);
- runtime plumbing: `timers` (simulated time, one timer loop), `writes` (shared API writes),
  `node_api_http` (the node agents' HTTP adapter, over `KubeClient`), `api_workloads` (a
  scenario's workloads as API objects for a control plane the fleet does not own);
- components, one per real one, importing only the modules above: `kubelet`, `device_plugin`,
  `dra_driver`, `scheduler`, `job_controller`, `node_lifecycle`, `timeline`;
- wiring: `fleet` (`Fleet`), the only module that imports the components.
"""

from simulator.fleet.events import DeviceHealthChanged, FaultApplied, FleetEvent, GpuReset, NodeChanged
from simulator.fleet.fleet import Fleet

__all__ = ["DeviceHealthChanged", "FaultApplied", "Fleet", "FleetEvent", "GpuReset", "NodeChanged"]
