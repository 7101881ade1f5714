"""The URL of a simulated node's own route on the simulated cluster, its arguments checked.

The exporter's `sim:URL` readers (`simulator.nvml_remote`, `simulator.podresources_remote`) read
`{base_url}/simulator/v1/nodes/{node}/...` (`simulator.runner`) with a timeout.
"""

from __future__ import annotations

import urllib.parse


def node_route(base_url: str, node: str, route: str, timeout: float) -> str:
    """`{base_url}/simulator/v1/nodes/{node}/{route}`; ValueError for a base URL that is not
    http(s), an empty node name or a timeout that is not positive."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    if not node:
        raise ValueError("node must be a node name")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    return f"{base_url.rstrip('/')}/simulator/v1/nodes/{urllib.parse.quote(node, safe='')}/{route}"
