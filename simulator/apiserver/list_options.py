"""List and watch options of the simulated apiserver: which combinations are refused, and which state a
list reads.

Pure decisions over the query string; the HTTP layer applies them to the store.

The rules, as the real apiserver has them:

- `resourceVersionMatch` needs a `resourceVersion`, is refused with `continue`, is `Exact` or
  `NotOlderThan`, and `Exact` is refused for resourceVersion "0": 422 Invalid on kind
  ListOptions.meta.k8s.io. On a watch it is allowed only with `sendInitialEvents`, and then must
  be `NotOlderThan`. `sendInitialEvents` on a list is refused.
- `continue` with a resourceVersion other than "0": 400 BadRequest.
- Which state a list reads (`ReadAt`): unset, "0" and `NotOlderThan` read the current state
  (the simulated cluster's cache is never stale); `Exact`, a legacy resourceVersion together with
  `limit`, and a continue token read the state at that exact version. A version the server has
  not reached is 504 ResourceVersionTooLarge.

Continue tokens carry the list's resourceVersion and the last key returned, as base64 JSON (the
real apiserver's shape: `{"v":"meta.k8s.io/v1","rv":N,"start":"KEY\\x00"}`); rv -1 means "the
latest state", which is what the token inside a 410 for an expired continue token says.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from simulator.apiserver.errors import ApiError, bad_request
from simulator.apiserver.watch_cache import too_large

EXACT = "Exact"
NOT_OLDER_THAN = "NotOlderThan"
LATEST = -1
"""A continue token's resourceVersion that continues at the latest state (an inconsistent list)."""

CONTINUE_EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter, or use the continue token in this response to retrieve "
    "the remainder of the results. Continuing with the provided token results in an inconsistent list - "
    "objects that were created, modified, or deleted between the time the first chunk was returned "
    "and now may show up in the list."
)


@dataclass(frozen=True)
class ContinueToken:
    rv: int
    """The first page's resourceVersion, or LATEST."""
    start: tuple[str, str]
    """(namespace, name) of the last item already returned; the next page starts after it."""

    def encode(self) -> str:
        key = f"{self.start[0]}/{self.start[1]}" if self.start[0] else self.start[1]
        raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": self.rv, "start": key + "\x00"})
        return base64.urlsafe_b64encode(raw).decode()

    @staticmethod
    def decode(token: str) -> ContinueToken:
        try:
            data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
            if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
                raise ValueError("unknown version")
            rv = data["rv"]
            key = str(data["start"])
            if not isinstance(rv, int) or isinstance(rv, bool) or rv < LATEST or not key.endswith("\x00"):
                raise ValueError("malformed")
        except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise bad_request(f"continue key is not valid: {exc}") from exc
        namespace, _, name = key[:-1].rpartition("/")
        return ContinueToken(rv, (namespace, name))


@dataclass(frozen=True)
class ReadAt:
    """The state a list reads: the current one (`exact is None`), or the one at `exact`."""

    exact: int | None
    after: tuple[str, str] | None = None
    """Continue after this (namespace, name)."""


def _invalid(causes: list[tuple[str, str, str]]) -> ApiError:
    """422 on ListOptions; causes are (field, reason, message-with-type-prefix)."""
    text = ", ".join(f"{field}: {message}" for field, _, message in causes)
    return ApiError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {text}',
        details={
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [
                {"reason": reason, "message": message, "field": field} for field, reason, message in causes
            ],
        },
    )


def _forbidden(field: str, message: str) -> tuple[str, str, str]:
    return field, "FieldValueForbidden", f"Forbidden: {message}"


def _unsupported(field: str, value: str, supported: tuple[str, ...]) -> tuple[str, str, str]:
    allowed = ", ".join(f'"{s}"' for s in supported)
    return field, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {allowed}'


def parse_resource_version(value: str) -> int:
    try:
        rv = int(value)
    except ValueError:
        rv = -1
    if rv < 0:
        raise bad_request(f"invalid resource version: {value!r}")
    return rv


def check_watch(query: Mapping[str, str]) -> None:
    """Refuse the option combinations a real apiserver refuses on a watch (422)."""
    match = query.get("resourceVersionMatch", "")
    initial = query.get("sendInitialEvents")
    causes: list[tuple[str, str, str]] = []
    if initial is not None and match != NOT_OLDER_THAN:
        causes.append(
            _forbidden(
                "resourceVersionMatch",
                f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}",
            )
        )
    if match:
        if initial is None:
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )
            )
        if match != NOT_OLDER_THAN:
            causes.append(_unsupported("resourceVersionMatch", match, (NOT_OLDER_THAN,)))
        if query.get("continue"):
            causes.append(
                _forbidden(
                    "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                )
            )
    if causes:
        raise _invalid(causes)
    rv = query.get("resourceVersion")
    if rv:
        parse_resource_version(rv)


def read_at(query: Mapping[str, str], current: int) -> ReadAt:
    """Which state a list with this query reads; 422/400 for refused combinations, 504 for the future."""
    rv_text = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    token = query.get("continue", "")
    causes: list[tuple[str, str, str]] = []
    if match:
        if not rv_text:
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if token:
            causes.append(
                _forbidden(
                    "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                )
            )
        if match not in (EXACT, NOT_OLDER_THAN):
            causes.append(_unsupported("resourceVersionMatch", match, (EXACT, NOT_OLDER_THAN, "")))
        if match == EXACT and rv_text == "0":
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
    if query.get("sendInitialEvents") is not None:
        causes.append(_forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if causes:
        raise _invalid(causes)
    if token:
        if rv_text not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        parsed = ContinueToken.decode(token)
        if parsed.rv > current:
            raise too_large(parsed.rv, current)
        return ReadAt(None if parsed.rv == LATEST else parsed.rv, parsed.start)
    if not rv_text:
        return ReadAt(None)
    rv = parse_resource_version(rv_text)
    if rv > current:
        raise too_large(rv, current)
    limited = bool(query.get("limit")) and query.get("limit") != "0"
    if match == EXACT or (not match and rv != 0 and limited):
        return ReadAt(rv)
    return ReadAt(None)


class ContinueExpired(ApiError):
    """410 for a continue token whose version left the window; the Status carries (in
    metadata.continue) a token that continues at the latest state, as the real one does. The real
    Status gives no remainingItemCount here, so neither does this one."""

    def __init__(self, token: ContinueToken) -> None:
        super().__init__(410, "Expired", CONTINUE_EXPIRED_MESSAGE)
        self.next_token = ContinueToken(LATEST, token.start).encode()

    def status(self) -> dict[str, Any]:
        body = super().status()
        body["metadata"] = {"continue": self.next_token}
        return body


__all__ = [
    "EXACT",
    "LATEST",
    "NOT_OLDER_THAN",
    "ContinueExpired",
    "ContinueToken",
    "ReadAt",
    "check_watch",
    "parse_resource_version",
    "read_at",
]
