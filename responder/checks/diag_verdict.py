"""`python -m responder.checks.diag_verdict DIR`: the probe pod's judge container.

Reads what the diagnostic's container left in DIR (`responder.checks.diag`: the report, the
exit status, its log), prints one line with the verdict and exits 0 (pass) or 1 (fail), so the
Job's status is the probe's result. Thin: the decision is `diag.judge`'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from responder.checks.diag import EXIT_FILE, LOG_FILE, REPORT_FILE, judge

LOG_TAIL_CHARS = 400
"""How much of the diagnostic container's log a verdict without a report quotes."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _exit_code(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m responder.checks.diag_verdict", description=__doc__)
    parser.add_argument("results", type=Path, help="the folder the diagnostic's container wrote")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the pod was given (default 1)")
    args = parser.parse_args(argv)
    report = _read(args.results / REPORT_FILE)
    verdict = judge(report, _exit_code(_read(args.results / EXIT_FILE)), gpus=args.gpus)
    line = f"probe {'passed' if verdict.passed else 'failed'}: {verdict.reason}"
    log = (_read(args.results / LOG_FILE) or "").strip()
    if not verdict.passed and not (report or "").strip() and log:
        line += f"; diagnostic log: {' | '.join(log[-LOG_TAIL_CHARS:].splitlines())}"
    print(line, flush=True)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
