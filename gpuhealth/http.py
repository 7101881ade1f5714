"""HTTP scaffolding every gpuhealth service stands on (an aiohttp adapter).

This module owns what is the same for any service, whatever it serves:

- the listen-address grammar (`parse_listen`): `HOST:PORT`, `:PORT` for all interfaces,
  `[IPv6]:PORT`, port 0-65535 (0 picks a free one), with one error text;
- `ServerSettings`: where a service listens and how it compresses `/metrics`;
- `/healthz` and `/readyz` (`add_probes`), and `/metrics` for a prometheus_client registry
  with gzip negotiated from Accept-Encoding (`add_metrics`; a service with a faster body of its
  own, like the exporter, uses `accepts_gzip` with `metrics_response` or, streaming it in
  pieces, `metrics_headers`);
- background work as `app.cleanup_ctx` entries (`background`): a task started with the app,
  cancelled and awaited when it stops; a task that dies stops the service with the error;
- `serve`: start a site (HTTPS when given an `ssl.SSLContext`) and run until SIGINT/SIGTERM,
  cancellation or a dead background task (`stop_on_signals` for a service that starts its own
  site).

State shared through the app uses typed `web.AppKey`s (`PROBES`, `REGISTRY`, `SERVER`, `STOP`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import logging
import os
import re
import signal
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import prometheus_client
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from gpuhealth import fields

log = logging.getLogger(__name__)

ALL_INTERFACES = "0.0.0.0"
"""The host `:PORT` stands for: Prometheus scrapes a pod on its pod IP, whatever it is."""

LISTEN_GRAMMAR = "expected HOST:PORT, :PORT (all interfaces) or [IPv6]:PORT with a port 0-65535"

METRICS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""Prometheus text format 0.0.4: what Prometheus 2.x negotiates and what we render."""

_LISTEN = re.compile(r"(?:\[(?P<v6>[^\[\]]*)\]|(?P<host>[^\[\]:]*)):(?P<port>[0-9]{1,5})")
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]+")


