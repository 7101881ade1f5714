"""`gpuhealth sim --scheduler-config FILE`: a file the scheduler cannot use is a usage error.

Aspects: a missing file, a wrong apiVersion and an HTTPS extender each exit 2 with the file
and field named, before anything is served.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SIM = [sys.executable, "-m", "gpuhealth", "sim", "--scenario", "quiet", "--duration", "1s"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "No such file or directory"),
        ("apiVersion: v1\nkind: KubeSchedulerConfiguration\n", "apiVersion 'v1' is not kubescheduler.config"),
        (
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
            "extenders:\n  - urlPrefix: http://127.0.0.1:1\n    enableHTTPS: true\n",
            "extenders[0].enableHTTPS: HTTPS extenders are not supported by the simulator",
        ),
    ],
)
def test_a_bad_scheduler_config_is_a_usage_error(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "scheduler.yaml"
    if text is not None:
        path.write_text(text)
    proc = subprocess.run([*SIM, "--scheduler-config", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"gpuhealth sim: error: --scheduler-config {path}: ")
    assert message in proc.stderr and "Traceback" not in proc.stderr
