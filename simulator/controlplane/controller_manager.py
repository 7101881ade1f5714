"""kube-controller-manager for the control plane: the real controllers, each as its own account.

`--use-service-account-credentials`: every controller acts as its own service account
(`system:serviceaccount:kube-system:<controller>`), under the bootstrap RBAC roles, as on a
real cluster. The token controller signs with the service-account key; the root CA goes into
every namespace's `kube-root-ca.crt`. The controllers run are the default set (`*`), which on
1.37, and on 1.36 with `DRADeviceTaintRules`, includes the device-taint-eviction controller
that evicts pods from devices under a NoExecute DeviceTaintRule.
"""

from __future__ import annotations

from pathlib import Path

from gpuhealth.loopback_ports import free_port
from simulator.controlplane import delegated
from simulator.controlplane.certificates import KeyPair, ServiceAccountKeys
from simulator.controlplane.process import Component
from simulator.controlplane.versions import ComponentVersion


def argv(
    binary: Path,
    *,
    kubeconfig: Path,
    serving: KeyPair,
    port: int,
    ca: Path,
    service_account: ServiceAccountKeys,
    version: ComponentVersion,
) -> list[str]:
    return [
        str(binary),
        *delegated.flags(kubeconfig, serving, port, version),
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={service_account.private}",
        f"--root-ca-file={ca}",
        f"--client-ca-file={ca}",
    ]


def start(
    binary: Path,
    workdir: Path,
    *,
    kubeconfig: Path,
    serving: KeyPair,
    ca: Path,
    service_account: ServiceAccountKeys,
    version: ComponentVersion,
    timeout: float,
) -> tuple[Component, float]:
    port = free_port()
    args = argv(
        binary,
        kubeconfig=kubeconfig,
        serving=serving,
        port=port,
        ca=ca,
        service_account=service_account,
        version=version,
    )
    return delegated.start(
        "kube-controller-manager", args, workdir, port=port, ca=ca, health="/healthz", timeout=timeout
    )
