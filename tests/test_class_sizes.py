"""The product's classes stay the size of one component each.

Aspect: no class in any of the product's packages is over 500 lines (`docs/ARCHITECTURE.md`:
a class is one real-world component; one near the limit has two jobs and is split by
responsibility, never trimmed to fit). What a component needs beside its state, such as pure
decisions, builders of objects and protocol steps, lives in functions of its own module or
beside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "gpuhealth",
    "gpuhealth_cli",
    "exporter",
    "responder",
    "rules",
    "kubectl_gpuhealth",
    "backtest",
    "simulator",
    "demo",
    "bench",
    "dashboards",
    "tools",
)
LIMIT = 500


def class_sizes() -> dict[str, int]:
    """Lines per class, by `path:Class` (nested classes by their own name)."""
    sizes = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    assert node.end_lineno is not None
                    sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def test_the_walk_finds_every_package() -> None:
    sizes = class_sizes()
    for package in PACKAGES:
        assert any(name.startswith(f"{package}/") for name in sizes), f"no class found in {package}/"


def test_no_class_is_over_500_lines() -> None:
    oversized = {name: lines for name, lines in class_sizes().items() if lines > LIMIT}
    assert oversized == {}
