"""Starting and stopping the real control plane, as a library and as `gpuhealth sim --control-plane real`.

Aspects: the started cluster is the pinned build (`/version`), ready, its components each
authenticated as their own user (the audit log shows the scheduler and the controller-manager
by name), the admin kubeconfig works with kubectl; stopping leaves none of its processes and
removes its temporary work directory; the CLI prints the API URL and the kubeconfig path,
says that no fleet runs on it yet, and on SIGTERM stops every component and exits 0; if the
CLI is killed outright its components still die with it (PR_SET_PDEATHSIG); a component that
will not start (an unknown feature gate) fails the CLI with exit 1 and the component's log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth.testing.loopback import wait_until
from simulator.controlplane import ControlPlane, ControlPlaneSettings
from tests.support.controlplane import audit_events, kubectl

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

SIM = [sys.executable, "-m", "gpuhealth", "sim", "--control-plane", "real"]


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
    users = {e["user"]["username"] for e in audit_events(plane)}
    assert {"kubernetes-admin", "system:kube-scheduler", "system:kube-controller-manager"} <= users
    # Controllers act as their own service accounts (--use-service-account-credentials).
    assert any(u.startswith("system:serviceaccount:kube-system:") for u in users)
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
        assert "serving the bare control plane (no nodes, no GPUs)" in text
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
        components = _children(proc.pid)
        assert len(components) == 4, components
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert all(_gone(p) for p in components)
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
        [workdir] = [line.split(": ", 1)[1] for line in lines if line.startswith("work directory")]
        shutil.rmtree(workdir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_component_that_will_not_start_fails_the_cli_with_its_log(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SIM, "--feature-gates", "NoSuchGate=true", "--kubeconfig-out", str(tmp_path / "kc")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpuhealth sim: error: kube-apiserver: exited with status" in done.stderr
    assert "unrecognized feature gate: NoSuchGate" in done.stderr
    assert not (tmp_path / "kc").exists()
