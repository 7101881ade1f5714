"""Run every benchmark (or those named): `python -m bench [NAME ...]`.

NAME is a module suffix, e.g. `exporter_events` for `bench/bench_exporter_events.py`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench


def main(argv: list[str]) -> int:
    available = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    wanted = [f"bench_{name.removeprefix('bench_')}" for name in argv] or available
    unknown = [name for name in wanted if name not in available]
    if unknown:
        listed = ", ".join(available)
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {listed}", file=sys.stderr)
        return 2
    for index, name in enumerate(wanted, 1):
        print(f"\n== [{index}/{len(wanted)}] {name} ==", flush=True)
        started = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        module.main()
        print(f"-- {name} took {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
