"""The injected clock: manual time moves only when told, both readings together, never back."""

from __future__ import annotations

import pytest

from gpuhealth.clock import ManualClock, SystemClock


def test_manual_clock_moves_only_when_advanced() -> None:
    clock = ManualClock(start=100.0)
    assert (clock.now(), clock.monotonic()) == (100.0, 0.0)
    clock.advance(2.5)
    assert (clock.now(), clock.monotonic()) == (102.5, 2.5)


def test_manual_clock_refuses_to_go_back() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-1)


def test_system_clock_monotonic_never_decreases() -> None:
    clock = SystemClock()
    first = clock.monotonic()
    assert clock.monotonic() >= first
    assert clock.now() > 1_600_000_000
