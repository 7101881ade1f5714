"""A service's HTTP endpoints behind an exporter-toolkit web configuration (`--web.config.file`).

`WebGuard` serves one file (`gpuhealth.webconfig`): TLS from its `tls_server_config` (the pair
rotating underneath as `gpuhealth.tls` serves it), and an aiohttp middleware that asks every
request for one of `basic_auth_users` (bcrypt; a pair that verified once is remembered by its
digest, so a scrape every 15 s costs no bcrypt round), refuses a client certificate without an
allowed SAN, applies `rate_limit` as a token bucket and adds the configured headers. Refusals
get 401, 403 or 429 and are counted by reason (`on_refused`).

As the toolkit does, the file is looked at again on every request (one `stat`): a change of
users, headers, rate limit or certificate files applies to the next request or handshake. Two
changes need a restart, since a served context cannot change them (`gpuhealth.tls`): turning
TLS on or off, and TLS options other than the pair (versions, suites, client verification). A
changed file that is bad, or asks for either, is logged and counted (`on_reload_failed`) and the
previous configuration keeps serving: a broken edit never opens the endpoints.

The kubelet's probes (`open_paths`, `/healthz` and `/readyz`) answer without credentials: they
say only whether the process runs, and a probe cannot carry a password it is not given.
Endpoints that authenticate their callers themselves (`own_auth_paths`: the responder's webhook,
with its bearer token; the scheduler extender, whose caller can present only a client
certificate) skip `basic_auth_users` alone: the rate limit and the client certificate's SANs
(`client_allowed_sans`, with `VerifyClientCertIfGiven` so that the probes need none) hold for
them too.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import bcrypt
from aiohttp import web

from gpuhealth.http import background
from gpuhealth.tls import CertificateError, ReloadingCertificate, TlsOptions, watch_certificate
from gpuhealth.webconfig import RateLimit, TlsServerConfig, WebConfig, WebConfigError, load

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
REFUSAL_REASONS = ("unauthorized", "rate_limited", "client_certificate")
"""The `reason` of a refused request (401, 429, 403)."""
CERTIFICATE_CHECK_SECONDS = 30.0
"""How often the served pair's files are looked at for a rotation (as the responder's own TLS)."""
REALM = "gpuhealth"

_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_VERIFY = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


@dataclass
class _Bucket:
    """The rate limit's token bucket."""

    limit: RateLimit
    tokens: float
    at: float

    def take(self, now: float) -> bool:
        self.tokens = min(self.limit.burst, self.tokens + (now - self.at) / self.limit.interval_seconds)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class WebGuard:
    """One web configuration file, served: its TLS context and its request middleware."""

    def __init__(
        self,
        path: str,
        *,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_reload_failed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        open_paths: Iterable[str] = OPEN_PATHS,
        own_auth_paths: Iterable[str] = (),
    ) -> None:
        """Raises WebConfigError (the line and field) or CertificateError when it cannot serve."""
        self.path = path
        self._on_refused = on_refused
        self._on_reload_failed = on_reload_failed
        self._clock = clock
        self._open = frozenset(open_paths)
        self._own_auth = frozenset(own_auth_paths)
        self._inline = tempfile.TemporaryDirectory(prefix="gpuhealth-web-")
        self._seen = _identity(path)
        self.config = load(path)
        self.certificate: ReloadingCertificate | None = None
        if self.config.tls is not None:
            cert, key, options = self._tls(self.config.tls)
            try:
                self.certificate = ReloadingCertificate(cert, key, options)
            except CertificateError as exc:
                raise WebConfigError(f"{path}: tls_server_config: {exc}") from None
        self._bucket = self._new_bucket(self.config)
        self._verified: set[bytes] = set()

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.certificate.context if self.certificate is not None else None

    def close(self) -> None:
        self._inline.cleanup()

    # ----- the file, looked at again ----------------------------------------------------

    def refresh(self) -> None:
        """Apply the file if it changed since it was last read (a bad change is refused)."""
        seen = _identity(self.path)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            config = load(self.path)
            self._apply(config)
        except (WebConfigError, CertificateError) as exc:
            self._on_reload_failed()
            log.error("web configuration %s not applied, the previous one keeps serving: %s", self.path, exc)
            return
        log.info("web configuration %s applied", self.path)

    def _apply(self, config: WebConfig) -> None:
        before = self.config.tls
        if (before is None) != (config.tls is None):
            raise WebConfigError(f"{self.path}: tls_server_config: turning TLS on or off needs a restart")
        if before is not None and config.tls is not None and self.certificate is not None:
            cert, key, options = self._tls(config.tls)
            if options != self.certificate.options:
                raise WebConfigError(
                    f"{self.path}: tls_server_config: versions, suites or client verification changed: "
                    "they apply at the next restart"
                )
            if (cert, key) != (self.certificate.cert_file, self.certificate.key_file):
                self.certificate.reconfigure(cert, key)
        if config.rate_limit != self.config.rate_limit:
            self._bucket = self._new_bucket(config)
        if config.users != self.config.users:
            self._verified.clear()
        self.config = config

    def _tls(self, tls: TlsServerConfig) -> tuple[str, str, TlsOptions]:
        cert = tls.cert_file or self._write("cert.pem", tls.cert)
        key = tls.key_file or self._write("key.pem", tls.key)
        ca = tls.client_ca_file or (self._write("client-ca.pem", tls.client_ca) if tls.client_ca else "")
        options = TlsOptions(
            minimum=_VERSIONS[tls.min_version],
            maximum=_VERSIONS[tls.max_version],
            ciphers=tls.ciphers,
            verify_clients=_VERIFY[tls.client_auth_type],
            client_ca_file=ca,
        )
        return cert, key, options

    def _write(self, name: str, text: str) -> str:
        """Inline PEM from the file, as a private file the TLS library can load."""
        path = os.path.join(self._inline.name, name)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def _new_bucket(self, config: WebConfig) -> _Bucket | None:
        limit = config.rate_limit
        return _Bucket(limit, float(limit.burst), self._clock()) if limit is not None else None

    # ----- every request ----------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.refresh()
        if request.path not in self._open:
            refused = await self._refusal(request)
            if refused is not None:
                return refused
        response = await handler(request)
        for name, value in self.config.headers.items():
            response.headers[name] = value
        return response

    async def _refusal(self, request: web.Request) -> web.Response | None:
        config = self.config
        if self._bucket is not None and not self._bucket.take(self._clock()):
            return self._refuse("rate_limited", web.HTTPTooManyRequests.status_code, "too many requests")
        sans = config.tls.client_allowed_sans if config.tls is not None else ()
        if sans and not _has_san(request, sans):
            return self._refuse(
                "client_certificate", web.HTTPForbidden.status_code, "client certificate not allowed"
            )
        if (
            config.users
            and request.path not in self._own_auth
            and not await self._authorised(request, config)
        ):
            response = self._refuse("unauthorized", web.HTTPUnauthorized.status_code, "unauthorized")
            response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}"'
            return response
        return None

    def _refuse(self, reason: str, status: int, text: str) -> web.Response:
        self._on_refused(reason)
        return web.Response(status=status, text=text + "\n")

    async def _authorised(self, request: web.Request, config: WebConfig) -> bool:
        given = _basic(request.headers.get("Authorization", ""))
        if given is None:
            return False
        user, password = given
        hashed = config.users.get(user)
        if hashed is None:
            return False
        digest = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        if any(hmac.compare_digest(digest, known) for known in self._verified):
            return True
        ok = await asyncio.to_thread(_bcrypt_matches, password, hashed)
        if ok:
            self._verified.add(digest)
        return ok


