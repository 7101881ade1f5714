"""Fixtures for the dashboards tests: promtool, failing (not skipping) when it is missing."""

from __future__ import annotations

import pytest

from tests.rules.support import require_tool


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")
