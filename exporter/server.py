"""The exporter's HTTP endpoints: `/metrics`, `/api/v1/devices`, `/healthz`, `/readyz` (an aiohttp adapter).

This module owns how the exporter's scrape is answered, not what it contains; the wiring any
service shares (probes, gzip negotiation, serving) is `gpuhealth.http`. `/metrics` renders the
snapshot it is handed (`exporter.exposition`) and appends the self metrics of the given
prometheus_client registry. A scrape never calls the Kubernetes API or NVML; it reads the
latest immutable snapshot, so it costs the same whatever the cluster is doing.

Large snapshots (a cluster-mode exporter over tens of thousands of devices) are rendered
and compressed in a worker thread: the render holds the GIL only in short slices and zlib
releases it, so the watch loop on the event loop keeps running during a scrape. Their body
is streamed (chunked) in pieces of about a MiB, each rendered and compressed as the last
one is sent: at 80,000 devices the text is about 86 MiB, and building it whole, joining the
self metrics to it and gzipping it held it two and a half times over during every scrape.
Small snapshots (node mode) are rendered inline in one piece, cheaper than thread hops.
A render that fails before the first piece is a 500; one that fails midway (a bug: the
renderer drops a device that cannot be rendered, never the scrape) aborts the connection,
so the scraper sees a failed scrape, never a partial one.

`GET /api/v1/devices` is the same snapshot as JSON (`exporter.devices_view`): read-only, for
`kubectl gpuhealth devices` through the apiserver's pod proxy; like a scrape it never calls the
API or NVML, and large snapshots are encoded in the worker thread too.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson
import prometheus_client
from aiohttp import web

from exporter import devices_view
from exporter.exposition import metrics_pieces
from exporter.settings import ExporterServerSettings
from exporter.snapshot import Snapshot
from gpuhealth.clock import Clock
from gpuhealth.http import accepts_gzip, add_probes, metrics_headers, metrics_response, start_site

log = logging.getLogger(__name__)

NOT_READY = "the initial list has not completed"


@dataclass(frozen=True)
class _Sources:
    settings: ExporterServerSettings
    snapshot: Callable[[], Snapshot]
    clock: Clock
    registry: prometheus_client.CollectorRegistry


SOURCES = web.AppKey("gpuhealth_exporter_sources", _Sources)


PIECE_BYTES = 1 << 20
"""A streamed body is written in pieces of about this size (after compression, if any)."""


def body_pieces(
    snapshot: Snapshot, now: float, registry: prometheus_client.CollectorRegistry, gzip_level: int | None
) -> Iterator[bytes]:
    """Device metrics, then self metrics, in pieces of about `PIECE_BYTES`; one gzip stream
    over them all when a level is given (compressed as they are rendered, never whole)."""
    compressor = (
        None if gzip_level is None else zlib.compressobj(gzip_level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    )
    pending: list[bytes] = []
    size = 0
    for part in metrics_pieces(snapshot, now):
        out = part if compressor is None else compressor.compress(part)
        if out:
            pending.append(out)
            size += len(out)
        if size >= PIECE_BYTES:
            yield b"".join(pending)
            pending, size = [], 0
    tail = prometheus_client.generate_latest(registry)
    pending.append(tail if compressor is None else compressor.compress(tail) + compressor.flush())
    yield b"".join(pending)


def build_body(
    snapshot: Snapshot, now: float, registry: prometheus_client.CollectorRegistry, gzip_level: int | None
) -> bytes:
    """`body_pieces` joined: the whole body at once (small snapshots)."""
    return b"".join(body_pieces(snapshot, now, registry, gzip_level))


async def _metrics(request: web.Request) -> web.StreamResponse:
    sources = request.app[SOURCES]
    settings = sources.settings
    use_gzip = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    level = settings.gzip_level if use_gzip else None
    loop = asyncio.get_running_loop()
    try:
        snapshot = sources.snapshot()
        now = sources.clock.now()
        if len(snapshot.devices) < settings.offload_min_devices:
            return metrics_response(build_body(snapshot, now, sources.registry, level), gzipped=use_gzip)
        pieces = body_pieces(snapshot, now, sources.registry, level)
        piece = await loop.run_in_executor(None, next, pieces, None)
    except Exception:
        # Per-device problems are handled by the renderer; reaching here is a bug, and the
        # scraper should see a failed scrape (up == 0), not partial data.
        log.exception("rendering /metrics failed")
        return web.Response(status=500, text="rendering metrics failed; see the exporter log\n")
    response = web.StreamResponse(headers=metrics_headers(gzipped=use_gzip))
    await response.prepare(request)
    while piece is not None:
        await response.write(piece)
        try:
            piece = await loop.run_in_executor(None, next, pieces, None)
        except Exception:
            # Too late for a 500: raising makes aiohttp drop the connection before the body's
            # last chunk, which the scraper reads as a failed scrape rather than a short one.
            log.exception("rendering /metrics failed midway; the connection is dropped")
            raise
    await response.write_eof()
    return response


def devices_body(snapshot: Snapshot, now: float) -> bytes:
    return orjson.dumps(devices_view.devices_document(snapshot, now))


async def _devices(request: web.Request) -> web.Response:
    sources = request.app[SOURCES]
    snapshot = sources.snapshot()
    now = sources.clock.now()
    if len(snapshot.devices) >= sources.settings.offload_min_devices:
        body = await asyncio.get_running_loop().run_in_executor(None, devices_body, snapshot, now)
    else:
        body = devices_body(snapshot, now)
    return web.Response(body=body, content_type="application/json")


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
    app.router.add_get(devices_view.PATH, _devices)
    add_probes(app, ready=ready, not_ready=NOT_READY)
    return app


async def start_server(app: web.Application, settings: ExporterServerSettings | None = None) -> web.AppRunner:
    """Serve `app` on the settings' host and port (by default those it was created with).

    Call `await runner.cleanup()` to stop; the bound port (useful with port 0) is in
    `runner.addresses`.
    """
    return await start_site(app, settings or app[SOURCES].settings)
