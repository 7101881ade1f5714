"""What `-o table|wide|json|yaml` prints: kubectl-style tables and documents.

Every command that prints records formats them here, so they line up the same way and an
age reads the same everywhere (two units at most, as kubectl writes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

import orjson
import yaml


def human_duration(seconds: float) -> str:
    """3m12s, 2h5m, 4d3h, 45s (kubectl style: two units at most)."""
    total = int(max(0.0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def truncate(text: str, width: int) -> str:
    """`text` on one line, cut to `width` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def write_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO, *, no_headers: bool = False
) -> None:
    """Columns padded to their widest cell, three spaces apart; the last column runs on.

    `no_headers` leaves the header line out (kubectl's `--no-headers`, for scripts), and the
    columns are then as wide as their cells only."""
    shown = [] if no_headers else [headers]
    widths = [max([len(r[i]) for r in [*shown, *rows]], default=0) for i in range(len(headers))]
    for row in [*shown, *rows]:
        line = "   ".join(cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row))
        out.write(line.rstrip() + "\n")


def write_document(document: Any, output: str, out: TextIO) -> None:
    """One JSON (indented) or YAML document."""
    if output == "json":
        out.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif output == "yaml":
        out.write(yaml.safe_dump(document, sort_keys=False))
    else:
        raise ValueError(f"not a document format: {output!r}")
