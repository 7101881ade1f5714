"""Real Prometheus and Alertmanager servers on loopback, for the end-to-end tests and the demo.

It starts the pinned upstream builds (`prometheus` 3.x, `alertmanager` 0.35; `upstream.py` finds
them, `tools/upstream/build.py` builds them) as child processes on
127.0.0.1 with temporary storage, waits until they are ready, and talks to their HTTP APIs
with the standard library (or, `backfill` and `serve_tsdb`, serves a history written with
promtool); `WebhookRecorder` stands in for Alertmanager's receivers.
`wait_until` is the one polling helper of the tests: every wait has a deadline and says
what it was waiting for when it gives up, with the tail of the server's log.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuhealth.loopback_ports import free_port
from gpuhealth.testing import upstream

T = TypeVar("T")

PROMETHEUS_BINARY = "prometheus"
ALERTMANAGER_BINARY = "alertmanager"


class LoopbackError(RuntimeError):
    """A server could not be started, or what was awaited did not happen in time."""


class ProcessExited(LoopbackError):
    """A server exited while we waited for it: waiting longer cannot help."""


def http_ok(url: str, *, timeout: float = 2.0) -> bool:
    """True when GET `url` answers 200. An `https://` loopback URL is asked without checking the
    certificate: a readiness check, as the kubelet's HTTPS probes do not check it either."""
    context = ssl._create_unverified_context() if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def http_json(url: str, body: Any = None, *, timeout: float = 5.0) -> Any:
    """GET (or POST `body` as JSON) and decode the JSON answer; raises LoopbackError on failure."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except (OSError, urllib.error.URLError) as exc:
        raise LoopbackError(f"{url}: {exc}") from exc
    return json.loads(raw) if raw else None


def wait_until(
    what: str, probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.2
) -> T:
    """Poll `probe` until it returns something truthy, and return that; LoopbackError after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
        except ProcessExited:
            raise
        except LoopbackError as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise LoopbackError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


