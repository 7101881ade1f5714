"""The device's series for a move's evidence, from Prometheus (an adapter; urllib, blocking).

One instant query per unrecoverable pod: every `gpu_device_*` and `gpu_nvml_*` series of the
device (its directory entry as the exporter exports it, and its NVML readings in node mode). Any
failure raises; the executor writes it into the evidence and the move goes on.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


class PrometheusReadings:
    def __init__(self, url: str, *, timeout_seconds: float = 5.0) -> None:
        self._url = url.rstrip("/")
        self._timeout = timeout_seconds

    @staticmethod
    def query(node: str, device: str) -> str:
        return f'{{__name__=~"gpu_device_.+|gpu_nvml_.+", node="{quote(node)}", device="{quote(device)}"}}'

    def series(self, node: str, device: str) -> list[dict[str, Any]]:
        query = self.query(node, device)
        address = f"{self._url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        with urllib.request.urlopen(address, timeout=self._timeout) as response:
            body = json.loads(response.read())
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ValueError(f"query {query}: {str(body)[:200]}")
        out = []
        for item in (body.get("data") or {}).get("result") or ():
            value = item.get("value") or [None, None]
            try:
                number = float(value[1])
            except (TypeError, ValueError, IndexError):
                continue
            out.append({"metric": item.get("metric") or {}, "value": number})
        return out


def quote(text: str) -> str:
    """A PromQL string literal's content: backslashes and double quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')
