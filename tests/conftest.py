"""Fixtures shared by every test.

Aspects covered here: no test may leave asyncio tasks running behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves tasks behind (they would leak into the next test)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        yield
        return
    before = asyncio.all_tasks(loop)
    yield
    # Give cancelled tasks a chance to finish before judging.
    for _ in range(3):
        await asyncio.sleep(0)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks(loop) - before if t is not current and not t.done()]
    if left:
        for task in left:
            task.cancel()
        pytest.fail(f"test left {len(left)} asyncio task(s) running: {[t.get_coro() for t in left]}")
