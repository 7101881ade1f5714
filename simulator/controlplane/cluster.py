"""The whole control plane, started in order and stopped in reverse: `ControlPlane`.

    with ControlPlane(ControlPlaneSettings(kubernetes="1.37")) as cp:
        subprocess.run(["kubectl", "--kubeconfig", cp.kubeconfig_path, "get", "ns"])

Start: certificates and keys into the work directory, etcd, kube-apiserver (ready once every
post-start hook ran, bootstrap RBAC included), then kube-controller-manager and kube-scheduler,
each as its own identity; an admin kubeconfig (`system:masters`) is written last, so a client
polling for it finds a ready cluster. A component that exits or is not ready in time raises
`ControlPlaneError` with its log tail, after everything started so far was stopped. Stop:
scheduler, controller-manager, apiserver, etcd, each SIGTERM then SIGKILL; a work directory
this made itself is removed, one given is kept (logs, audit log).

Faults of a real control plane (`gpuhealth chaos --control-plane real`): `restart(name)` stops
one component and starts it again with the same argv (ports, certificates, data directory), the
others running on (one that exits meanwhile is started again, as a kubelet would);
kube-apiserver keeps its port, so every kubeconfig stays valid, and clients reconnect as they
would to a restarted apiserver. `compact_etcd()` compacts etcd at its current revision. Alone
it changes nothing a client sees: the running apiserver serves resumed watches and exact lists
from its watch cache's own window. A restart of kube-apiserver alone gives a watch resumed from
before it 410 Gone (the new cache starts at its first list), yet etcd still serves an exact
list at that version. After both, nothing serves a version before the compaction: every
resuming client gets 410 Gone and lists again (1.37.2; tests/controlplane/test_controlplane_faults.py).

Start it, and restart its components, from a thread that lives as long as it (see `process`):
the children die with it.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from simulator.apiserver.kubeconfig import ClientTLS, write_kubeconfig
from simulator.controlplane import apiserver, binaries, controller_manager, etcd, scheduler
from simulator.controlplane.certificates import CertificateAuthority, KeyPair, service_account_keys
from simulator.controlplane.process import Component, ControlPlaneError
from simulator.controlplane.versions import DEFAULT, ComponentVersion

ADMIN_USER = "kubernetes-admin"
ADMIN_GROUPS = ("system:masters",)
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
CONTEXT = "gpuhealth-real"


@dataclass(frozen=True)
class ControlPlaneSettings:
    kubernetes: str = DEFAULT
    """The Kubernetes minor: "1.37" or "1.36" (the pinned builds of tools/upstream)."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Gates for every component, on top of what the version needs (`versions`)."""
    workdir: Path | None = None
    """Certificates, data, logs, audit log. None: a temporary directory, removed on stop."""
    kubeconfig_out: Path | None = None
    """Where the admin kubeconfig goes (default: `<workdir>/kubeconfig`)."""
    scheduler_config: Path | None = None
    """A KubeSchedulerConfiguration file for kube-scheduler (`--config`), e.g. with extenders."""
    start_timeout_seconds: float = 60.0
    """Per component: a cold apiserver on a busy 2-core machine takes ~10 s, a warm one ~3 s."""
    restart_grace_seconds: float = 2.0
    """Seconds a component restarted by `restart` has to exit after SIGTERM before SIGKILL. Not the
    10 s of a stop: kube-apiserver with clients' watches open stops listening at once, then does
    not exit in 10 s (1.37.2), and whoever restarts it waits all that time."""


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler on loopback."""

    def __init__(self, settings: ControlPlaneSettings | None = None) -> None:
        self.settings = settings or ControlPlaneSettings()
        self.version = ComponentVersion(self.settings.kubernetes, dict(self.settings.feature_gates))
        self._own_workdir = self.settings.workdir is None
        # A temporary directory is named now and made by start(): one never started leaves none.
        temporary = Path(tempfile.gettempdir()) / f"gpuhealth-controlplane-{secrets.token_hex(6)}"
        self.workdir = self.settings.workdir or temporary
        self.components: list[Component] = []
        self.timings: dict[str, float] = {}
        """Seconds each component took to become ready, and "total"."""
        self.url = ""
        self.etcd_url = ""
        """etcd's client URL (plain HTTP on loopback)."""
        self.revived: list[str] = []
        """Components `restart` found exited and started again, in order (each time one was)."""
        self.kubeconfig_path = self.settings.kubeconfig_out or self.workdir / "kubeconfig"
        self.ca_path = self.workdir / "pki" / "ca.crt"
        self.audit_log_path = self.workdir / "audit.log"
        self.admin: KeyPair | None = None

    # ----- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every component, in order; on failure stop what started and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        started = time.monotonic()
        minor, timeout = self.settings.kubernetes, self.settings.start_timeout_seconds
        paths = {
            name: binaries.binary(name, minor if name.startswith("kube-") else None)
            for name in ("etcd", *binaries.KUBERNETES_BINARIES)
        }
        if self._own_workdir:
            self.workdir.mkdir(mode=0o700)
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        ca = CertificateAuthority(pki)
        self.admin = ca.client("admin", ADMIN_USER, ADMIN_GROUPS)
        files = apiserver.ApiserverFiles(
            serving=ca.serving("apiserver", "kube-apiserver", dns=("kubernetes", "kubernetes.default")),
            ca=ca.pair.cert,
            service_account=service_account_keys(pki),
        )

        component, endpoints, self.timings["etcd"] = etcd.start(paths["etcd"], self.workdir, timeout=timeout)
        self.etcd_url = endpoints.client_url
        self.components.append(component)
        component, self.url, self.timings["kube-apiserver"] = apiserver.start(
            paths["kube-apiserver"],
            self.workdir,
            etcd_url=endpoints.client_url,
            files=files,
            admin=self.admin,
            version=self.version,
            timeout=timeout,
        )
        self.components.append(component)

        kcm_config = self._kubeconfig(
            "controller-manager", ca.client("controller-manager", CONTROLLER_MANAGER_USER)
        )
        component, self.timings["kube-controller-manager"] = controller_manager.start(
            paths["kube-controller-manager"],
            self.workdir,
            kubeconfig=kcm_config,
            serving=ca.serving("controller-manager-serving", "kube-controller-manager"),
            ca=ca.pair.cert,
            service_account=files.service_account,
            version=self.version,
            timeout=timeout,
        )
        self.components.append(component)
        scheduler_config = self._kubeconfig("scheduler", ca.client("scheduler", SCHEDULER_USER))
        component, self.timings["kube-scheduler"] = scheduler.start(
            paths["kube-scheduler"],
            self.workdir,
            kubeconfig=scheduler_config,
            serving=ca.serving("scheduler-serving", "kube-scheduler"),
            ca=ca.pair.cert,
            version=self.version,
            config=self.settings.scheduler_config,
            timeout=timeout,
        )
        self.components.append(component)
        write_kubeconfig(self.kubeconfig_path, self.url, context=CONTEXT, tls=self._tls(self.admin))
        self.timings["total"] = time.monotonic() - started

    def stop(self) -> None:
        """Stop every component started, newest first; remove a temporary work directory."""
        while self.components:
            self.components.pop().stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self, name: str) -> float:
        """Stop the component `name` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
        and start it again as it was, the others left running; return once the whole control
        plane is ready again: the seconds that took. A component that exited meanwhile is started
        again (named in `revived`), as the kubelet restarts an exited static pod:
        kube-controller-manager exits when its apiserver goes away while it is still building its
        controllers, seconds after its /healthz first answers (1.37.2). ControlPlaneError, with
        the log tail, when a component is not ready in time."""
        started = time.monotonic()
        self._component(name).restart(
            timeout=self.settings.start_timeout_seconds, grace=self.settings.restart_grace_seconds
        )
        self._settle()
        return time.monotonic() - started

    def _component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        running = ", ".join(c.name for c in self.components) or "none"
        raise ControlPlaneError(f"no component {name!r} to restart (running: {running})")

    def _settle(self) -> None:
        """Every component ready, in start order (each needs the ones before it); one that has
        exited is started again."""
        timeout, grace = self.settings.start_timeout_seconds, self.settings.restart_grace_seconds
        for component in self.components:
            if component.running() and component.probe is not None:
                try:
                    component.wait_ready(component.probe, timeout=timeout)
                    continue
                except ControlPlaneError:
                    if component.running():
                        raise  # running but not ready in time: a failure, not an exit
            component.restart(timeout=timeout, grace=grace)
            self.revived.append(component.name)

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (physically); that revision. Every resourceVersion
        up to it is gone from etcd; restart kube-apiserver after it for its clients to see 410."""
        if not self.etcd_url:
            raise ControlPlaneError("etcd is not running: start the control plane first")
        return etcd.compact(self.etcd_url)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ----- what clients need ----------------------------------------------------------------------

    def _tls(self, client: KeyPair | None) -> ClientTLS:
        if client is None:
            return ClientTLS(self.ca_path)
        return ClientTLS(self.ca_path, client.cert, client.key)

    def _kubeconfig(self, stem: str, client: KeyPair) -> Path:
        path = self.workdir / f"{stem}.kubeconfig"
        write_kubeconfig(path, self.url, context=CONTEXT, tls=self._tls(client))
        return path

    def kubeconfig_for_token(self, path: Path, token: str) -> Path:
        """A kubeconfig at `path` that authenticates with a bearer token (a service account's)."""
        write_kubeconfig(path, self.url, token=token, context=CONTEXT, tls=self._tls(None))
        return path

    def check_running(self) -> None:
        """ControlPlaneError naming the first component that has exited, with its log tail."""
        for component in self.components:
            if not component.running():
                raise component.failure(f"exited with status {component.proc.returncode}")

    def pids(self) -> dict[str, int]:
        return {c.name: c.pid for c in self.components}

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each running component (Linux: /proc/<pid>/status VmRSS)."""
        out: dict[str, int] = {}
        for component in self.components:
            try:
                status = Path(f"/proc/{component.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[component.name] = int(line.split()[1]) * 1024
        return out

    def log_path(self, component: str) -> Path:
        return self.workdir / f"{component}.log"


__all__ = ["ControlPlane", "ControlPlaneError", "ControlPlaneSettings"]
