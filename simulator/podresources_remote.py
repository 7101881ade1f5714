"""A simulated node's kubelet pod-resources answers over HTTP: the exporter's `sim:URL` reader.

`GET {base_url}/simulator/v1/nodes/{node}/pod-resources` answers the node's kubelet's
`AllocatableResourcesResponse` as protobuf bytes, and `.../pod-resources/list` its
`ListPodResourcesResponse`: the messages a real kubelet sends over its pod-resources socket.
This fetches them by the `v1.PodResourcesLister` method's name; the exporter decodes them and
counts failures as for every reader (`exporter.podresources_reads.FetchingReader`, which the
`gpuhealth` command wraps around this: `gpuhealth_cli.sources`).

Synchronous (stdlib urllib with a timeout): call it from a worker thread.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

from simulator.node_routes import node_route

LIST = "List"
"""The `v1.PodResourcesLister` method served at `.../pod-resources/list` (the other,
`GetAllocatableResources`, at `.../pod-resources`)."""


class RemotePodResources:
    """Fetches one simulated node's kubelet pod-resources answers over HTTP."""

    def __init__(self, base_url: str, node: str, *, timeout: float = 2.0) -> None:
        self.where = node_route(base_url, node, "pod-resources", timeout)
        """How log lines name this reader: its URL."""
        self._timeout = timeout

    def close(self) -> None:
        """Nothing held between reads."""

    def fetch(self, method: str) -> bytes:
        """The answer's message bytes; OSError saying why there is none."""
        url = f"{self.where}/list" if method == LIST else self.where
        request = urllib.request.Request(url, headers={"Accept": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raise OSError(f"GET {url}: HTTP {exc.code} {exc.reason}") from exc
        except urllib.error.URLError as exc:
            raise OSError(f"GET {url}: {exc.reason}") from exc
        except http.client.HTTPException as exc:
            raise OSError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
