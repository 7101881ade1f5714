"""`gpuhealth sim` run as a subprocess.

Aspects: a short --duration run prints the API URL, the kubeconfig path, the faults and the
health changes, then exits 0; SIGTERM stops a run cleanly (exit 0); --list-scenarios lists
the built-ins; a bad scenario file exits 2 naming the file, the line and the field, after
the `gpuhealth sim: error:` prefix every command uses; bad flags are usage errors (2), also the
simulated mode's flags with `--control-plane real`, a taken port a run-time failure (1).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SIM = [sys.executable, "-m", "gpuhealth", "sim"]


def test_a_short_run_prints_url_faults_and_health_changes_then_exits_0(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = subprocess.run(
        [
            *SIM,
            "--scenario",
            "xid-and-unknown",
            "--speed",
            "100",
            "--duration",
            "75",
            "--print-events",
            "--kubeconfig-out",
            str(kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "API server: http://127.0.0.1:" in out
    assert f"kubeconfig: {kubeconfig}" in out
    assert "fault   xid gpu-dp-0/gpu-3 xid=79" in out
    assert "health  gpu-dp-0/gpu-3: Healthy -> Unhealthy" in out
    assert "health  gpu-dra-1/gpu-1: Healthy -> Unknown" in out
    # Read when the run stops: on a loaded machine a few wall milliseconds (simulated seconds
    # at 100x) pass between the stop and the reading.
    stopped = re.search(r"stopped after (\d+) simulated seconds", out)
    assert stopped is not None and 75 <= int(stopped[1]) <= 80, out[-500:]
    assert "server: http://127.0.0.1:" in kubeconfig.read_text()


def test_sigterm_stops_the_simulator_cleanly() -> None:
    proc = subprocess.Popen(
        [*SIM, "--scenario", "quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("kubeconfig: "):
                kubeconfig = Path(line.split(": ", 1)[1].strip())
                break
        assert kubeconfig.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not kubeconfig.exists()  # the temporary kubeconfig goes with the run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_list_scenarios_names_each_builtin_with_a_description() -> None:
    proc = subprocess.run([*SIM, "--list-scenarios"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    header, *rows = proc.stdout.splitlines()
    assert header.split() == ["NAME", "DESCRIPTION"]
    lines = dict(line.split(None, 1) for line in rows)
    assert {"xid-and-unknown", "node-partition", "flapping", "fleet-10k", "quiet"} <= set(lines)
    wide = subprocess.run(
        [*SIM, "--list-scenarios", "-o", "json"], capture_output=True, text=True, timeout=60
    )
    scenarios = {s["name"]: s for s in json.loads(wide.stdout)["scenarios"]}
    assert scenarios["fleet-10k"]["nodes"] == 10_000 and scenarios["quiet"]["faults"] == 0


def test_a_bad_scenario_file_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "fleet:\n  - name: n\n    count: 1\n    gpusPerNode: 8\n    path: dra\n"
        "timeline:\n  - at: 5s\n    fault: gpu-lost\n    device: {node: n-0, gpu: 8}\n"
    )
    proc = subprocess.run([*SIM, "--scenario", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"gpuhealth sim: error: {bad}:9: timeline[0].device.gpu: 8 is out of range (node n-0 has 8 GPUs)"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--listen", "nowhere"], "argument --listen: 'nowhere': no port; expected HOST:PORT"),
        (["--speed", "nan"], "argument --speed: 'nan' is not a finite number"),
        (["--speed", "0"], "argument --speed: '0' must be above 0"),
        (["--duration", "forever"], "argument --duration: 'forever' is not a duration"),
        (["--token-file", "/nonexistent/token"], "--token-file /nonexistent/token: No such file"),
        (["--control-plane", "kind"], "argument --control-plane: invalid choice: 'kind'"),
        (
            ["--control-plane", "real", "--listen", "127.0.0.1:8080"],
            "--listen applies to --control-plane simulated: the real kube-apiserver serves TLS",
        ),
        (
            ["--control-plane", "real", "--scheduler-config", "/nonexistent/sched.yaml"],
            "--scheduler-config /nonexistent/sched.yaml: No such file or directory",
        ),
        (
            ["--control-plane", "real", "--scheduler-config", "/dev/null"],
            "--scheduler-config /dev/null: expected a KubeSchedulerConfiguration document",
        ),
        (
            ["--control-plane", "real", "--feature-gates", "DRADeviceTaintRules"],
            "--feature-gates: invalid feature gate 'DRADeviceTaintRules': expected NAME=true or NAME=false",
        ),
    ],
)
def test_bad_flags_are_usage_errors(flags: list[str], message: str) -> None:
    proc = subprocess.run([*SIM, *flags], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"gpuhealth sim: error: {message}" in proc.stderr and "Traceback" not in proc.stderr


def test_a_taken_port_is_a_run_time_failure() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*SIM, "--scenario", "quiet", "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "gpuhealth sim: error: " in proc.stderr and "Traceback" not in proc.stderr
