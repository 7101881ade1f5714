"""What kube-controller-manager and kube-scheduler share: an identity, a secure port, no election.

Each acts as its own user (a client certificate in its kubeconfig) and uses the same
kubeconfig to delegate authentication and authorization of requests to its own secure port
(TokenReview, SubjectAccessReview), as kubeadm sets them up. The secure port is a free
loopback port with a serving certificate from our CA, so that several control planes run side
by side (the defaults, 10257 and 10259, would collide). Leader election is off: one replica,
and a restart need not wait for its old lease to expire.
"""

from __future__ import annotations

from pathlib import Path

from simulator.controlplane import probes
from simulator.controlplane.certificates import KeyPair
from simulator.controlplane.process import Component
from simulator.controlplane.versions import ComponentVersion


def flags(kubeconfig: Path, serving: KeyPair, port: int, version: ComponentVersion) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        "--leader-elect=false",
        *version.gate_flags(),
    ]


def start(
    name: str, argv: list[str], workdir: Path, *, port: int, ca: Path, health: str, timeout: float
) -> tuple[Component, float]:
    """Start `argv` and wait until its secure port answers 200 on `health`."""
    component = Component(name, argv, workdir / f"{name}.log")
    context = probes.tls_context(ca)
    took = component.wait_ready(
        lambda: probes.ok(f"https://127.0.0.1:{port}{health}", context), timeout=timeout
    )
    return component, took
