"""The simulated cluster's classes stay the size of one component each.

Aspect: no class in `simulator/` is over 500 lines (`docs/ARCHITECTURE.md`, "Simulated
cluster": one class per real component; what a component needs beside its state, such as pure
decisions, builders of objects and protocol steps, lives in functions of its own module or
beside it).
"""

from __future__ import annotations

import ast
from pathlib import Path

SIMULATOR = Path(__file__).resolve().parents[2] / "simulator"
LIMIT = 500


def test_no_simulator_class_is_over_500_lines() -> None:
    sizes = {}
    for path in sorted(SIMULATOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(SIMULATOR.parent)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 50, "the walk found the simulator's classes"
    assert {name: lines for name, lines in sizes.items() if lines > LIMIT} == {}
