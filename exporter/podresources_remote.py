"""`PodResourcesSource` over the simulated cluster's HTTP endpoint (an exporter on a simulated node).

`GET {base_url}/simulator/v1/nodes/{node}/pod-resources` answers the node's kubelet's
`AllocatableResourcesResponse` as protobuf bytes, and `.../pod-resources/list` its
`ListPodResourcesResponse`: the messages a real kubelet sends over its pod-resources socket
(`exporter.podresources_kubelet`); `exporter.podresources` decodes both.
Failures are counted and logged as for every reader (`exporter.podresources_reads`).

Synchronous (stdlib urllib with a timeout): call it from a worker thread.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request

from exporter.podresources_reads import LIST, CountingReader


class RemotePodResources(CountingReader):
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
        self._timeout = timeout
        super().__init__(node, self._url)

    def close(self) -> None:
        """Nothing held between reads."""

    def _fetch(self, method: str) -> bytes:
        url = f"{self._url}/list" if method == LIST else self._url
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
