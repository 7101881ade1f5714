"""Kubeconfig files pointing API clients (the official client, kubectl) at the simulated cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def kubeconfig_dict(
    server_url: str, *, token: str | None = None, context: str = "gpuhealth-sim"
) -> dict[str, Any]:
    """The kubeconfig document for `server_url` (plain http on loopback, so no TLS settings)."""
    user: dict[str, Any] = {"token": token} if token is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": user}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
        ],
        "current-context": context,
    }


def write_kubeconfig(
    path: str | os.PathLike[str], server_url: str, *, token: str | None = None, context: str = "gpuhealth-sim"
) -> None:
    """Write a kubeconfig for the simulated cluster; private (0600) since it may carry a token."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(kubeconfig_dict(server_url, token=token, context=context), sort_keys=False)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    # Rename last, so a client polling for the file never reads half of it.
    os.replace(tmp, target)
