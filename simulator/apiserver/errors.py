"""API errors of the simulated cluster, shaped as real `metav1.Status` objects.

Every failure the store or the HTTP layer reports is an `ApiError`; the HTTP layer turns it into
the Status body and code that a real kube-apiserver would send, so the official client raises
the same `ApiException` it would raise against a real cluster.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call: HTTP code, machine reason (`NotFound`, `Conflict`, ...) and message."""

    def __init__(
        self, code: int, reason: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The full `Status` object a real apiserver returns for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        # The apiserver's field order: details (when any) come before code.
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def _details(resource: str, group: str, name: str | None) -> dict[str, Any]:
    # The real apiserver puts the plural resource (not the Kind) into details.kind; its field
    # order is name, group, kind.
    details: dict[str, Any] = {}
    if name is not None:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def not_found(resource: str, group: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        404, "NotFound", f'{qualified} "{name}" not found', details=_details(resource, group, name)
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409, "AlreadyExists", f'{qualified} "{name}" already exists', details=_details(resource, group, name)
    )


def conflict(resource: str, group: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details=_details(resource, group, name),
    )


def precondition_failed(info: Any, name: str, why: str) -> ApiError:
    """A delete whose uid or resourceVersion precondition does not hold: kube-apiserver names the kind."""
    qualified = f"{info.kind}.{info.group}" if info.group else info.kind
    details = {"name": name, **({"group": info.group} if info.group else {}), "kind": info.kind}
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}', details=details
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


_CAUSE_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Forbidden", "FieldValueForbidden"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Invalid value", "FieldValueInvalid"),
    ("Not found", "FieldValueNotFound"),
    ("Internal error", "InternalError"),
)
"""Message prefix of a field error and the cause reason the apiserver reports for it."""


def cause_reason(message: str) -> str:
    """The `details.causes[].reason` of a field error message (`Required value` -> FieldValueRequired)."""
    for prefix, reason in _CAUSE_REASONS:
        if message.startswith(prefix):
            return reason
    return "FieldValueInvalid"


def join_field_errors(causes: list[tuple[str, str]]) -> str:
    """Field errors joined as the apiserver's aggregate prints them: one bare, several in brackets."""
    texts = [f"{field}: {msg}" if field else msg for field, msg in causes]
    if len(texts) == 1:
        return texts[0]
    return "[" + ", ".join(texts) + "]"


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; `causes` are (field path, message) pairs, named in the message like the real API.

    Each message starts with its type (`Required value`, `Invalid value: "x": ...`,
    `Unsupported value: ...`, `Forbidden: ...`), which also gives the cause's reason.
    """
    text = join_field_errors(causes) if causes else "invalid object"
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [
        {"reason": cause_reason(msg), "message": msg, "field": field} for field, msg in causes
    ]
    # The message names the kind qualified by its group (`Deployment.apps "web" is invalid: ...`).
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', details=details)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