@contextmanager
def child_process(argv: Sequence[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` with output to `log_path`; SIGTERM (then SIGKILL) it on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _alive(proc: subprocess.Popen[bytes], name: str) -> bool:
    if proc.poll() is not None:
        raise ProcessExited(f"{name} exited with status {proc.returncode}")
    return True


def log_tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def require_binary(name: str) -> str:
    """The path of a pinned upstream binary (`prometheus`, `promtool`, `alertmanager`, `amtool`)."""
    try:
        return upstream.binary(name)
    except upstream.UpstreamMissing as exc:
        raise LoopbackError(str(exc)) from None


@contextmanager
def _server(
    name: str, argv_for_port: Callable[[int], list[str]], workdir: Path, start_timeout: float
) -> Iterator[tuple[str, Path]]:
    """Start a Prometheus-family server on a free loopback port; yield its URL and log once `/-/ready`."""
    port = free_port()
    log_path = workdir / f"{name}.log"
    base_url = f"http://127.0.0.1:{port}"
    with child_process(argv_for_port(port), log_path) as proc:
        try:
            wait_until(
                f"{name} to become ready",
                lambda: _alive(proc, name) and http_ok(f"{base_url}/-/ready"),
                timeout=start_timeout,
            )
        except LoopbackError as exc:
            raise LoopbackError(f"{exc}\n--- {name} log ---\n{log_tail(log_path)}") from exc
        yield base_url, log_path


@dataclass
class ScrapeJob:
    name: str
    targets: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    """The targets' labels; `__metrics_path__` among them gives these targets a path of their own
    (Prometheus takes it over the job's), as the demo does for each node's dcgm-exporter."""
    metrics_path: str = "/metrics"
    """The path scraped on every target (one per job name: the job's first ScrapeJob sets it)."""
    honor_labels: bool = False
    """The scraped series' own labels win over the target's (`honor_labels`, on for the whole job
    when any of its ScrapeJobs asks): a target serving several exporters' series, each with its
    own `instance`, stores them as those exporters' targets would."""
    params: dict[str, list[str]] = field(default_factory=dict)
    """URL parameters of every scrape of the job (the job's first ScrapeJob sets them): a
    federating job's `match[]` selectors."""
    fields: dict[str, Any] = field(default_factory=dict)
    """More of the job's scrape config (`scheme`, `tls_config`, `basic_auth`...), as a shipped
    scrape snippet gives them (the job's first ScrapeJob sets them)."""


def _static_configs(jobs: Sequence[ScrapeJob]) -> dict[str, list[dict[str, Any]]]:
    """Target groups by job name: several ScrapeJobs of one name (one per node) make one job."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        by_name.setdefault(job.name, []).append({"targets": job.targets, "labels": job.labels})
    return by_name


def _metrics_path(jobs: Sequence[ScrapeJob], name: str) -> str:
    paths = {job.metrics_path for job in jobs if job.name == name}
    if len(paths) > 1:
        raise ValueError(f"scrape job {name!r}: one metrics_path per job, got {sorted(paths)}")
    return paths.pop()


def _params(jobs: Sequence[ScrapeJob], name: str) -> dict[str, Any]:
    params = next(job.params for job in jobs if job.name == name)
    return {"params": params} if params else {}


class Prometheus:
    """A running Prometheus: query it and read its alerts."""

    def __init__(self, base_url: str, log_path: Path) -> None:
        self.base_url = base_url
        self.log_path = log_path

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = http_json(f"{self.base_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single sample `expr` returns, or None when it returns no or several samples."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def alerts(self, state: str | None = "firing") -> list[dict[str, Any]]:
        answer = http_json(f"{self.base_url}/api/v1/alerts")
        alerts: list[dict[str, Any]] = answer["data"]["alerts"]
        return [a for a in alerts if state is None or a["state"] == state]

    def rule_groups(self) -> list[dict[str, Any]]:
        answer = http_json(f"{self.base_url}/api/v1/rules")
        groups: list[dict[str, Any]] = answer["data"]["groups"]
        return groups

    def evaluated_since(self, since: float) -> bool:
        """True once every rule group has been evaluated after `since` (Unix seconds).

        The evidence a test needs before it asserts that no alert is pending or firing:
        without it, "no alert" may only mean "not evaluated yet".
        """
        groups = self.rule_groups()
        return bool(groups) and all(
            datetime.fromisoformat(g["lastEvaluation"]).timestamp() > since for g in groups
        )

    def alertmanagers_discovered(self, count: int = 1) -> bool:
        """Whether Prometheus sends to at least `count` Alertmanagers."""
        answer = http_json(f"{self.base_url}/api/v1/alertmanagers")
        return len(answer["data"]["activeAlertmanagers"]) >= count


@contextmanager
def run_prometheus(
    workdir: Path,
    jobs: Sequence[ScrapeJob],
    *,
    rule_files: Sequence[Path] = (),
    alertmanager_url: str | Sequence[str] | None = None,
    interval: str = "1s",
    external_labels: Mapping[str, str] | None = None,
    start_timeout: float = 30.0,
) -> Iterator[Prometheus]:
    """Prometheus scraping `jobs` every `interval`, evaluating `rule_files`, alerting `alertmanager_url`
    (one URL, or several: an HA pair gets every alert from Prometheus, as it should), with
    `external_labels` (a cluster's Prometheus names its cluster so: federation adds them).

    Alerts are re-sent every second (`--rules.alert.resend-delay=1s`) and, when an
    Alertmanager is given, this returns only once Prometheus has discovered them all: alerts
    evaluated before that are dropped.
    """
    binary = require_binary(PROMETHEUS_BINARY)
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval}
        | ({"external_labels": dict(external_labels)} if external_labels else {}),
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": name, "metrics_path": _metrics_path(jobs, name), "static_configs": groups}
            | ({"honor_labels": True} if any(j.honor_labels for j in jobs if j.name == name) else {})
            | _params(jobs, name)
            | next(j.fields for j in jobs if j.name == name)
            for name, groups in _static_configs(jobs).items()
        ],
    }
    urls = [alertmanager_url] if isinstance(alertmanager_url, str) else list(alertmanager_url or ())
    if urls:
        targets = [urllib.parse.urlsplit(url).netloc for url in urls]
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    with _server(
        PROMETHEUS_BINARY,
        lambda port: [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--rules.alert.resend-delay=1s",
        ],
        workdir,
        start_timeout,
    ) as (base_url, log_path):
        prometheus = Prometheus(base_url, log_path)
        if urls:
            try:
                wait_until(
                    "Prometheus to discover its Alertmanager",
                    lambda: prometheus.alertmanagers_discovered(len(urls)),
                    timeout=start_timeout,
                )
            except LoopbackError as exc:
                raise LoopbackError(f"{exc}\n--- prometheus log ---\n{log_tail(log_path)}") from exc
        yield prometheus


def backfill(openmetrics: str, tsdb: Path) -> None:
    """Write `openmetrics` (text with timestamps, ending in `# EOF`) into TSDB blocks under
    `tsdb` with `promtool tsdb create-blocks-from openmetrics`: history a Prometheus started on
    `tsdb` then serves as its own."""
    promtool = require_binary("promtool")
    tsdb.mkdir(parents=True, exist_ok=True)
    source = tsdb.parent / "backfill.om.txt"
    source.write_text(openmetrics)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise LoopbackError(f"promtool could not backfill {source}: {done.stderr.strip()[-2000:]}")


@contextmanager
def serve_tsdb(
    workdir: Path, tsdb: Path, *, retention: str = "3650d", start_timeout: float = 30.0
) -> Iterator[Prometheus]:
    """Prometheus serving the history in `tsdb` (see `backfill`), scraping nothing: a read-only
    stand-in for a fleet's Prometheus. The long retention keeps old backfilled blocks."""
    binary = require_binary(PROMETHEUS_BINARY)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump({"global": {"evaluation_interval": "1m"}, "scrape_configs": []}))
    with _server(
        PROMETHEUS_BINARY,
        lambda port: [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tsdb}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        workdir,
        start_timeout,
    ) as (base_url, log_path):
        yield Prometheus(base_url, log_path)


class Alertmanager:
    """A running Alertmanager: read its alerts (with inhibition and silencing state)."""

    def __init__(self, base_url: str, log_path: Path) -> None:
        self.base_url = base_url
        self.log_path = log_path

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = http_json(f"{self.base_url}/api/v2/alerts")
        return [a for a in answer if all(a["labels"].get(k) == v for k, v in labels.items())]

    def post(self, alerts: list[dict[str, Any]]) -> None:
        http_json(f"{self.base_url}/api/v2/alerts", alerts)

    def fire(self, *label_sets: dict[str, str], lasting: float = 3600.0) -> None:
        """Post one firing alert per label set, in order, as Prometheus would send it."""
        now = datetime.now(UTC)
        self.post(
            [
                {
                    "labels": labels,
                    "annotations": {"summary": "posted by a test"},
                    "startsAt": now.isoformat(),
                    "endsAt": (now + timedelta(seconds=lasting)).isoformat(),
                }
                for labels in label_sets
            ]
        )


def inhibited(alert: dict[str, Any]) -> bool:
    """Whether Alertmanager (API v2) lists `alert` as inhibited by another."""
    return bool(alert["status"]["inhibitedBy"])


@contextmanager
def run_alertmanager(
    workdir: Path, config_path: Path, *, start_timeout: float = 30.0
) -> Iterator[Alertmanager]:
    """A single Alertmanager (no gossip) with `config_path`, storage under `workdir`."""
    binary = require_binary(ALERTMANAGER_BINARY)
    workdir.mkdir(parents=True, exist_ok=True)
    with _server(
        ALERTMANAGER_BINARY,
        lambda port: [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        workdir,
        start_timeout,
    ) as (base_url, log_path):
        yield Alertmanager(base_url, log_path)


class LoopbackHttpServer:
    """A threading HTTP server on 127.0.0.1 (a free port) served from a daemon thread while
    used as a context manager: the recorder's and the demo's webhook front's."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def __enter__(self) -> LoopbackHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class Delivery:
    """One webhook notification as Alertmanager delivered it."""

    path: str
    authorization: str
    body: dict[str, Any]
    received_at: float
    """Monotonic seconds when it arrived."""


class WebhookRecorder:
    """An HTTP server on loopback that records every Alertmanager webhook it receives.

    It stands in for receivers that are not part of the run (on-call and tenants in the demo;
    any receiver in the rules' tests). Use it as a context manager.
    """

    def __init__(self) -> None:
        self._deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = None
                if not isinstance(body, dict):
                    # Readers of `deliveries()` may rely on a JSON object, as Alertmanager sends.
                    self.send_response(400)
                    self.end_headers()
                    return
                recorder._record(
                    Delivery(self.path, self.headers.get("Authorization", ""), body, time.monotonic())
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: deliveries are read through `alerts()`, not the log."""

        self._http = LoopbackHttpServer(Handler, "webhooks")
        self.url = self._http.url

    def _record(self, delivery: Delivery) -> None:
        with self._lock:
            self._deliveries.append(delivery)

    def __enter__(self) -> WebhookRecorder:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(*exc)

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def alerts(self, path: str, **labels: str) -> list[tuple[Delivery, dict[str, Any]]]:
        """(delivery, alert) pairs delivered to `path` whose labels include `labels`."""
        return [
            (d, alert)
            for d in self.deliveries()
            if d.path == path
            for alert in d.body.get("alerts", [])
            if all(alert["labels"].get(k) == v for k, v in labels.items())
        ]
