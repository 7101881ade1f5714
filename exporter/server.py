"""The exporter's HTTP endpoints: `/metrics`, `/healthz`, `/readyz` (an aiohttp adapter).

This module owns how the exporter's scrape is answered, not what it contains; the wiring any
service shares (probes, gzip negotiation, serving) is `gpuhealth.http`. `/metrics` renders the
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
import logging
from collections.abc import Callable
from dataclasses import dataclass

import prometheus_client
from aiohttp import web

from exporter.exposition import render_metrics
from exporter.settings import ExporterServerSettings
from exporter.snapshot import Snapshot
from gpuhealth.clock import Clock
from gpuhealth.http import accepts_gzip, add_probes, gzip_body, metrics_response, start_site

log = logging.getLogger(__name__)

NOT_READY = "the initial list has not completed"


@dataclass(frozen=True)
class _Sources:
    settings: ExporterServerSettings
    snapshot: Callable[[], Snapshot]
    clock: Clock
    registry: prometheus_client.CollectorRegistry


SOURCES = web.AppKey("gpuhealth_exporter_sources", _Sources)


def build_body(
    snapshot: Snapshot, now: float, registry: prometheus_client.CollectorRegistry, gzip_level: int | None
) -> bytes:
    """Device metrics, then self metrics; gzip-compressed when a level is given."""
    body = render_metrics(snapshot, now) + prometheus_client.generate_latest(registry)
    return body if gzip_level is None else gzip_body(body, gzip_level)


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
    return metrics_response(body, gzipped=use_gzip)


def create_app(
    settings: ExporterServerSettings | None,
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
    `ready` says whether the initial list has completed. `/healthz` and `/readyz` are the
    core's (`gpuhealth.http.add_probes`).
    """
    app = web.Application()
    app[SOURCES] = _Sources(settings or ExporterServerSettings(), snapshot, clock, registry)
    app.router.add_get("/metrics", _metrics)
    add_probes(app, ready=ready, not_ready=NOT_READY)
    return app


async def start_server(app: web.Application, settings: ExporterServerSettings | None = None) -> web.AppRunner:
    """Serve `app` on the settings' host and port (by default those it was created with).

    Call `await runner.cleanup()` to stop; the bound port (useful with port 0) is in
    `runner.addresses`.
    """
    return await start_site(app, settings or app[SOURCES].settings)
