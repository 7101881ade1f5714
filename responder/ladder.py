"""The release ladder, as the responder reads it: the declaration lives in the core.

`gpuhealth.ladder` declares the rungs (`LADDER`, `RESET`, `KNOWN`), their kinds and their
lengths' settings (`LadderSettings`); it is in the core because the rules read it too (the
stuck-phase alert), and a service never imports another. The responder's modules name it
here, the ladder of the service that walks it.
"""

from __future__ import annotations

from gpuhealth.ladder import (
    CANARY,
    CANARY_OPT_IN,
    CANARY_TAINT,
    KNOWN,
    LADDER,
    PROBING,
    QUARANTINE_TAINT,
    RAMP,
    RESET,
    STABILIZING,
    Kind,
    Ladder,
    LadderSettings,
    Rung,
    Target,
    with_reset,
    without_reset,
)

__all__ = [
    "CANARY",
    "CANARY_OPT_IN",
    "CANARY_TAINT",
    "KNOWN",
    "LADDER",
    "PROBING",
    "QUARANTINE_TAINT",
    "RAMP",
    "RESET",
    "STABILIZING",
    "Kind",
    "Ladder",
    "LadderSettings",
    "Rung",
    "Target",
    "with_reset",
    "without_reset",
]
