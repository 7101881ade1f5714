"""Paths and tool helpers shared by the rules tests.

The Makefile builds promtool, amtool and alertmanager from their pinned Go modules (`make
tools`, `tools/upstream/build.py`), so a missing tool fails these tests with that hint
instead of skipping them: CI must not pass with the checks silently gone.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuhealth.testing import upstream

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "rules"
PROMETHEUS_DIR = RULES_DIR / "prometheus"
ALERTMANAGER_CONFIG = RULES_DIR / "alertmanager" / "alertmanager.yaml"
PROMTOOL_TESTS_DIR = RULES_DIR / "tests"
RUNBOOKS = REPO / "docs" / "runbooks.md"


def require_tool(name: str) -> str:
    try:
        return upstream.binary(name)
    except upstream.UpstreamMissing as exc:
        pytest.fail(f"{exc}", pytrace=False)


def run_tool(args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
