"""The shipped release ladder as tests walk it: read from `gpuhealth.ladder`, never spelled here.

A test that walks a record up the ladder derives the walk from `LADDER` (its phases in order,
its checks by name, each rung's length and kind), so a rung added to the ladder is walked by
the same tests with no edit to them; a test of one rung's own behaviour names that rung.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.ladder import LADDER, Ladder

RELEASED = "Released"
"""The phase a walk ends in once the last rung is passed."""


def minute_rungs(ladder: Ladder = LADDER) -> dict[str, Any]:
    """Every rung's length setting at a minute (a check's timeout, a window's or a ramp's length),
    as keyword arguments of `PolicySettings`: a walk of the ladder takes minutes, whatever rungs
    it has."""
    return {r.setting: 60.0 for r in ladder.rungs if r.setting}


def walk(ladder: Ladder = LADDER) -> list[str]:
    """The phases a release walks, in order: every rung's, then Released."""
    return [*ladder.phases, RELEASED]


def check_names(ladder: Ladder = LADDER) -> list[str]:
    """The ladder's checks by name, in the order they run."""
    return [r.name for r in ladder.checks()]
