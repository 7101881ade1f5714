"""`gpuhealth backtest` against a real Prometheus 3 serving a backfilled, known history.

Aspects: the history (ALERTS of the shipped alerts, gpu_device_info, gpu_device_allocation_info)
is written as OpenMetrics and turned into TSDB blocks by `promtool tsdb create-blocks-from
openmetrics`; the command reads it over HTTP and reports exactly what that history implies: one
quarantine of the Unhealthy card from its delivery, its pod moved, one restriction for Unknown
and no move for it, a device alert of an unreachable node inhibited, no breaker trip, gpuhealth's
healthy GPU-hours withheld those of its holds outside the card's failure, and node-cordon's those
of the failing card's seven working neighbours while it fired, with both pods of the node
evicted. A window with gpuhealth's metrics but no alert is an empty report; a window without
them, an unreachable URL, a URL that is not Prometheus' API and `--from` after `--to` are one
error line each.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

import pytest

from gpuhealth.kube.meta import parse_rfc3339, rfc3339_seconds
from gpuhealth.testing.loopback import Prometheus, backfill, free_port, serve_tsdb
from gpuhealth_cli.main import main

pytestmark = pytest.mark.integration

STEP = 60.0
"""The shipped rules' evaluation interval: ALERTS has one sample per evaluation."""
NOW = math.floor(time.time() / 3600) * 3600
T0 = NOW - 4 * 3600
"""The history starts 4 h before the current hour (inside every default block range and retention)."""
END = T0 + 3 * 3600
NODES = {"node-a": 8, "node-b": 8}
PODS = {
    ("node-a", "gpu-1"): "ml/train-0",
    ("node-a", "gpu-2"): "ml/train-1",
    ("node-b", "gpu-0"): "web/infer-0",
}
UNHEALTHY = (T0 + 600, T0 + 2400)
"""node-a/gpu-1's GPUDeviceUnhealthy: first and last sample."""
UNKNOWN = (T0 + 3600, T0 + 4200)
"""node-b/gpu-0's GPUDeviceUnknownExpired."""
UNREACHABLE = (T0 + 5400, T0 + 6000)
"""GPUNodeUnreachable of node-b, and an Unhealthy of node-b/gpu-3 inside it (inhibited)."""


def _samples(first: float, last: float) -> Iterator[float]:
    t = first
    while t <= last:
        yield t
        t += STEP


def _history() -> str:
    lines = ["# TYPE ALERTS gauge"]
    alerts = [
        (
            UNHEALTHY,
            'alertname="GPUDeviceUnhealthy",action="quarantine",severity="critical",node="node-a",device="gpu-1"',
        ),
        (
            UNKNOWN,
            'alertname="GPUDeviceUnknownExpired",action="restrict",severity="warning",node="node-b",device="gpu-0"',
        ),
        (UNREACHABLE, 'alertname="GPUNodeUnreachable",action="none",severity="warning",node="node-b"'),
        (
            UNREACHABLE,
            'alertname="GPUDeviceUnhealthy",action="quarantine",severity="critical",node="node-b",device="gpu-3"',
        ),
    ]
    for (first, last), labels in alerts:
        lines += [f'ALERTS{{alertstate="firing",{labels}}} 1 {t:.0f}' for t in _samples(first, last)]
    lines.append("# TYPE gpu_device_info gauge")
    for node, count in NODES.items():
        for i in range(count):
            lines += [
                f'gpu_device_info{{node="{node}",device="gpu-{i}"}} 1 {t:.0f}' for t in _samples(T0, END)
            ]
    lines.append("# TYPE gpu_device_allocation_info gauge")
    for (node, device), pod in PODS.items():
        namespace, name = pod.split("/")
        labels = f'node="{node}",device="{device}",namespace="{namespace}",pod="{name}",container="main"'
        lines += [f"gpu_device_allocation_info{{{labels}}} 1 {t:.0f}" for t in _samples(T0, END)]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("backtest")
    backfill(_history(), workdir / "tsdb")
    with serve_tsdb(workdir, workdir / "tsdb") as server:
        yield server


