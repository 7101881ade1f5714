"""etcd for the control plane: one member on loopback, plain HTTP, data in the work directory.

`--unsafe-no-fsync`: the data lives for one run on a throw-away directory; not waiting for the
disk makes every write (and the apiserver's start) several times faster on these machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simulator.controlplane import probes
from simulator.controlplane.process import Component


@dataclass(frozen=True)
class EtcdEndpoints:
    client_port: int
    peer_port: int

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


def argv(binary: Path, data_dir: Path, endpoints: EtcdEndpoints) -> list[str]:
    return [
        str(binary),
        "--name=controlplane",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={endpoints.client_url}",
        f"--advertise-client-urls={endpoints.client_url}",
        f"--listen-peer-urls={endpoints.peer_url}",
        f"--initial-advertise-peer-urls={endpoints.peer_url}",
        f"--initial-cluster=controlplane={endpoints.peer_url}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def start(binary: Path, workdir: Path, *, timeout: float) -> tuple[Component, EtcdEndpoints, float]:
    """Start etcd and wait for `/health`; the component, its endpoints and the seconds it took."""
    endpoints = EtcdEndpoints(probes.free_port(), probes.free_port())
    component = Component("etcd", argv(binary, workdir / "etcd-data", endpoints), workdir / "etcd.log")
    took = component.wait_ready(lambda: probes.ok(f"{endpoints.client_url}/health"), timeout=timeout)
    return component, endpoints, took
