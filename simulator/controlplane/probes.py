"""Readiness probes over loopback: plain HTTP (etcd) and HTTPS under our CA (the rest)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

from simulator.controlplane.certificates import KeyPair

PROBE_TIMEOUT_SECONDS = 2.0


def tls_context(ca: Path, client: KeyPair | None = None) -> ssl.SSLContext:
    """A client context trusting only `ca`, presenting `client`'s certificate when given."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """True when GET `url` answers 200; False on any other answer; OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS, context=context) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False  # it answers, not ready yet (e.g. 500 from /readyz while hooks run)
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from exc
