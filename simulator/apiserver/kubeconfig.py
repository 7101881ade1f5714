"""Kubeconfig files pointing API clients (the official client, kubectl) at a cluster of ours.

The simulated cluster serves plain http on loopback (a bearer token at most); the real control
plane (`simulator.controlplane`) serves TLS, so its kubeconfigs name the CA that signed the
serving certificate and, for an identity that authenticates by client certificate, its
certificate and key (`ClientTLS`, all file paths).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class ClientTLS:
    """TLS settings of a kubeconfig: the CA to trust and, optionally, a client certificate."""

    certificate_authority: Path
    client_certificate: Path | None = None
    client_key: Path | None = None


def kubeconfig_dict(
    server_url: str,
    *,
    token: str | None = None,
    context: str = "gpuhealth-sim",
    tls: ClientTLS | None = None,
) -> dict[str, Any]:
    """The kubeconfig document for `server_url` (plain http on loopback unless `tls` is given)."""
    user: dict[str, Any] = {"token": token} if token is not None else {}
    cluster: dict[str, Any] = {"server": server_url}
    if tls is not None:
        cluster["certificate-authority"] = str(tls.certificate_authority)
        if tls.client_certificate is not None and tls.client_key is not None:
            user["client-certificate"] = str(tls.client_certificate)
            user["client-key"] = str(tls.client_key)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": user}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
        ],
        "current-context": context,
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    server_url: str,
    *,
    token: str | None = None,
    context: str = "gpuhealth-sim",
    tls: ClientTLS | None = None,
) -> None:
    """Write a kubeconfig; private (0600) since it may carry a token or name a key."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = kubeconfig_dict(server_url, token=token, context=context, tls=tls)
    text = yaml.safe_dump(document, sort_keys=False)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    # Rename last, so a client polling for the file never reads half of it.
    os.replace(tmp, target)
