"""A `Transport` that answers some requests with API faults, for tests.

It wraps a real transport (a `KubeTransport` to the simulated apiserver) and, by a seeded
random schedule or an explicit script, answers a request with a fault instead of (or after)
passing it through. The hard case is a write whose response is lost after it landed
(`Fault.LOST` and `Fault.CONFLICT_AFTER`): the caller sees an error for a change that is in
the API, so only an idempotent caller stays correct. Every injection is recorded.
"""

from __future__ import annotations

import enum
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import orjson

from gpuhealth.kube.errors import ApiError, Unavailable, error_from_response
from gpuhealth.kube.transport import Params, Response, Transport

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Fault(enum.Enum):
    SERVER_ERROR = "500"
    UNAVAILABLE = "503"
    CONFLICT = "409-before"
    """409 without passing the request through: nothing landed."""
    CONFLICT_AFTER = "409-after"
    """The write landed, then the caller is told 409 (a lost response, then a retry's conflict)."""
    THROTTLED = "429"
    """429 with Retry-After: 1, nothing landed."""
    TIMEOUT = "timeout"
    """A read timeout before the server answered; nothing landed."""
    LOST = "lost-response"
    """The write landed, then the read timed out: the caller sees `Unavailable`."""
    DROP_WATCH = "drop-watch"
    """A watch stream breaks after its first chunk."""
    GONE = "410"
    """A watch refused at once: its resourceVersion expired (the reflector lists again)."""


WATCH_ONLY = frozenset({Fault.DROP_WATCH, Fault.GONE})

AFTER = frozenset({Fault.CONFLICT_AFTER, Fault.LOST})
"""Faults that pass the request through first (only meaningful for writes)."""


@dataclass(frozen=True)
class Injection:
    method: str
    path: str
    fault: Fault


@dataclass(frozen=True)
class Landed:
    method: str
    path: str
    params: tuple[tuple[str, str], ...]
    body: bytes | None


Matcher = Callable[[str, str, Params], bool]


def _status(code: int, reason: str, message: str) -> bytes:
    return orjson.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }
    )


def _error(fault: Fault, what: str) -> ApiError:
    if fault is Fault.SERVER_ERROR:
        return error_from_response(500, _status(500, "InternalError", f"injected: {what}"))
    if fault is Fault.UNAVAILABLE:
        return error_from_response(503, _status(503, "ServiceUnavailable", f"injected: {what}"))
    if fault in (Fault.CONFLICT, Fault.CONFLICT_AFTER):
        return error_from_response(
            409, _status(409, "Conflict", f"injected: {what}: the object was modified")
        )
    if fault is Fault.GONE:
        return error_from_response(
            410, _status(410, "Expired", f"injected: {what}: too old resource version")
        )
    if fault is Fault.THROTTLED:
        return error_from_response(
            429, _status(429, "TooManyRequests", f"injected: {what}"), {"Retry-After": "1"}
        )
    # TIMEOUT, LOST: no response at all, as urllib3's ReadTimeoutError becomes in KubeTransport.
    return Unavailable(f"{what}: injected: read timed out")


class _DroppingResponse:
    """A watch response that breaks after its first chunk, as a reset connection would."""

    def __init__(self, inner: Response, what: str) -> None:
        self._inner = inner
        self._what = what

    def stream(self) -> Iterator[bytes]:
        for chunk in self._inner.stream():
            yield chunk
            self._inner.close()
            raise Unavailable(f"{self._what}: injected: the watch stream dropped")

    def read(self) -> bytes:
        return self._inner.read()

    def close(self) -> None:
        self._inner.close()


class FaultyTransport:
    """`Transport` over `inner` that injects faults.

    `script`: faults (or None for a clean pass) for the matching requests, in order; after it
    runs out, the seeded random schedule (`rate`, `kinds`) decides. `match` chooses which
    requests are eligible (default: all). On reads a 409 becomes a 503 (a read never
    conflicts) and a lost response a timeout; `DROP_WATCH` and `GONE` apply only to
    watches, and other faults skip watches (a scripted entry is used up either way).
    """

    def __init__(
        self,
        inner: Transport,
        *,
        seed: int = 0,
        rate: float = 0.0,
        kinds: Iterable[Fault] = tuple(Fault),
        script: Iterable[Fault | None] = (),
        match: Matcher | None = None,
    ) -> None:
        self._inner = inner
        self._random = random.Random(seed)
        self.rate = rate
        self._kinds = list(kinds)
        self._script = list(script)
        self._match = match
        self._lock = threading.Lock()
        self.injected: list[Injection] = []
        self.requests: list[tuple[str, str]] = []
        self.landed: list[Landed] = []
        """Writes the server accepted (2xx), whether or not the caller saw the answer."""
        self.enabled = True

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(i.fault.value for i in self.injected)

    def _choose(self, method: str, path: str, params: Params) -> Fault | None:
        watch = ("watch", "true") in list(params)
        with self._lock:
            self.requests.append((method, path))
            if not self.enabled or (self._match is not None and not self._match(method, path, params)):
                return None
            if self._script:
                fault = self._script.pop(0)
            elif self.rate and self._random.random() < self.rate:
                fault = self._random.choice(self._kinds)
            else:
                return None
            if fault is None:
                return None
            if (fault in WATCH_ONLY) != watch:
                return None
            if method not in WRITES and fault in (Fault.CONFLICT, Fault.CONFLICT_AFTER):
                fault = Fault.UNAVAILABLE  # a read never conflicts
            elif method not in WRITES and fault is Fault.LOST:
                fault = Fault.TIMEOUT
            self.injected.append(Injection(method, path, fault))
            return fault

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
        fault = self._choose(method, path, params)
        what = f"{method} {path}"
        if fault is None or fault is Fault.DROP_WATCH or fault in AFTER:
            response = self._inner.request(
                method, path, params, body=body, content_type=content_type, timeout=timeout
            )
            if method in WRITES:
                with self._lock:
                    self.landed.append(Landed(method, path, tuple(params), body))
            if fault is None:
                return response
            if fault is Fault.DROP_WATCH:
                return _DroppingResponse(response, what)
            response.read()  # the write landed; its answer never reaches the caller
            response.close()
        raise _error(fault, what)
