"""One HTTP request to the apiserver, with the raw response body back.

Why the official client underneath, and not an HTTP client of our own: its configuration
already handles every kubeconfig form (client certificates, exec plugins and token refresh,
in-cluster service accounts), and that is where bugs would hide in a hand-made client. Only
its authentication (`param_serialize`) and its urllib3 pool are used: requests go to the
pool directly with our bytes as the body, unpreloaded, so responses are read as raw bytes
(decoding into the client's models costs about 22x a JSON parse) and a watch streams chunk
by chunk. The client's own request path would re-serialise bodies with `json` and rewrite a
JSON-patch Content-Type whenever the body is not a list.

It is synchronous: services run it in threads. A blocked read ends at once when another
thread closes its response.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import urllib3
from kubernetes.client import ApiClient

from gpuhealth.kube.errors import Unavailable, error_from_response

log = logging.getLogger(__name__)

Params = Sequence[tuple[str, str]]
"""Query parameters, in order (a key may repeat)."""


class Response(Protocol):
    """The body of a 2xx response, read once: whole, or as a stream of chunks."""

    def stream(self) -> Iterator[bytes]: ...

    def read(self) -> bytes: ...

    def close(self) -> None:
        """Safe to call from another thread: ends a blocked read."""
        ...


class Transport(Protocol):
    """Requests to the API server.

    A non-2xx status raises the `ApiError` that `errors.error_from_response` gives for it;
    a failed connection or read raises `Unavailable`.
    """

    def request(
        self,
        method: str,
        path: str,
        params: Params = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: tuple[float, float],
    ) -> Response:
        """`timeout`: (connect, read) in seconds; the read timeout bounds each wait for bytes."""
        ...


class _UrllibResponse:
    """A non-preloaded urllib3 response."""

    def __init__(self, raw: Any, what: str) -> None:
        self._raw = raw
        self._what = what

    def stream(self) -> Iterator[bytes]:
        try:
            # amt=None: with chunked transfer (every watch) each chunk is yielded as it arrives.
            yield from self._raw.stream(amt=None, decode_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{self._what}: reading the response failed: {exc}") from exc

    def read(self) -> bytes:
        try:
            data: bytes = self._raw.read(decode_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{self._what}: reading the response failed: {exc}") from exc
        return data

    def close(self) -> None:
        try:
            # shutdown() (urllib3 >= 2.3) unblocks a read in progress in another thread.
            shutdown = getattr(self._raw, "shutdown", None)
            if shutdown is not None:
                shutdown()
            self._raw.close()
        except Exception:  # closing twice or a dead socket: nothing left to release
            log.debug("closing a response failed", exc_info=True)


class KubeTransport:
    """`Transport` over the official client's ApiClient (its auth, TLS and proxies)."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = api_client
        self._pool = api_client.rest_client.pool_manager
        # One throttling helper: our Backoff. urllib3 would otherwise retry each request
        # three times at once (and log each), hiding the outage from the backoff.
        self._pool.connection_pool_kw["retries"] = False

    def request(
        self,
        method: str,
        path: str,
        params: Params = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: tuple[float, float],
    ) -> Response:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        method, url, headers, _, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(params),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        what = f"{method} {path}"
        try:
            raw = self._pool.request(
                method,
                url,
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{what}: {exc}") from exc
        if not 200 <= raw.status < 300:
            try:
                data = raw.read()
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            finally:
                raw.release_conn()
            raise error_from_response(raw.status, data, raw.headers)
        return _UrllibResponse(raw, what)
