"""The exporter and the responder run as processes from the manifests' container args.

For the tests that hold the shipped manifests to a cluster (the simulated one in tests/deploy,
the real control plane in tests/controlplane): `exporter_run` and `responder_runs` build the
command lines (`python -m gpuhealth ARGS`, the image's entry point) with only what a pod gets
swapped in (`tests.deploy.manifests.local_args`), plus `--kubeconfig` for the service account;
`running` starts them, waits for each `/readyz` and stops them on exit; `leaders` names the
responder replicas that lead.
"""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from gpuhealth.testing.loopback import child_process, free_port, http_ok, log_tail, wait_until
from tests.deploy.manifests import NAMESPACE, container, find, local_args

Runs = dict[str, tuple[list[str], int]]
"""Process name -> (arguments after `python -m gpuhealth`, its loopback port)."""
REPLICAS = ("gpuhealth-responder-a", "gpuhealth-responder-b")


def exporter_run(
    objects: list[dict[str, Any]], tmp: Path, *, directory: Path, node: str, nvml: str, kubeconfig: Path
) -> tuple[list[str], int]:
    """The exporter DaemonSet's container on `node`, NVML from `nvml`; `node=""`: cluster mode
    (the same container without `--node`)."""
    port = free_port()
    args = local_args(
        container(find(objects, "DaemonSet", "gpuhealth-exporter")),
        downward={"spec.nodeName": node},
        mounts={"/var/lib/gpuhealth/exporter": directory, "/tmp": tmp},
        port=port,
        swaps={"--nvml": nvml},
    )
    if not node:
        args = [a for a in args if a.partition("=")[0] != "--node"]
    return [*args, f"--kubeconfig={kubeconfig}"], port


def responder_runs(objects: list[dict[str, Any]], tmp: Path, *, token: str, kubeconfig: Path) -> Runs:
    """Two replicas of the responder Deployment's container, with the token Secret and the
    config ConfigMap as the kubelet would project them, and an unreachable Prometheus."""
    deployment = find(objects, "Deployment", "gpuhealth-responder")
    token_dir, config_dir = tmp / "token", tmp / "config"
    for directory in (token_dir, config_dir):
        directory.mkdir()
    (token_dir / "token").write_text(token + "\n")
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    for name, text in find(objects, "ConfigMap", volume["configMap"]["name"])["data"].items():
        (config_dir / name).write_text(text)
    runs: Runs = {}
    for replica in REPLICAS:
        port = free_port()
        args = local_args(
            container(deployment),
            downward={"metadata.name": replica, "metadata.namespace": NAMESPACE},
            mounts={"/etc/gpuhealth/token": token_dir, "/etc/gpuhealth/config": config_dir},
            port=port,
            swaps={"--prometheus-url": f"http://127.0.0.1:{free_port()}"},
        )
        runs[replica] = ([*args, f"--kubeconfig={kubeconfig}"], port)
    return runs


@contextmanager
def running(runs: Runs, tmp: Path, *, timeout: float) -> Iterator[dict[str, bool]]:
    """Start every run (logs under `tmp`), wait until each answers `/readyz`; stop them on exit."""
    with ExitStack() as stack:
        procs = {
            name: stack.enter_context(
                child_process([sys.executable, "-m", "gpuhealth", *argv], tmp / f"{name}.log")
            )
            for name, (argv, _) in runs.items()
        }
        ready: dict[str, bool] = {}
        for name, (_, port) in runs.items():

            def probe(name: str = name, port: int = port) -> bool:
                if procs[name].poll() is not None:
                    raise AssertionError(f"{name} exited:\n{log_tail(tmp / f'{name}.log')}")
                return http_ok(f"http://127.0.0.1:{port}/readyz")

            ready[name] = wait_until(f"{name} ready", probe, timeout=timeout)
        yield ready


def _leading(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return bool(re.search(r"^gpuhealth_responder_leader 1(\.0)?$", text, re.MULTILINE))


def leaders(runs: Runs, *, timeout: float) -> list[str]:
    """The responder replicas among `runs` that lead, once at least one does."""
    replicas = [n for n in runs if n in REPLICAS]
    wait_until("a leader", lambda: [n for n in replicas if _leading(runs[n][1])], timeout=timeout)
    return [n for n in replicas if _leading(runs[n][1])]
