"""`PodResourcesSource` over the kubelet's pod-resources gRPC socket (an exporter on a real node).

The kubelet serves `v1.PodResourcesLister` on `/var/lib/kubelet/pod-resources/kubelet.sock`
(package `v1` of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`). This reader calls
`GetAllocatableResources` and `List`, each with its empty request, and decodes the answers with
`exporter.podresources`: the call is made through `grpc`'s generic `unary_unary` with bytes in
and bytes out, so no generated stubs and no protobuf runtime are needed. The only module that
imports `grpc`.

Every call has a deadline (`timeout`): a kubelet that hangs costs one poll, never the reader
thread. Failures are counted and logged as for every reader (`exporter.podresources_reads`),
each with the reason an operator can act on: no socket at the path (kubelet down, or the host
directory not mounted), a connection refused or denied (the socket is root-owned: the exporter
runs as UID 0), a kubelet that does not serve the method (`GetAllocatableResources` is GA since
Kubernetes 1.28, beta and on by default from 1.23 behind `KubeletPodResourcesGetAllocatable`;
`List` is served by every kubelet since 1.20).

Synchronous: call it from a worker thread (the observer's NVML poll).
"""

from __future__ import annotations

import os
from typing import Any

import grpc

from exporter.podresources_reads import ALLOCATABLE, LIST, CountingReader

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves its pod-resources API (`--pod-resources unix://` + this path)."""

SERVICE = "/v1.PodResourcesLister/"
"""The gRPC path of the service (proto package `v1`); a method's path is this and its name."""

_CHANNEL_OPTIONS = [
    # A kubelet restart replaces the socket; the channel reconnects within seconds instead of
    # gRPC's default backoff of up to two minutes, so the next polls read the new kubelet.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    # An answer lists every allocatable (or assigned) device and CPU of one node: kilobytes. A cap far above
    # it, and far below what a misbehaving peer could make the exporter buffer.
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
]


def _empty_request(_: bytes) -> bytes:
    """Both requests (`AllocatableResourcesRequest`, `ListPodResourcesRequest`) have no fields:
    their encoding is no bytes at all."""
    return b""


def _raw(message: bytes) -> bytes:
    """Decoded outside gRPC, so a malformed answer is refused with our reason, not gRPC's."""
    return message


_NEEDS = {
    ALLOCATABLE: "it needs Kubernetes 1.23 or later (GA in 1.28), or the "
    "KubeletPodResourcesGetAllocatable feature gate on",
    LIST: "it needs Kubernetes 1.20 or later",
}


def _explain(exc: Any, socket_path: str, method: str) -> str:
    """A failed call's status in words an operator can act on."""
    code, details = exc.code(), exc.details() or ""
    path = SERVICE + method
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return (
            f"the kubelet at {socket_path} does not serve {path} ({details or 'UNIMPLEMENTED'}): "
            f"{_NEEDS[method]}"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the kubelet at {socket_path} did not answer {path} in time"
    if code == grpc.StatusCode.UNAVAILABLE and "ermission denied" in details:
        return (
            f"connecting to {socket_path} was denied ({details}): the socket is root-owned, "
            "the exporter must run as UID 0"
        )
    name = getattr(code, "name", str(code))
    return f"{path} on {socket_path} failed: {name}: {details}"


class KubeletPodResources(CountingReader):
    """Reads the node's kubelet's allocatable and assigned devices over its pod-resources socket."""

    def __init__(self, socket_path: str, node: str, *, timeout: float = 2.0) -> None:
        if not os.path.isabs(socket_path):
            raise ValueError(f"socket_path must be an absolute path, got {socket_path!r}")
        if not node:
            raise ValueError("node must be a node name")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        super().__init__(node, f"unix://{socket_path}")
        self._path = socket_path
        self._timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket_path}", options=_CHANNEL_OPTIONS)
        self._calls = {
            method: self._channel.unary_unary(
                SERVICE + method, request_serializer=_empty_request, response_deserializer=_raw
            )
            for method in (ALLOCATABLE, LIST)
        }

    def close(self) -> None:
        self._channel.close()

    def _fetch(self, method: str) -> bytes:
        if not os.path.exists(self._path):
            raise OSError(
                f"no socket at {self._path}: the kubelet is not running, or the host's "
                f"{os.path.dirname(self._path)} is not mounted into the exporter"
            )
        try:
            answer: bytes = self._calls[method](b"", timeout=self._timeout)
        except grpc.RpcError as exc:
            raise OSError(_explain(exc, self._path, method)) from None
        return answer
