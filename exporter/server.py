"""The exporter's HTTP endpoints: `/metrics`, `/healthz`, `/readyz` (an aiohttp adapter).

This module owns how a scrape is answered, not what it contains: `/metrics` renders the
snapshot it is handed (`exporter.exposition`) and appends the self metrics of the given
prometheus_client registry. A scrape never calls the Kubernetes API or NVML; it reads the
latest immutable snapshot, so it costs the same whatever the cluster is doing.

Large snapshots (a cluster-mode exporter over tens of thousands of devices) are rendered
and compressed in a worker thread: the render holds the GIL only in short slices and zlib
releases it, so the watch loop on the event loop keeps running during a scrape. Small
ones (node mode) are rendered inline, which is cheaper than a thread hop.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import Callable
from dataclasses import dataclass

import prometheus_client
from aiohttp import web

from exporter.exposition import CONTENT_TYPE, render_metrics
from exporter.snapshot import Snapshot
from gpuhealth.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """Where and how the exporter serves HTTP."""

    host: str = "0.0.0.0"
    """Listen address. All interfaces: Prometheus scrapes a DaemonSet pod on its pod IP."""
    port: int = 9842
    """Listen port (0 picks a free one, for tests)."""
    gzip_level: int = 1
    """zlib level (1-9) when the scraper accepts gzip. Level 1 already shrinks the text about
    16x at a quarter of level 6's CPU time (bench/bench_exporter_exposition.py)."""
    offload_min_devices: int = 2_000
    """Render in a worker thread from this many devices up; below it inline (node mode has 8)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if not 1 <= self.gzip_level <= 9:
            raise ValueError(f"gzip_level must be 1-9, got {self.gzip_level}")
        if self.offload_min_devices < 0:
            raise ValueError(f"offload_min_devices must be >= 0, got {self.offload_min_devices}")


@dataclass(frozen=True)
class _Sources:
    settings: ServerSettings
    snapshot: Callable[[], Snapshot]
    clock: Clock
    registry: prometheus_client.CollectorRegistry
    ready: Callable[[], bool]


SOURCES = web.AppKey("gpuhealth_exporter_sources", _Sources)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value allows a gzip body (RFC 9110 section 12.5.3)."""
    gzip_q: float | None = None
    star_q: float | None = None
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0  # a malformed weight does not count as acceptance
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            gzip_q = q
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


def build_body(
    snapshot: Snapshot, now: float, registry: prometheus_client.CollectorRegistry, gzip_level: int | None
) -> bytes:
    """Device metrics, then self metrics; gzip-compressed when a level is given."""
    body = render_metrics(snapshot, now) + prometheus_client.generate_latest(registry)
    if gzip_level is not None:
        # mtime=0: the same metrics give the same bytes, whatever the time of the scrape.
        body = gzip.compress(body, compresslevel=gzip_level, mtime=0)
    return body


async def _metrics(request: web.Request) -> web.Response:
    sources = request.app[SOURCES]
    settings = sources.settings
    use_gzip = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    level = settings.gzip_level if use_gzip else None
    try:
        snapshot = sources.snapshot()
        now = sources.clock.now()
        if len(snapshot.devices) >= settings.offload_min_devices:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(None, build_body, snapshot, now, sources.registry, level)
        else:
            body = build_body(snapshot, now, sources.registry, level)
    except Exception:
        # Per-device problems are handled by the renderer; reaching here is a bug, and the
        # scraper should see a failed scrape (up == 0), not partial data.
        log.exception("rendering /metrics failed")
        return web.Response(status=500, text="rendering metrics failed; see the exporter log\n")
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if use_gzip:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def _healthz(request: web.Request) -> web.Response:
    # The process answers: that is all liveness means here. A stuck watch shows in
    # status age and the self metrics, and restarting the exporter would not fix the API.
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[SOURCES].ready():
        return web.Response(text="ready\n")
    return web.Response(status=503, text="not ready: the initial list has not completed\n")


def create_app(
    settings: ServerSettings | None,
    *,
    snapshot: Callable[[], Snapshot],
    clock: Clock,
    registry: prometheus_client.CollectorRegistry,
    ready: Callable[[], bool],
) -> web.Application:
    """The exporter's aiohttp application.

    `snapshot` returns the latest snapshot (it must be cheap and never block: the observer
    swaps snapshots in, this only reads the current one); `clock` gives the time status
    ages are computed at; `registry` holds the `gpuhealth_exporter_*` self metrics;
    `ready` says whether the initial list has completed.
    """
    app = web.Application()
    app[SOURCES] = _Sources(settings or ServerSettings(), snapshot, clock, registry, ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


async def start_server(app: web.Application, settings: ServerSettings | None = None) -> web.AppRunner:
    """Serve `app` on the settings' host and port; call `await runner.cleanup()` to stop.

    The bound port (useful with port 0) is in `runner.addresses`.
    """
    settings = settings or app[SOURCES].settings
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
