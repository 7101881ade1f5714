"""Serving TLS from a certificate and key that get rotated underneath us (cert-manager).

Shared by both services: the responder's `--tls-cert-file`, and the exporter-toolkit web
configuration of either (`gpuhealth.webconfig`, whose `tls_server_config` gives the versions,
suites and client verification that `TlsOptions` carries).

`ReloadingCertificate` owns the `ssl.SSLContext` the site serves with. `check()` compares the
files' identity (modification time, size, inode: a Secret volume swaps a symlink, so a
rotation shows as a new inode even where the time does not move) with what was loaded, and on
a change loads the pair into a fresh context. New handshakes use the newest good context: the
served context's `sni_callback` hands each connection over to it (OpenSSL calls that callback
for every ClientHello, with or without SNI), so nothing restarts and open connections keep
theirs. A broken new pair (half written, a key that does not match) is logged and the old one
kept; the next check tries again, since cert-manager writes the pair in two steps.

Why not `load_cert_chain` again on the served context: OpenSSL loads the certificate first and
the key second, and a failure between the two leaves the context with the new certificate and
no usable key, so every later handshake would fail.

`watch_certificate` is the background check, as an `http.background` task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass

from gpuhealth import fields

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """The pair could not be loaded at start; the message names the files and the reason."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert_file: str
    """PEM certificate chain (a cert-manager Secret's `tls.crt`)."""
    key_file: str
    """PEM private key (`tls.key`)."""
    reload_check_seconds: float = 30.0
    """How often the files are checked for a rotation. cert-manager renews at two thirds of a
    certificate's life (days, at least an hour): half a minute serves the new one long before
    the old expires, at the cost of two stat calls."""

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise fields.SettingsError(f"TlsSettings.{name} must name a file")
        fields.within(self, "reload_check_seconds", "seconds", 0.01, 86400.0)


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino


@dataclass(frozen=True)
class TlsOptions:
    """What a served context enforces besides its pair (defaults: TLS 1.2 and up, no client check)."""

    minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED
    ciphers: tuple[str, ...] = ()
    """OpenSSL names of the TLS 1.2 suites allowed (empty: OpenSSL's defaults)."""
    verify_clients: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: str = ""


def _context(cert_file: str, key_file: str, options: TlsOptions = TlsOptions()) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = options.minimum
    context.maximum_version = options.maximum
    if options.ciphers:
        context.set_ciphers(":".join(options.ciphers))
    context.load_cert_chain(cert_file, key_file)
    if options.verify_clients != ssl.CERT_NONE:
        context.load_verify_locations(cafile=options.client_ca_file)
        context.verify_mode = options.verify_clients
    return context


class ReloadingCertificate:
    """The served context, and the newest good pair's context handed to new handshakes."""

    def __init__(self, cert_file: str, key_file: str, options: TlsOptions = TlsOptions()) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.options = options
        try:
            seen = self._files()
            self.context = _context(cert_file, key_file, options)
        except (OSError, ssl.SSLError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise CertificateError(f"{cert_file}, {key_file}: cannot load the pair: {reason}") from exc
        self._seen = seen
        self._current = self.context
        self.reloads = 0
        """Rotations picked up (new contexts in use)."""
        self.failures = 0
        """Changed pairs that did not load (the previous one kept)."""
        self.context.sni_callback = self._hand_over

    def _hand_over(self, connection: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        current = self._current
        if current is not self.context:
            connection.context = current
        return None

    def _files(self) -> tuple[tuple[int, int, int], ...]:
        paths = (self.cert_file, self.key_file, self.options.client_ca_file)
        return tuple(_identity(p) for p in paths if p)

    def reconfigure(self, cert_file: str, key_file: str) -> None:
        """Serve this pair from the next handshake on (the web configuration names other files);
        CertificateError, and the previous pair kept, when it does not load. The options stay:
        a handshake handed to a newer context keeps the first one's verification and versions
        (OpenSSL copies them into the connection before the hand-over), so they change only
        with a restart."""
        previous = (self.cert_file, self.key_file)
        self.cert_file, self.key_file = cert_file, key_file
        try:
            seen = self._files()
            context = _context(cert_file, key_file, self.options)
        except (OSError, ssl.SSLError) as exc:
            self.cert_file, self.key_file = previous
            self.failures += 1
            raise CertificateError(f"{cert_file}, {key_file}: cannot load the pair: {exc}") from exc
        self._seen = seen
        self._current = context
        self.reloads += 1

    def check(self) -> bool:
        """Load the pair again if either file changed; True when a new pair is now served."""
        try:
            seen = self._files()
        except OSError as exc:
            # Mid-rotation the files can be missing for a moment: keep serving, look again later.
            log.warning("TLS files unreadable (%s); serving the previous certificate", exc)
            return False
        if seen == self._seen:
            return False
        try:
            context = _context(self.cert_file, self.key_file, self.options)
        except (OSError, ssl.SSLError) as exc:
            self.failures += 1
            log.error(
                "TLS pair %s, %s changed but does not load (%s); serving the previous certificate",
                self.cert_file,
                self.key_file,
                exc,
            )
            # Not remembered as seen: the second half of a rotation changes the files again,
            # and an unchanged broken pair is retried on every check (cheap, and logged).
            return False
        self._seen = seen
        self._current = context
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True


async def watch_certificate(certificate: ReloadingCertificate, every_seconds: float) -> None:
    """Check the pair every `every_seconds` until cancelled (blocking stats off the loop)."""
    while True:
        await asyncio.sleep(every_seconds)
        await asyncio.to_thread(certificate.check)
