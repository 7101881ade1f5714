"""Paths and tool helpers shared by the rules tests.

The Makefile installs promtool, amtool and prometheus-alertmanager (`make tools`), so a
missing tool fails these tests with that hint instead of skipping them: CI must not pass
with the checks silently gone.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "rules"
PROMETHEUS_DIR = RULES_DIR / "prometheus"
ALERTMANAGER_CONFIG = RULES_DIR / "alertmanager" / "alertmanager.yaml"
PROMTOOL_TESTS_DIR = RULES_DIR / "tests"
RUNBOOKS = REPO / "docs" / "runbooks.md"


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not on PATH. Install Prometheus 2.42 / Alertmanager 0.25 with `make tools` "
            "(Debian packages prometheus and prometheus-alertmanager).",
            pytrace=False,
        )
    return path


def run_tool(args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
