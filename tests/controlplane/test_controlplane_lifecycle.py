"""Starting and stopping the real control plane, as a library and as `gpuhealth sim --control-plane real`.

Aspects: the started cluster is the pinned build (`/version`), ready, its components each
authenticated as their own user (the audit log shows the scheduler and the controller-manager
by name), the admin kubeconfig works with kubectl; stopping leaves none of its processes and
removes its temporary work directory; the CLI prints the API URL and the kubeconfig path,
says that no fleet runs on it yet, and on SIGTERM (or at the end of `--duration`) stops every
component, removes its temporary work directory and exits 0; if the
CLI is killed outright its components still die with it (PR_SET_PDEATHSIG); a component that
will not start (an unknown feature gate) fails the CLI with exit 1 and the component's log;
the shipped KubeSchedulerConfiguration snippet (deploy/scheduler) is what kube-scheduler runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.testing.loopback import wait_until
from simulator.controlplane import ControlPlane, ControlPlaneSettings, probes
from simulator.scenario import resolve
from tests.deploy.manifests import KUBECTL
from tests.support.controlplane import audit_events, kubectl

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

SIM = [sys.executable, "-m", "gpuhealth", "sim", "--control-plane", "real"]
SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "scheduler" / "kube-scheduler-config.yaml"


def _gone(pid: int) -> bool:
    """True once `pid` is no process (or a zombie of someone else's, which holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def test_the_cluster_is_the_pinned_build_and_each_component_is_its_own_user(plane: ControlPlane) -> None:
    version = kubectl(plane, "version", "-o", "json")
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == "v1.37.2"
    assert kubectl(plane, "get", "--raw", "/readyz").stdout.strip() == "ok"
    # Ready is the controller-manager's /healthz, which may answer before its controllers
    # (each its own service account: --use-service-account-credentials) have called the API.
    wanted = {"kubernetes-admin", "system:kube-scheduler", "system:kube-controller-manager"}

    def users() -> set[str] | None:
        seen = {e["user"]["username"] for e in audit_events(plane)}
        controllers = any(u.startswith("system:serviceaccount:kube-system:") for u in seen)
        return seen if wanted <= seen and controllers else None

    wait_until("every component's requests in the audit log", users, timeout=60)
    assert set(plane.rss_bytes()) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}


def test_stopping_leaves_no_process_and_no_work_directory() -> None:
    cp = ControlPlane(ControlPlaneSettings())
    cp.start()
    pids, workdir = list(cp.pids().values()), cp.workdir
    assert len(pids) == 4 and all(not _gone(p) for p in pids)
    cp.stop()
    assert all(_gone(p) for p in pids)
    assert not workdir.exists()


def _start_cli(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [*SIM, "--kubeconfig-out", str(tmp_path / "kubeconfig"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("the scenario's fleet"):
            break
    return proc, lines


def test_the_cli_serves_a_real_control_plane_and_sigterm_stops_all_of_it(tmp_path: Path) -> None:
    proc, lines = _start_cli(tmp_path)
    try:
        text = "\n".join(lines)
        assert proc.poll() is None, text
        assert f"kubeconfig: {tmp_path / 'kubeconfig'}" in lines
        assert any(line.startswith("API server: https://127.0.0.1:") for line in lines), text
        assert "runs as nodes of the real control plane, in real time" in text
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "kubectl"),
                f"--kubeconfig={tmp_path / 'kubeconfig'}",
                "get",
                "ns",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "namespace/kube-system" in done.stdout.split(), done.stderr
        # The scenario's fleet registers its nodes with the real apiserver, as kubelets would.
        expected = {f"node/{name}" for name in resolve("xid-and-unknown").nodes}

        def nodes() -> bool:
            listed = subprocess.run(
                [str(KUBECTL), f"--kubeconfig={tmp_path / 'kubeconfig'}", "get", "nodes", "-o", "name"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            return expected <= set(listed.stdout.split())

        wait_until("the scenario's nodes to register", nodes, timeout=60)
        components = _children(proc.pid)
        assert len(components) == 4, components
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert all(_gone(p) for p in components)
        assert not _workdir(lines).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_killing_the_cli_outright_still_takes_its_components_with_it(tmp_path: Path) -> None:
    proc, lines = _start_cli(tmp_path)
    try:
        components = _children(proc.pid)
        assert len(components) == 4, "\n".join(lines)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(
            "the components to die with their parent", lambda: all(_gone(p) for p in components), timeout=30
        )
        # What a killed process cannot do itself: remove its temporary work directory.
        shutil.rmtree(_workdir(lines))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _workdir(lines: list[str]) -> Path:
    [workdir] = [line.split(": ", 1)[1] for line in lines if line.startswith("work directory")]
    return Path(workdir)


def _run_cli(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [*SIM, *flags, "--kubeconfig-out", str(tmp_path / "kc")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_a_duration_stops_the_real_control_plane_by_itself(tmp_path: Path) -> None:
    done = _run_cli(tmp_path, "--duration", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("stopping the fleet and the control plane"), done.stdout
    assert not _workdir(done.stdout.splitlines()).exists()


def test_a_component_that_will_not_start_fails_the_cli_with_its_log(tmp_path: Path) -> None:
    done = _run_cli(tmp_path, "--feature-gates", "NoSuchGate=true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpuhealth sim: error: kube-apiserver: exited with status" in done.stderr
    assert "unrecognized feature gate: NoSuchGate" in done.stderr
    assert not (tmp_path / "kc").exists()


def _without_false(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_false(v) for k, v in value.items() if v is not False}
    if isinstance(value, list):
        return [_without_false(v) for v in value]
    return value


def test_the_shipped_scheduler_configuration_is_what_the_real_scheduler_runs(tmp_path: Path) -> None:
    """deploy/scheduler's extender snippet, as kube-scheduler itself reports its configuration
    (/configz on its secure port, read as the admin)."""
    shipped = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    with ControlPlane(ControlPlaneSettings(workdir=tmp_path, scheduler_config=SCHEDULER_CONFIG)) as cp:
        [scheduler] = [c for c in cp.components if c.name == "kube-scheduler"]
        [port] = [a.split("=", 1)[1] for a in scheduler.argv if a.startswith("--secure-port=")]
        assert cp.admin is not None
        context = probes.tls_context(cp.ca_path, cp.admin)
        url = f"https://127.0.0.1:{port}/configz"

        def configz() -> dict[str, Any] | None:
            # 403 until the scheduler has loaded the client CA it trusts from the apiserver's
            # extension-apiserver-authentication ConfigMap (shortly after its /readyz).
            try:
                with urllib.request.urlopen(url, context=context, timeout=10) as answer:
                    config: dict[str, Any] = json.load(answer)["componentconfig"]
                    return config
            except urllib.error.HTTPError as exc:
                if exc.code == 403:
                    return None
                raise

        running = wait_until("the scheduler's /configz as the admin", configz, timeout=30)
    [extender] = running["extenders"]
    [wanted] = shipped["extenders"]
    # Every field as shipped (configz leaves out false values, as Go's omitempty does).
    assert {k: extender[k] for k in wanted if k in extender} == _without_false(wanted)
    assert running["profiles"][0]["schedulerName"] == "default-scheduler"
    assert running["leaderElection"]["leaderElect"] is False
