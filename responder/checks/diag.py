"""The probe's verdict from DCGM's diagnostic report (`dcgmi diag -j`): pure, no I/O.

The probe's pod runs `dcgmi diag -r LEVEL -j` and keeps its standard output and exit status
(`responder.checks.probe_pod`); this module judges them. The exit status alone is not enough:
`dcgmi` exits 0 for a diagnostic that skipped every test, and a report is the only place that
says which GPU a result is for.

The report's shape, as `dcgmi` writes it (its `Diag.cpp`, `NvvsJsonStrings.h`):

- DCGM 4.x: `{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status",
  "warnings": [{"warning", "error_id", "error_category", "error_severity"}], "info": [...]}],
  "test_summary": {"status", "warnings"?}}]}]}, "entity_groups": [...], "metadata": {...}}`.
  A result's status is `Pass`, `Skip` or `Fail`: a Warn is written as `Fail` in the JSON (only
  the table shows `Warn`), and tests that did not run on an entity have no result for it.
- DCGM 3.x: the key is `"DCGM GPU Diagnostic"`; a per-GPU result names its GPU as
  `"gpu_id": "0"` (a string); the software tests (category Deployment) have one result with
  no GPU. Statuses `Pass`, `Skip`, `Warn`, `Fail`.
- A diagnostic that could not run: `{"DCGM Diagnostic": {"version", "runtime_error": "..."}}`.

The rule (a probe releases a card, so it must be sure): pass only when the diagnostic ran,
exited 0, produced no Fail or Warn anywhere, and at least one test passed on a GPU, with every
GPU result on the GPUs the pod was given and no more (`gpus`: a diagnostic that ran on another
card cannot vouch for this one). Skip is neutral: DCGM skips what does not apply to the card
(a test its SKU lacks, a software check it cannot run in a container), which is no evidence
against it; but a report of only skips is no evidence for it either, and fails. Warn fails:
DCGM warns of what it considers worth a person's look (throttling, ECC counts, a slow
bandwidth), and a quarantined card gets no benefit of the doubt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REPORT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
"""The report's top-level key in DCGM 4.x, then in 3.x."""
GPU_ENTITY_GROUP = "GPU"
PASS, SKIP, WARN, FAIL = "Pass", "Skip", "Warn", "Fail"
REPORT_FILE = "diag.json"
"""In the pod's results folder: what `dcgmi diag -j` wrote to its standard output."""
EXIT_FILE = "diag.exit"
"""In the pod's results folder: `dcgmi diag`'s exit status, a number on one line."""
LOG_FILE = "diag.log"
"""In the pod's results folder: what the diagnostic's container said (the hostengine's start,
the wait, dcgmi's standard error), quoted by the verdict when there is no report."""


@dataclass(frozen=True, slots=True)
class Result:
    """One test's result on one entity (or on none: a software check, a test summary)."""

    test: str
    status: str
    gpu: int | None
    """The DCGM GPU id the result is for; None when it names no GPU."""
    messages: tuple[str, ...] = ()
    """The result's warnings (errors) as DCGM words them."""


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str
    """One line: why, naming the failing tests and their messages."""


class ReportError(ValueError):
    """The diagnostic's output is not a report this module can read."""


def parse(text: str) -> tuple[Result, ...]:
    """Every result of a `dcgmi diag -j` report (test summaries included, as results with no GPU).

    ReportError when the text is not JSON, has no report, or the diagnostic reported that it
    could not run (`runtime_error`)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise ReportError(f"expected a JSON object, not {type(doc).__name__}")
    report = next((doc[k] for k in REPORT_KEYS if k in doc), None)
    if not isinstance(report, Mapping):
        raise ReportError(f"no report (expected one of {', '.join(REPORT_KEYS)})")
    error = report.get("runtime_error")
    if error:
        raise ReportError(f"the diagnostic did not run: {_text(error)}")
    categories = report.get("test_categories")
    if not isinstance(categories, list):
        raise ReportError("the report has no test_categories")
    results: list[Result] = []
    for category in categories:
        for test in _list(_get(category, "tests")):
            name = _text(_get(test, "name")) or "?"
            for entry in _list(_get(test, "results")):
                results.append(_result(name, entry))
            summary = _get(test, "test_summary")
            if isinstance(summary, Mapping):
                results.append(_result(name, summary, summary=True))
    return tuple(results)


def judge(text: str | None, exit_code: int | None, gpus: int = 1) -> Verdict:
    """The probe's verdict from the diagnostic's output (None: none written) and exit status
    (None: unknown), for a pod given `gpus` GPUs."""
    if text is None or not text.strip():
        return Verdict(False, f"no diagnostic report (exit status {_status(exit_code)})")
    try:
        results = parse(text)
    except ReportError as exc:
        return Verdict(False, f"{exc} (exit status {_status(exit_code)})")
    bad = [r for r in results if r.status not in (PASS, SKIP)]
    if bad:
        return Verdict(False, "failed: " + "; ".join(_describe(r) for r in _first_per_test(bad)))
    if exit_code != 0:
        # dcgmi exits non-zero when the diagnostic reported an error; a report that shows none
        # is one this module misread, or a diagnostic cut short: neither releases a card.
        return Verdict(False, f"exit status {_status(exit_code)} with no failed test in the report")
    on_gpu = [r for r in results if r.gpu is not None]
    seen = sorted({r.gpu for r in on_gpu if r.gpu is not None})
    if len(seen) > gpus:
        return Verdict(False, f"results for GPUs {seen}: more than the {gpus} the pod was given")
    ran = [r for r in on_gpu if r.status == PASS]
    if not ran:
        return Verdict(False, "no test ran on a GPU (every result skipped or none)")
    tests = sorted({r.test for r in ran})
    return Verdict(True, f"passed on GPU {','.join(map(str, seen))}: {', '.join(tests)}")


# ----------------------------------------------------------------------------- reading


def _result(test: str, entry: Any, summary: bool = False) -> Result:
    if not isinstance(entry, Mapping):
        return Result(test, f"unreadable result {entry!r}", None)
    status = _text(entry.get("status")) or "no status"
    messages = tuple(_text(_get(w, "warning")) or _text(w) for w in _list(entry.get("warnings")) if w)
    return Result(test, status, None if summary else _gpu(entry), messages)


def _gpu(entry: Mapping[str, Any]) -> int | None:
    """The GPU a result is for: 4.x `entity_group` GPU with `entity_id`, 3.x `gpu_id` (a string)."""
    if "entity_group" in entry or "entity_group_id" in entry:
        if entry.get("entity_group") != GPU_ENTITY_GROUP and entry.get("entity_group_id") != 1:
            return None  # a CPU, an NVSwitch: not a GPU of ours
        return _index(entry.get("entity_id"))
    return _index(entry.get("gpu_id"))


def _index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else json.dumps(value))


def _status(code: int | None) -> str:
    return "unknown" if code is None else str(code)


def _first_per_test(results: list[Result]) -> list[Result]:
    """One line per failed test: its per-GPU result when there is one, else its summary."""
    out: dict[str, Result] = {}
    for r in results:
        if r.test not in out or (out[r.test].gpu is None and r.gpu is not None):
            out[r.test] = r
    return list(out.values())


def _describe(r: Result) -> str:
    where = "" if r.gpu is None else f" on GPU {r.gpu}"
    why = f" ({' / '.join(m for m in r.messages if m)})" if any(r.messages) else ""
    return f"{r.test} {r.status}{where}{why}"
