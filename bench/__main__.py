"""Run every benchmark (or those named): `python -m bench [NAME [OPTION ...]] ...`.

NAME is a module suffix, e.g. `exporter_events` for `bench/bench_exporter_events.py`.
Options after a name go to that benchmark's `main(argv)` (only benchmarks whose `main`
takes an argument have options), e.g. `python -m bench operator_cost --duration 2m`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import time

import bench


def _plan(argv: list[str], available: list[str]) -> list[tuple[str, list[str]]]:
    """(module, its options) in the order named; every benchmark without options when none is named.

    A word naming a benchmark starts a new one; an option (`-x`, `--x`), and a word right
    after an option (its value), go to the benchmark before them; any other word is a name.
    """
    plan: list[tuple[str, list[str]]] = []
    for arg in argv:
        module = f"bench_{arg.removeprefix('bench_')}"
        if module in available or not (arg.startswith("-") or _after_option(plan)):
            plan.append((module, []))
        elif plan:
            plan[-1][1].append(arg)
        else:
            raise ValueError(f"option {arg} before any benchmark name")
    return plan or [(name, []) for name in available]


def _after_option(plan: list[tuple[str, list[str]]]) -> bool:
    """Whether the last word taken was an option (so the next one may be its value)."""
    return bool(plan) and bool(plan[-1][1]) and plan[-1][1][-1].startswith("-")


def main(argv: list[str]) -> int:
    available = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    try:
        wanted = _plan(argv, available)
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    unknown = [name for name, _ in wanted if name not in available]
    if unknown:
        listed = ", ".join(available)
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {listed}", file=sys.stderr)
        return 2
    modules = [(importlib.import_module(f"bench.{name}"), options) for name, options in wanted]
    for module, options in modules:
        if options and not inspect.signature(module.main).parameters:
            name = module.__name__.removeprefix("bench.bench_")
            print(f"bench: {name} takes no options (given {' '.join(options)})", file=sys.stderr)
            return 2
    for index, (module, options) in enumerate(modules, 1):
        name = module.__name__.removeprefix("bench.")
        print(f"\n== [{index}/{len(modules)}] {name} ==", flush=True)
        started = time.monotonic()
        if options:
            module.main(options)
        else:
            module.main()
        print(f"-- {name} took {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