def _basic(header: str) -> tuple[str, str] | None:
    """(user, password) of an RFC 7617 `Basic` Authorization header, None for anything else."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        text = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = text.partition(":")
    return (user, password) if colon else None


def _bcrypt_matches(password: str, hashed: str) -> bool:
    try:
        return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
    except ValueError:
        return False


def _has_san(request: web.Request, allowed: tuple[str, ...]) -> bool:
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    if not peer:
        return False
    names = {value for _, value in peer.get("subjectAltName", ())}
    return any(name in names for name in allowed)


def guard_app(
    app: web.Application,
    path: str,
    *,
    on_refused: Callable[[str], None],
    on_reload_failed: Callable[[], None],
    open_paths: Iterable[str] = OPEN_PATHS,
    own_auth_paths: Iterable[str] = (),
) -> WebGuard:
    """Put `app` behind the web configuration at `path` (before the app starts): its middleware,
    its certificate's rotation check. Serve with the returned guard's `ssl_context`. Raises
    WebConfigError (the file, the line, the field) when the file cannot be served."""
    guard = WebGuard(
        path,
        on_refused=on_refused,
        on_reload_failed=on_reload_failed,
        open_paths=open_paths,
        own_auth_paths=own_auth_paths,
    )
    app.middlewares.append(guard.middleware)
    certificate = guard.certificate
    if certificate is not None:
        app.cleanup_ctx.append(
            background(
                "web-config-certificate", lambda: watch_certificate(certificate, CERTIFICATE_CHECK_SECONDS)
            )
        )

    async def close(_app: web.Application) -> None:
        guard.close()

    app.on_cleanup.append(close)
    return guard
