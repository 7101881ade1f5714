"""The probe's verdict from DCGM's diagnostic report (responder.checks.diag, diag_verdict).

Aspects: realistic DCGM 4.x and 3.x reports (written here after the shape `dcgmi diag -j`
prints) pass when every test that ran passed on the pod's one GPU; a Fail (4.x writes a Warn so)
or a 3.x Warn fails, naming the test, the GPU and DCGM's message; a report of only skips, an
empty output, text that is not JSON, a `runtime_error` and a non-zero exit with a clean report
all fail; results on more GPUs than the pod was given fail; for any generated report the verdict
is exactly the rule (property), any text at all is judged without raising (property), and a
failing result added to a passing report always fails it (property); the judge container's
entry reads the folder, prints one line and exits 0 or 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.checks import diag_verdict
from responder.checks.diag import EXIT_FILE, LOG_FILE, REPORT_FILE, ReportError, judge, parse


def v4_result(status: str, gpu: int = 0, warning: str | None = None, code: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
    if warning:
        entry["warnings"] = [{"warning": warning, "error_id": code, "error_category": 3, "error_severity": 2}]
    return entry


def v4_report(tests: dict[str, list[dict[str, Any]]], summaries: dict[str, str] | None = None) -> str:
    """A DCGM 4.x report: each test in its category with its per-entity results and summary."""
    category_of = {"software": "Deployment", "pcie": "Integration", "memory": "Hardware"}
    categories: dict[str, list[dict[str, Any]]] = {}
    for name, results in tests.items():
        summary = (summaries or {}).get(name) or _summary(results)
        test = {"name": name, "results": results, "test_summary": {"status": summary}}
        categories.setdefault(category_of.get(name, "Stress"), []).append(test)
    return json.dumps(
        {
            "DCGM Diagnostic": {
                "test_categories": [{"category": c, "tests": t} for c, t in categories.items()]
            },
            "entity_groups": [
                {
                    "entity_group": "GPU",
                    "entity_group_id": 1,
                    "entities": [{"entity_id": 0, "serial_num": "1652922010843", "device_id": "2330"}],
                }
            ],
            "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"},
        },
        indent=3,
    )


def _summary(results: list[dict[str, Any]]) -> str:
    statuses = {r["status"] for r in results}
    return "Fail" if "Fail" in statuses else "Pass" if "Pass" in statuses else "Skip"


LEVEL2_PASS = v4_report(
    {
        "software": [v4_result("Pass")],
        "pcie": [v4_result("Pass")],
        "memory": [v4_result("Pass")],
        "memory_bandwidth": [v4_result("Skip")],
    }
)

V3_PASS = """{
    "DCGM GPU Diagnostic" : {
        "test_categories" : [
            {"category" : "Deployment", "tests" : [
                {"name" : "Denylist", "results" : [{"status" : "Pass"}]},
                {"name" : "NVML Library", "results" : [{"status" : "Pass"}]},
                {"name" : "Persistence Mode", "results" : [{"status" : "Pass"}]}
            ]},
            {"category" : "Integration", "tests" : [
                {"name" : "PCIe", "results" : [{"gpu_id" : "0", "status" : "Pass"}]}
            ]},
            {"category" : "Hardware", "tests" : [
                {"name" : "GPU Memory", "results" : [{"gpu_id" : "0", "status" : "Pass"}]}
            ]}
        ],
        "version" : "3.3.8"
    }
}"""


def test_a_level_2_report_that_passed_on_the_pods_gpu_passes() -> None:
    verdict = judge(LEVEL2_PASS, 0)
    assert verdict.passed, verdict.reason
    assert verdict.reason == "passed on GPU 0: memory, pcie, software"


def test_a_dcgm_3_report_passes_with_its_gpu_ids_as_strings() -> None:
    verdict = judge(V3_PASS, 0)
    assert verdict.passed and "GPU 0" in verdict.reason


def test_a_failed_test_fails_naming_the_test_gpu_and_dcgms_message() -> None:
    report = v4_report(
        {
            "software": [v4_result("Pass")],
            "memory": [v4_result("Fail", warning="Found 2 memory errors on GPU 0 (DBE)", code=95)],
        }
    )
    verdict = judge(report, 226)
    assert not verdict.passed
    assert verdict.reason == "failed: memory Fail on GPU 0 (Found 2 memory errors on GPU 0 (DBE))"


def test_a_dcgm_3_warn_fails() -> None:
    report = V3_PASS.replace(
        '"gpu_id" : "0", "status" : "Pass"}]}\n            ]},\n            {"category" : "Hardware"',
        '"gpu_id" : "0", "status" : "Warn"}]}\n            ]},\n            {"category" : "Hardware"',
    )
    assert '"Warn"' in report
    verdict = judge(report, 0)
    assert not verdict.passed and verdict.reason.startswith("failed: PCIe Warn on GPU 0")


def test_a_failed_summary_fails_even_when_every_entity_passed() -> None:
    report = v4_report({"pcie": [v4_result("Pass")]}, summaries={"pcie": "Fail"})
    assert not judge(report, 0).passed


@pytest.mark.parametrize(
    ("text", "code", "reason"),
    [
        (None, 255, "no diagnostic report (exit status 255)"),
        ("", None, "no diagnostic report (exit status unknown)"),
        ("Error: unable to establish a connection to the specified host: localhost\n", 255, "not JSON"),
        ("[1, 2]", 0, "expected a JSON object, not list"),
        ('{"other": {}}', 0, "no report"),
        ('{"DCGM Diagnostic": {"version": "4.2.3", "runtime_error": "Unable to connect to the host engine"}}',
         255, "the diagnostic did not run: Unable to connect to the host engine"),
        ('{"DCGM Diagnostic": {"version": "4.2.3"}}', 0, "the report has no test_categories"),
    ],
)  # fmt: skip
def test_no_usable_report_fails(text: str | None, code: int | None, reason: str) -> None:
    verdict = judge(text, code)
    assert not verdict.passed and reason in verdict.reason


def test_only_skips_is_no_evidence_and_fails() -> None:
    report = v4_report({"pcie": [v4_result("Skip")], "memory": [v4_result("Skip")]})
    verdict = judge(report, 0)
    assert not verdict.passed and "no test ran on a GPU" in verdict.reason


def test_a_non_zero_exit_fails_even_with_a_clean_report() -> None:
    verdict = judge(LEVEL2_PASS, 226)
    assert not verdict.passed and "exit status 226" in verdict.reason


def test_results_on_more_gpus_than_the_pod_was_given_fail() -> None:
    report = v4_report({"pcie": [v4_result("Pass", 0), v4_result("Pass", 1)]})
    assert not judge(report, 0).passed
    assert judge(report, 0, gpus=2).passed


def test_a_cpu_entity_is_not_one_of_the_gpus() -> None:
    cpu = {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Pass"}
    report = v4_report({"pcie": [v4_result("Pass", 3)], "cpu_eud": [cpu]})
    assert judge(report, 0).passed


def test_parse_refuses_what_is_not_a_report() -> None:
    with pytest.raises(ReportError):
        parse("not json")


# ----------------------------------------------------------------------------- properties

STATUSES = st.sampled_from(["Pass", "Skip", "Fail", "Warn"])
RESULTS = st.lists(st.tuples(STATUSES, st.integers(0, 2)), min_size=1, max_size=3)
TESTS = st.dictionaries(st.sampled_from(["software", "pcie", "memory", "diagnostic", "pulse_test"]), RESULTS,
                        min_size=1, max_size=5)  # fmt: skip


@given(TESTS, st.sampled_from([0, 0, 0, 1, 226, None]), st.integers(1, 3))
def test_the_verdict_is_exactly_the_rule(
    tests: dict[str, list[tuple[str, int]]], code: int | None, gpus: int
) -> None:
    doc = v4_report({name: [v4_result(s, g) for s, g in rs] for name, rs in tests.items()})
    flat = [(s, g) for rs in tests.values() for s, g in rs]
    expected = (
        code == 0
        and all(s in ("Pass", "Skip") for s, _ in flat)
        and any(s == "Pass" for s, _ in flat)
        and len({g for _, g in flat}) <= gpus
    )
    assert judge(doc, code, gpus).passed is expected


@given(st.one_of(st.none(), st.text(max_size=200)), st.one_of(st.none(), st.integers(-300, 300)))
def test_any_text_is_judged_without_raising(text: str | None, code: int | None) -> None:
    verdict = judge(text, code)
    assert isinstance(verdict.reason, str) and verdict.reason
    assert not verdict.passed  # random text is never a passing report


_JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(_JSONISH)
def test_any_json_under_the_report_key_is_judged_without_raising(body: Any) -> None:
    judge(json.dumps({"DCGM Diagnostic": {"test_categories": body}}), 0)
    judge(json.dumps({"DCGM Diagnostic": {"test_categories": [{"tests": body}]}}), 0)


@given(TESTS, st.sampled_from(["Fail", "Warn"]), st.sampled_from(["software", "pcie", "memory"]))
def test_a_failing_result_always_fails_a_passing_report(
    tests: dict[str, list[tuple[str, int]]], bad: str, where: str
) -> None:
    results = {name: [v4_result("Pass", 0)] for name in tests}
    results.setdefault(where, []).append(v4_result(bad, 0))
    assert not judge(v4_report(results), 0).passed


# ----------------------------------------------------------------------------- the entry


def _folder(tmp_path: Path, report: str | None, code: str | None, log: str | None = None) -> Path:
    if report is not None:
        (tmp_path / REPORT_FILE).write_text(report)
    if code is not None:
        (tmp_path / EXIT_FILE).write_text(code + "\n")
    if log is not None:
        (tmp_path / LOG_FILE).write_text(log)
    return tmp_path


def test_the_entry_prints_one_line_and_exits_0_on_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert diag_verdict.main([str(_folder(tmp_path, LEVEL2_PASS, "0"))]) == 0
    out = capsys.readouterr().out
    assert out == "probe passed: passed on GPU 0: memory, pcie, software\n"


def test_the_entry_exits_1_and_quotes_the_log_when_there_is_no_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, None, "1", "starting nv-hostengine\nno hostengine answered within 60 s\n")
    assert diag_verdict.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "no diagnostic report (exit status 1)" in out and "no hostengine answered within 60 s" in out


def test_the_entry_fails_an_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert diag_verdict.main([str(tmp_path)]) == 1
    assert "exit status unknown" in capsys.readouterr().out