def _backtest(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["backtest", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _iso(t: float) -> str:
    return rfc3339_seconds(t)


def test_the_report_is_what_the_known_history_implies(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _backtest(
        capsys, "--prometheus-url", prometheus.base_url, "--from", _iso(T0), "--to", _iso(END), "-o", "json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["window"]["gpus"] == 16
    assert report["alerts"]["firings"] == {
        "GPUDeviceUnhealthy": 2,
        "GPUDeviceUnknownExpired": 1,
        "GPUNodeUnreachable": 1,
    }
    assert report["alerts"]["delivered"] == {"GPUDeviceUnhealthy": 1, "GPUDeviceUnknownExpired": 1}
    gh = report["gpuhealth"]
    holds = {(h["node"], h["device"]): h for h in gh["holds"]}
    assert set(holds) == {("node-a", "gpu-1"), ("node-b", "gpu-0")}
    quarantine, restrict = holds[("node-a", "gpu-1")], holds[("node-b", "gpu-0")]
    # Delivered at the first sample (the shipped route's group_wait is 0s) and enforced at once.
    assert (quarantine["action"], quarantine["reason"]) == ("quarantine", "Unhealthy")
    assert parse_rfc3339(quarantine["start"]) == UNHEALTHY[0]
    assert (restrict["action"], restrict["reason"]) == ("restrict", "Unknown")
    assert parse_rfc3339(restrict["start"]) == UNKNOWN[0]
    # The card is released only after its alert resolved (one step after the last sample).
    broken_end = UNHEALTHY[1] + STEP
    assert parse_rfc3339(quarantine["end"]) > broken_end
    assert gh["moves"] == [
        {
            "at": _iso(UNHEALTHY[0]),
            "node": "node-a",
            "device": "gpu-1",
            "reason": "Unhealthy",
            "pods": ["ml/train-0"],
        }
    ]
    assert gh["breakerTrips"] == 0
    withheld = (restrict["seconds"] + parse_rfc3339(quarantine["end"]) - broken_end) / 3600
    assert gh["healthyGpuHoursWithheld"] == pytest.approx(withheld, abs=1e-3)
    nc = report["nodeCordon"]
    assert nc["cordons"] == [
        {
            "node": "node-a",
            "start": _iso(UNHEALTHY[0]),
            "end": _iso(broken_end),
            "seconds": broken_end - UNHEALTHY[0],
            "gpus": 8,
            "pods": ["ml/train-0", "ml/train-1"],
        }
    ]
    assert nc["healthyGpuHoursWithheld"] == pytest.approx(7 * (broken_end - UNHEALTHY[0]) / 3600, abs=1e-3)
    assert nc["podsEvicted"] == 2


def test_the_table_names_the_hold_and_the_moved_pod(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _backtest(
        capsys, "--prometheus-url", prometheus.base_url, "--from", _iso(T0), "--to", _iso(END)
    )
    assert code == 0, err
    assert "ml/train-0" in out and "Unhealthy" in out and "NODE-CORDON" in out


def test_long_windows_are_read_in_pages_with_progress(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    # 10 days at one point a minute is 14,400 points: two pages of the ALERTS query.
    code, out, err = _backtest(
        capsys,
        "--prometheus-url",
        prometheus.base_url,
        "--from",
        _iso(END - 10 * 86400),
        "--to",
        _iso(END),
        "-o",
        "json",
    )
    assert code == 0, err
    assert "reading ALERTS: page 1/2" in err and "reading ALERTS: page 2/2" in err
    assert json.loads(out)["alerts"]["delivered"] == {"GPUDeviceUnhealthy": 1, "GPUDeviceUnknownExpired": 1}


def test_a_window_with_metrics_but_no_alert_is_an_empty_report(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _backtest(
        capsys,
        "--prometheus-url",
        prometheus.base_url,
        "--from",
        _iso(T0 + 6600),
        "--to",
        _iso(END),
        "-o",
        "json",
    )
    assert code == 0, err
    assert "no gpuhealth alert fired in the window" in err
    report = json.loads(out)
    assert report["gpuhealth"]["holds"] == [] and report["nodeCordon"]["cordons"] == []


def test_a_window_without_gpuhealth_metrics_is_one_error_line(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _backtest(
        capsys,
        "--prometheus-url",
        prometheus.base_url,
        "--from",
        _iso(T0 - 2 * 86400),
        "--to",
        _iso(T0 - 86400),
    )
    assert code == 1 and out == ""
    assert err.startswith("gpuhealth backtest: error: ") and "holds no gpuhealth metrics" in err
    assert err.count("\n") == 1


def test_an_unreachable_url_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = _backtest(capsys, "--prometheus-url", url, "--from=-1h")
    assert code == 1
    assert (
        err.startswith(f"gpuhealth backtest: error: cannot reach Prometheus at {url}")
        and err.count("\n") == 1
    )


def test_from_after_to_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _backtest(capsys, "--prometheus-url", "http://127.0.0.1:1", "--from", "now", "--to=-1h")
    assert code == 2 and "--from must be before --to" in err and err.count("\n") == 1


def test_a_url_that_is_not_prometheus_api_is_one_error_line(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{prometheus.base_url}/not-prometheus"
    code, _, err = _backtest(capsys, "--prometheus-url", url, "--from=-1h")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"gpuhealth backtest: error: {url} answered HTTP 404") and "--prometheus-url" in err
