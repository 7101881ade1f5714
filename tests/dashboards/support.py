"""The committed dashboards, read once for the dashboards tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dashboards.definitions import DASHBOARDS

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"


def committed() -> dict[str, dict[str, Any]]:
    """File stem -> the committed dashboard JSON (dashboards/<stem>.json)."""
    return {stem: json.loads((DASHBOARDS_DIR / f"{stem}.json").read_text()) for stem in DASHBOARDS}
