"""`dashboards.check.panels_without_data` against a stand-in Prometheus (in-process HTTP).

Aspects covered: range panels are asked with query_range over the given window, instant ones
with query at its end, with the variables substituted; a panel is reported when its query
returns no series, or only NaN samples (0/0); a per-device series whose legend omits the node
is reported; a panel with finite data passes. The real run is test_dashboards_data.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dashboards import sdk
from dashboards.check import panels_without_data


class FakePrometheus:
    """Answers each query from `answers` (expr -> series), recording what it was asked."""

    def __init__(self) -> None:
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.asked: list[tuple[str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                fake.asked.append((url.path, params))
                kind = "vector" if url.path.endswith("/query") else "matrix"
                body = {
                    "status": "success",
                    "data": {"resultType": kind, "result": fake.answers.get(params["query"], [])},
                }
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    thread.join(5)


def document(*queries: sdk.Query) -> dict[str, Any]:
    panels = tuple(sdk.Panel("timeseries", f"panel {i}", "d", "short", (q,)) for i, q in enumerate(queries))
    board = sdk.Dashboard(
        "check-test",
        "t",
        "d",
        (),
        (sdk.QueryVariable("node", "Node", "label_values(up, node)", "n"),),
        (sdk.Row("r", panels),),
    )
    return sdk.build(board)


def matrix(metric: dict[str, str], *values: str) -> dict[str, Any]:
    return {"metric": metric, "values": [[1000 + i, v] for i, v in enumerate(values)]}


def test_an_empty_or_nan_only_panel_is_reported_and_a_finite_one_passes(prometheus: FakePrometheus) -> None:
    prometheus.answers = {
        'a{node="n1"}': [matrix({"node": "n1"}, "0", "1")],
        "b / c": [matrix({}, "NaN", "NaN")],
    }
    doc = document(sdk.Query('a{node="$node"}', "{{node}}"), sdk.Query("b / c"), sdk.Query("missing"))
    problems = panels_without_data(prometheus.url, [doc], {"node": "n1"}, start=1000, end=1060, step=5)
    assert problems == [
        "check-test / panel 1 (A): no data for b / c",
        "check-test / panel 2 (A): no data for missing",
    ]
    path, params = prometheus.asked[0]
    assert path == "/api/v1/query_range"
    assert params == {"query": 'a{node="n1"}', "start": "1000.000", "end": "1060.000", "step": "5"}


def test_an_instant_panel_is_asked_at_the_end_of_the_window(prometheus: FakePrometheus) -> None:
    prometheus.answers = {"topk(1, x)": [{"metric": {"node": "n1"}, "value": [1060, "3"]}]}
    doc = document(sdk.Query("topk(1, x)", "{{node}}", instant=True))
    assert panels_without_data(prometheus.url, [doc], start=1000, end=1060) == []
    assert prometheus.asked == [("/api/v1/query", {"query": "topk(1, x)", "time": "1060.000"})]


def test_a_per_device_series_without_the_node_in_its_legend_is_reported(prometheus: FakePrometheus) -> None:
    prometheus.answers = {"temp": [matrix({"node": "n1", "device": "GPU-0"}, "40")]}
    problems = panels_without_data(
        prometheus.url, [document(sdk.Query("temp", "{{device}}"))], start=1000, end=1060
    )
    assert problems == [
        "check-test / panel 0 (A): per-device series, but the legend '{{device}}' omits {{node}}"
    ]
