"""The error vocabulary of the Kubernetes API, and the one mapping from a response to it.

Every failed request raises an `ApiError` subclass carrying the HTTP status, the
apiserver's machine `reason` (`NotFound`, `Conflict`, `Expired`, ...) and its Status
`message`. Callers catch the class that means something to them: `Conflict` (re-read and
retry), `NotFound`, `Gone` (relist), `TooManyRequests` and `Unavailable` (temporary: back
off and retry, `retry_after` when the server said how long). The classes are plain
exceptions, not the official client's `ApiException`, so no service depends on its models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, ClassVar

import orjson


class ApiError(Exception):
    """A failed API request: HTTP status (None when no response came), reason and message."""

    default_status: ClassVar[int | None] = None
    temporary: ClassVar[bool] = False
    """Whether the same request may succeed later unchanged (back off and retry)."""

    def __init__(
        self,
        message: str = "",
        *,
        status: int | None = None,
        reason: str = "",
        retry_after: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = self.default_status if status is None else status
        self.reason = reason or _reason_phrase(self.status)
        self.message = message
        self.retry_after = retry_after
        """Seconds the server asked us to wait before retrying (Retry-After), when it said."""
        self.details: Mapping[str, Any] = details or {}
        """The Status `details` (name, kind, group, causes), empty when the server gave none."""
        head = f"{self.status} {self.reason}" if self.status is not None else self.reason
        super().__init__(f"{head}: {message}" if message else head)


class BadRequest(ApiError):
    """400: the request itself is malformed (a bad selector, an unsupported parameter)."""

    default_status = 400


class Unauthorized(ApiError):
    """401: no valid credentials."""

    default_status = 401


class Forbidden(ApiError):
    """403: the credentials may not do this (RBAC)."""

    default_status = 403


class NotFound(ApiError):
    """404: the object (or the resource type) does not exist."""

    default_status = 404


class Conflict(ApiError):
    """409: a precondition failed (a stale resourceVersion or uid): re-read and decide again."""

    default_status = 409


class AlreadyExists(Conflict):
    """409 AlreadyExists: a create found an object of that name."""


class Gone(ApiError):
    """410: the resourceVersion asked for has expired from the watch cache: list again."""

    default_status = 410


class Invalid(ApiError):
    """422: the object fails validation; `details["causes"]` names the fields."""

    default_status = 422


class TooManyRequests(ApiError):
    """429: throttled (API priority and fairness, or an eviction blocked by a disruption budget)."""

    default_status = 429
    temporary = True


class Unavailable(ApiError):
    """5xx, or no response at all (connection refused or reset, timeout): temporary."""

    temporary = True


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_from_response(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> ApiError:
    """The error a non-2xx response means: its class by status (and reason), the Status body's text."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    header = headers.get("Retry-After") if headers is not None else None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return _classify(status, parsed, parse_retry_after(header))
    text = body[:300].decode(errors="replace").strip()
    return _classify(status, {"message": text}, parse_retry_after(header))


def error_from_status(obj: Any) -> ApiError:
    """The error a Status object means where no HTTP status comes with it (a watch's ERROR event).

    A Status without a usable code is taken as a server error (500), so it is retried.
    """
    status = obj if isinstance(obj, dict) else {"message": str(obj)}
    code = status.get("code")
    return _classify(code if isinstance(code, int) and not isinstance(code, bool) else 500, status, None)


def _classify(code: int, status: Mapping[str, Any], retry_after: float | None) -> ApiError:
    reason = status.get("reason")
    reason = reason if isinstance(reason, str) else ""
    message = status.get("message")
    message = message if isinstance(message, str) else ""
    details = status.get("details")
    details = details if isinstance(details, dict) else None
    if retry_after is None and details is not None:
        # The apiserver also says it in the body (e.g. 429 and 500 "please try again later").
        retry_after = _seconds(details.get("retryAfterSeconds"))
    if code >= 500:
        cls: type[ApiError] = Unavailable
    elif code == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    else:
        cls = _BY_STATUS.get(code, ApiError)
    return cls(message, status=code, reason=reason, retry_after=retry_after, details=details)


def parse_retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds; None when absent or not delay-seconds.

    The apiserver sends whole seconds; the HTTP-date form, which it never sends, is not read.
    """
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        return None
    return float(int(text))


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _reason_phrase(status: int | None) -> str:
    """The CamelCase reason the apiserver would give for a bare status ("NotFound")."""
    if status is None:
        return "NoResponse"
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return f"HTTP{status}"
