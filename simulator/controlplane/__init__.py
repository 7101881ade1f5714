"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from upstream by `tools/upstream/build.py`, run as child processes.

What the simulated apiserver (`simulator.apiserver`) cannot prove is proven here: that a real
apiserver accepts our CRD and manifests, that real RBAC authorization grants exactly what the
shipped roles say, that the real scheduler's DRA allocator honours our DeviceTaintRule and that
the real eviction API answers the migrator as it expects.

One concept per module: `binaries` (where the pinned builds are), `certificates` (a CA and the
certificates and keys signed by it), `kubeconfig` (client identities as files), `process` (a
child process with a log, a readiness wait and a stop), one module per component (`etcd`,
`apiserver`, `controller_manager`, `scheduler`), and `cluster` (the whole, in order, as one
context manager). Nothing here imports the fleet: node agents talk to it over HTTP like to any
apiserver.
"""

from simulator.controlplane.cluster import ControlPlane, ControlPlaneSettings
from simulator.controlplane.process import ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError", "ControlPlaneSettings"]
