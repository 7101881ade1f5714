"""kube-scheduler for the control plane: the real scheduler, DRA allocation included.

Its own identity (`system:kube-scheduler`). An optional KubeSchedulerConfiguration file
(profiles, extenders such as gpuhealth's) is passed as `--config` with its client connection
pointed at our kubeconfig and leader election off: with a config file the scheduler ignores
those flags. Ready once `/readyz` answers 200, i.e. its informers have synced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuhealth.loopback_ports import free_port
from simulator.controlplane import delegated
from simulator.controlplane.certificates import KeyPair
from simulator.controlplane.process import Component, ControlPlaneError
from simulator.controlplane.versions import ComponentVersion

CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"


def merged_config(text: str, source: str, kubeconfig: Path) -> dict[str, Any]:
    """The user's KubeSchedulerConfiguration with our client connection and no leader election."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ControlPlaneError(f"{source}: not YAML: {exc}") from exc
    if not isinstance(config, dict) or config.get("kind") != "KubeSchedulerConfiguration":
        raise ControlPlaneError(f"{source}: expected a KubeSchedulerConfiguration document")
    if config.get("apiVersion") != CONFIG_API_VERSION:
        raise ControlPlaneError(f"{source}: apiVersion must be {CONFIG_API_VERSION}")
    connection = dict(config.get("clientConnection") or {})
    connection["kubeconfig"] = str(kubeconfig)
    election = dict(config.get("leaderElection") or {})
    election["leaderElect"] = False
    return {**config, "clientConnection": connection, "leaderElection": election}


def argv(
    binary: Path,
    *,
    kubeconfig: Path,
    serving: KeyPair,
    port: int,
    version: ComponentVersion,
    config: Path | None,
) -> list[str]:
    args = [str(binary), *delegated.flags(kubeconfig, serving, port, version)]
    if config is not None:
        args.append(f"--config={config}")
    return args


def start(
    binary: Path,
    workdir: Path,
    *,
    kubeconfig: Path,
    serving: KeyPair,
    ca: Path,
    version: ComponentVersion,
    config: Path | None,
    timeout: float,
) -> tuple[Component, float]:
    port = free_port()
    if config is not None:
        try:
            text = config.read_text()
        except OSError as exc:
            raise ControlPlaneError(f"{config}: {exc.strerror or exc}") from exc
        merged = workdir / "scheduler-config.yaml"
        merged.write_text(yaml.safe_dump(merged_config(text, str(config), kubeconfig), sort_keys=False))
        config = merged
    args = argv(binary, kubeconfig=kubeconfig, serving=serving, port=port, version=version, config=config)
    return delegated.start(
        "kube-scheduler", args, workdir, port=port, ca=ca, health="/readyz", timeout=timeout
    )
