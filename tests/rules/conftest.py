"""Fixtures for the rules tests: the Prometheus and Alertmanager tools (failing, not skipping,
when one is missing; see support.require_tool)."""

from __future__ import annotations

import pytest

from tests.rules.support import require_tool


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def amtool() -> str:
    return require_tool("amtool")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    return require_tool("alertmanager")
