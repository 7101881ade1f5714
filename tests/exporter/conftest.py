"""Fixtures of the exporter's tests: a manual clock and a state wired to it.

Object builders live in `tests/exporter/fixtures/builders.py`.
"""

from __future__ import annotations

import pytest

from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def store(clock: ManualClock) -> DeviceStateStore:
    return DeviceStateStore(clock)
