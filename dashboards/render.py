"""Render the dashboards to JSON files and compare them with the committed ones.

Pure apart from reading and writing the files it is given: the CLIs (`python -m dashboards`,
`gpuhealth dashboards render`) own the arguments and exit codes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from dashboards import sdk
from dashboards.definitions import DASHBOARDS
from dashboards.settings import Settings


def render(settings: Settings) -> dict[str, str]:
    """File name -> JSON text of every dashboard, in a stable order and format."""
    return {f"{stem}.json": sdk.encode(sdk.build(build(settings))) for stem, build in DASHBOARDS.items()}


def write(files: Mapping[str, str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def stale(files: Mapping[str, str], out_dir: Path) -> list[str]:
    """One readable entry per file under `out_dir` that differs from `files` or is missing; [] when fresh."""
    problems: list[str] = []
    for name, text in files.items():
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        committed = path.read_text(encoding="utf-8")
        if committed != text:
            diff = difflib.unified_diff(
                committed.splitlines(),
                text.splitlines(),
                f"{name} (committed)",
                f"{name} (generated)",
                lineterm="",
            )
            problems.append(f"{name}: differs\n" + "\n".join(list(diff)[:40]))
    return problems