class ListenError(ValueError):
    """Not a listen address; the message names the value, the reason and the grammar."""


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[IPv6]:PORT` as (host, port).

    Ports are 0-65535 (0: any free port); an IPv6 address needs its brackets, since its own
    colons would make the port ambiguous. Raises ListenError saying what is wrong.
    """
    match = _LISTEN.fullmatch(value)
    if match is None:
        raise ListenError(f"{value!r}: {_listen_reason(value)}; {LISTEN_GRAMMAR}")
    port = int(match["port"])
    if port > 65535:
        raise ListenError(f"{value!r}: port {port} is out of range; {LISTEN_GRAMMAR}")
    if match["v6"] is not None:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            reason = f"{match['v6']!r} is not an IPv6 address"
            raise ListenError(f"{value!r}: {reason}; {LISTEN_GRAMMAR}") from None
        return match["v6"], port
    host = match["host"]
    if not host:
        return ALL_INTERFACES, port
    if not _HOSTNAME.fullmatch(host) or (host.replace(".", "").isdigit() and not _is_ipv4(host)):
        raise ListenError(f"{value!r}: {host!r} is not a host name or IPv4 address; {LISTEN_GRAMMAR}")
    return host, port


def _listen_reason(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep:
        return "no port"
    if ":" in host and not host.startswith("["):
        return "an IPv6 address goes in brackets, e.g. [::1]:9842"
    if not port.isascii() or not port.isdigit():
        return f"the port {port!r} is not a number"
    if len(port) > 5:
        return f"port {port} is out of range"
    return "brackets go around an IPv6 address and nothing else"


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def format_listen(host: str, port: int) -> str:
    """(host, port) written back in the grammar: `[::1]:80` for IPv6, `host:80` otherwise."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ----- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    """Where a service listens and how it answers scrapes; each service's tree sets its port."""

    host: str = ALL_INTERFACES
    """Listen address. All interfaces: Prometheus scrapes a pod on its pod IP."""
    port: int = 0
    """Listen port; 0 picks a free one (tests). Each service's settings give its own default."""
    gzip_level: int = 1
    """zlib level (1-9) when the scraper accepts gzip. Level 1 already shrinks exposition text
    about 16x at a quarter of level 6's CPU time (bench/bench_exporter_exposition.py)."""
    web_config_file: str = ""
    """An exporter-toolkit web configuration (`--web.config.file`: TLS, basic auth, rate limit,
    headers; `gpuhealth.web_guard`); empty: plain HTTP, open."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise fields.SettingsError(f"{type(self).__name__}.host must be a host name or address")
        fields.within(self, "port", "(a TCP port)", 0, 65535, whole=True)
        fields.within(self, "gzip_level", "(a zlib level)", 1, 9, whole=True)

    @property
    def listen(self) -> str:
        """The address in the `--listen` grammar, for messages."""
        return format_listen(self.host, self.port)


# ----- probes and metrics --------------------------------------------------------------


@dataclass(frozen=True)
class Probes:
    """What `/readyz` asks: a cheap, non-blocking callback, and what it says while false."""

    ready: Callable[[], bool]
    not_ready: str


PROBES = web.AppKey("gpuhealth_probes", Probes)
REGISTRY = web.AppKey("gpuhealth_registry", prometheus_client.CollectorRegistry)
SERVER = web.AppKey("gpuhealth_server_settings", ServerSettings)


def add_probes(app: web.Application, *, ready: Callable[[], bool], not_ready: str) -> None:
    """`/healthz` (the process answers) and `/readyz` (200 when `ready()`, else 503 `not_ready`)."""
    app[PROBES] = Probes(ready, not_ready)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)


async def _healthz(request: web.Request) -> web.Response:
    # The process answers: that is all liveness means here. A stuck dependency shows in the
    # service's own metrics, and a restart would not fix the API server or the network.
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    probes = request.app[PROBES]
    if probes.ready():
        return web.Response(text="ready\n")
    return web.Response(status=503, text=f"not ready: {probes.not_ready}\n")


def add_metrics(
    app: web.Application, registry: prometheus_client.CollectorRegistry, settings: ServerSettings
) -> None:
    """`/metrics`: the registry in text format, gzip-compressed when the scraper accepts it."""
    app[REGISTRY] = registry
    app[SERVER] = settings
    app.router.add_get("/metrics", _metrics)


async def _metrics(request: web.Request) -> web.Response:
    gzipped = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body = prometheus_client.generate_latest(request.app[REGISTRY])
    if gzipped:
        body = gzip_body(body, request.app[SERVER].gzip_level)
    return metrics_response(body, gzipped=gzipped)


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


def gzip_body(body: bytes, level: int) -> bytes:
    # mtime=0: the same metrics give the same bytes, whatever the time of the scrape.
    return gzip.compress(body, compresslevel=level, mtime=0)


def metrics_headers(*, gzipped: bool) -> dict[str, str]:
    """The headers of a `/metrics` answer (also for one streamed in pieces)."""
    headers = {"Content-Type": METRICS_CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    return headers


def metrics_response(body: bytes, *, gzipped: bool) -> web.Response:
    """A `/metrics` answer; `body` is already gzip-compressed when `gzipped`."""
    return web.Response(body=body, headers=metrics_headers(gzipped=gzipped))


# ----- background work -----------------------------------------------------------------


class BackgroundTaskFailed(RuntimeError):
    """A background task ended while its service was running; the cause is chained."""


STOP: web.AppKey[asyncio.Future[None]] = web.AppKey("gpuhealth_stop")
"""Completed to stop a service `serve` runs; a dying background task sets its exception."""


def background(
    name: str, work: Callable[[], Coroutine[Any, Any, None]]
) -> Callable[[web.Application], AbstractAsyncContextManager[None]]:
    """An `app.cleanup_ctx` entry running `work()` as a task for as long as the app runs.

    The task starts with the app and is cancelled and awaited when the app cleans up. Work
    that ends by itself meanwhile (an exception, or a return: background work runs until
    cancelled) is logged with its traceback and stops the service `serve` runs, which then
    raises BackgroundTaskFailed.
    """

    @contextlib.asynccontextmanager
    async def running(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(work(), name=f"gpuhealth-{name}")

        def ended(task: asyncio.Task[None]) -> None:
            cause = None if task.cancelled() else task.exception()
            how = f"failed: {cause!r}" if cause is not None else "ended"
            log.error("background task %s %s", name, how, exc_info=cause)
            stop = app.get(STOP)
            if stop is not None and not stop.done():
                error = BackgroundTaskFailed(f"background task {name} {how}")
                error.__cause__ = cause
                stop.set_exception(error)

        task.add_done_callback(ended)
        yield
        task.remove_done_callback(ended)
        if task.done():
            return  # already reported by `ended`
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the cleanup itself is being cancelled
        except Exception:
            log.exception("background task %s failed while it was being cancelled", name)

    return running


# ----- serving -------------------------------------------------------------------------


class ListenFailed(Exception):
    """The site could not bind its address (in use, not local, no permission)."""


async def start_site(
    app: web.Application, settings: ServerSettings, *, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Start `app` (its cleanup contexts included) and serve it on the settings' address.

    With `ssl_context` the site serves HTTPS only (whoever owns the context may rotate what it
    serves: the context object is kept, not copied).

    Call `await runner.cleanup()` to stop; the bound port (useful with port 0) is in
    `runner.addresses`. Raises ListenFailed, with everything started stopped again, when the
    address cannot be bound.
    """
    if STOP not in app:
        app[STOP] = asyncio.get_running_loop().create_future()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    try:
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            # aiohttp rewords the OSError; the errno's own text is what a person recognises.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenFailed(f"cannot listen on {settings.listen}: {reason}") from exc
    except BaseException:
        await runner.cleanup()
        raise
    return runner


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Future[None]) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM complete `stop` instead of killing the process.

    Enter it before starting anything, so a signal that arrives during start-up still stops
    the service cleanly once it is up.
    """
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, complete, stop)
        except (NotImplementedError, RuntimeError, ValueError):
            continue  # not the main thread (or no signals here): cancellation still stops us
        installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def complete(stop: asyncio.Future[None]) -> None:
    """Complete `stop` unless it already is: signals and timers may both ask."""
    if not stop.done():
        stop.set_result(None)


async def serve(
    app: web.Application,
    settings: ServerSettings,
    *,
    on_started: Callable[[tuple[str, int]], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve `app` until SIGINT/SIGTERM or cancellation, then stop it and its background work.

    `on_started` receives the bound (host, port) once the site listens; with `ssl_context` it
    serves HTTPS. Raises ListenFailed when the address cannot be bound, BackgroundTaskFailed
    when a background task died.
    """
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    app[STOP] = stop
    with stop_on_signals(stop):
        runner = await start_site(app, settings, ssl_context=ssl_context)
        try:
            if on_started is not None:
                host, port = runner.addresses[0][:2]
                on_started((host, port))
            await stop
        finally:
            await runner.cleanup()
