"""etcd for the control plane: one member on loopback, plain HTTP, data in the work directory.

`--unsafe-no-fsync`: the data lives for one run on a throw-away directory; not waiting for the
disk makes every write (and the apiserver's start) several times faster on these machines.

`compact` compacts the keyspace at the current revision through etcd's JSON gateway (the
`/v3/kv/range` and `/v3/kv/compaction` routes of etcd 3.6's grpc-gateway, on the client URL):
every older revision is gone, and a read or watch from one is refused with "required revision
has been compacted" (what kube-apiserver turns into 410 Gone for its clients).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhealth.loopback_ports import free_port
from simulator.controlplane import probes
from simulator.controlplane.process import Component, ControlPlaneError

COMPACTED = "required revision has been compacted"
"""etcd's refusal of a revision older than its last compaction."""


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
    endpoints = EtcdEndpoints(free_port(), free_port())
    component = Component("etcd", argv(binary, workdir / "etcd-data", endpoints), workdir / "etcd.log")
    took = component.wait_ready(lambda: probes.ok(f"{endpoints.client_url}/health"), timeout=timeout)
    return component, endpoints, took


def _post(client_url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST `body` to etcd's gateway; its JSON answer, an error answer's JSON included."""
    request = urllib.request.Request(
        f"{client_url}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=probes.PROBE_TIMEOUT_SECONDS * 5) as answer:
            document: dict[str, Any] = json.load(answer)
    except urllib.error.HTTPError as exc:
        try:
            document = json.load(exc)
        except ValueError:
            raise ControlPlaneError(f"etcd {route}: HTTP {exc.code}") from exc
    except urllib.error.URLError as exc:
        raise ControlPlaneError(f"etcd {route}: {exc.reason}") from exc
    return document


def revision(client_url: str) -> int:
    """etcd's current revision (the header of a read of the empty key, which need not exist)."""
    answer = _post(client_url, "/v3/kv/range", {"key": "AA=="})  # base64 of a NUL byte
    try:
        return int(answer["header"]["revision"])  # int64 as a JSON string (proto3 JSON)
    except (KeyError, TypeError, ValueError):
        raise ControlPlaneError(f"etcd /v3/kv/range: no revision in {answer}") from None


def compact(client_url: str) -> int:
    """Compact at the current revision, physically (done once this returns); that revision.

    A revision already compacted (kube-apiserver compacts every 5 minutes, and nothing may have
    been written since) is the state asked for, not an error."""
    current = revision(client_url)
    answer = _post(client_url, "/v3/kv/compaction", {"revision": str(current), "physical": True})
    if "header" not in answer and COMPACTED not in str(answer.get("message", "")):
        raise ControlPlaneError(f"etcd /v3/kv/compaction at {current}: {answer}")
    return current
