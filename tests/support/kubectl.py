"""Running a kubectl binary against a simulated cluster, as tests drive it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def kubectl_runner(
    binary: Path, kubeconfig: Path, home: Path, *, timeout: float = 60.0, path: Path | None = None
) -> Kubectl:
    """`run(*args, stdin=None, check=True)`: kubectl with its own HOME (no shared discovery
    cache) and the cluster's kubeconfig; a failure raises AssertionError with kubectl's stderr.
    `path` goes first on PATH, where kubectl looks for plugins (`kubectl-<name>`)."""
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    if path is not None:
        env["PATH"] = os.pathsep.join([str(path), env.get("PATH", "")])

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(binary), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done

    return run
