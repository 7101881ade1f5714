"""`PodResourcesSource` over the simulated cluster's HTTP endpoint (an exporter on a simulated node).

`GET {base_url}/simulator/v1/nodes/{node}/pod-resources` answers the node's kubelet's
`AllocatableResourcesResponse` as protobuf bytes, the message a real kubelet sends over its
pod-resources socket; `exporter.podresources` decodes both.

Failure policy, as for the simulated NVML (`exporter.nvml_remote`): an endpoint that cannot be
read is no verdict on any GPU. `allocatable()` returns None (logged when it starts failing and
when it recovers, and counted in `failures`), and the exporter keeps the evidence it had.

Synchronous (stdlib urllib with a timeout): call it from a worker thread.
"""

from __future__ import annotations

import http.client
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request

from exporter.podresources import Allocatable, PodResourcesError, decode_allocatable

log = logging.getLogger(__name__)


class RemotePodResources:
    """Reads one simulated node's kubelet pod-resources view over HTTP."""

    def __init__(self, base_url: str, node: str, *, timeout: float = 2.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not node:
            raise ValueError("node must be a node name")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        quoted = urllib.parse.quote(node, safe="")
        self._url = f"{base_url.rstrip('/')}/simulator/v1/nodes/{quoted}/pod-resources"
        self._node = node
        self._timeout = timeout
        self._lock = threading.Lock()
        self._failing = False
        self.failures = 0
        """Reads that gave no answer (the exporter's evidence stayed as it was)."""

    def allocatable(self) -> Allocatable | None:
        with self._lock:
            try:
                answer = decode_allocatable(self._fetch())
            except (OSError, http.client.HTTPException, PodResourcesError) as exc:
                self.failures += 1
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "pod-resources of node %s unreadable: %s; idle GPUs keep their evidence",
                        self._node,
                        exc,
                    )
                return None
            if self._failing:
                self._failing = False
                log.info("pod-resources of node %s answer again", self._node)
            return answer

    def close(self) -> None:
        """Nothing held between reads."""

    def _fetch(self) -> bytes:
        request = urllib.request.Request(self._url, headers={"Accept": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raise OSError(f"GET {self._url}: HTTP {exc.code} {exc.reason}") from exc
        except urllib.error.URLError as exc:
            raise OSError(f"GET {self._url}: {exc.reason}") from exc
