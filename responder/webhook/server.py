"""`POST /webhook`: Alertmanager's deliveries, authenticated, bounded, validated and recorded.

An aiohttp adapter. The handler records intent and never acts (a reconciler run by the
leader does); it answers only once every alert is durably recorded, because Alertmanager
retries 5xx only and drops everything else:
- 401 without the bearer token (compared in constant time; there is no open mode),
- 413 for a body over the limit, 400 for one that is not a valid payload version 4,
- 200 when every alert is recorded, a duplicate or deliberately skipped,
- 400 when some alert is malformed (the others are still recorded; retrying cannot mend it),
- 503 with Retry-After when any alert could not be recorded (the API is unreachable, an
  object conflicts past the retries): Alertmanager delivers again, and what was recorded
  comes back as a duplicate. Never 429, which Alertmanager drops, and never 200 for work
  not recorded.

`truncatedAlerts > 0` (Alertmanager left alerts out under `max_alerts`) is logged and
counted; the shipped route sets `max_alerts: 0`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from gpuhealth.outcomes import Done, Outcome, Rejected, Retry, Skipped, Unchanged, combine, http_status
from gpuhealth.outcomes import retry_after_header as retry_after
from responder import metrics
from responder.webhook.alerts import Alert, PayloadError, parse_delivery
from responder.webhook.intake import OtherCluster

log = logging.getLogger(__name__)

PATH = "/webhook"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    token: str
    """The bearer token Alertmanager sends (`authorization.credentials_file` in its config)."""
    max_body_bytes: int = 1024 * 1024
    """Largest delivery accepted (413 beyond). A delivery of a few hundred alerts is well under
    it; Alertmanager's own limit is its `max_alerts`."""

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ValueError("the webhook token is empty: the webhook never runs unauthenticated")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes!r}")


RecordAll = Callable[[Sequence[Alert]], list[Outcome]]
"""Records alerts (blocking: the handler runs it in a thread) and says what each came to."""


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = instruments.counter(metrics.WEBHOOK_REQUESTS, registry)
        self.alerts = instruments.counter(metrics.WEBHOOK_ALERTS, registry)
        self.truncated = instruments.counter(metrics.WEBHOOK_TRUNCATED, registry)
        self.seconds = instruments.histogram(metrics.WEBHOOK_SECONDS, registry)
        for outcome in metrics.WEBHOOK_OUTCOMES:
            self.requests.labels(outcome)
        for result in metrics.ALERT_RESULTS:
            self.alerts.labels(result)


def add_webhook(
    app: web.Application, settings: WebhookSettings, record_all: RecordAll, webhook_metrics: WebhookMetrics
) -> None:
    """Serve `POST /webhook` on `app`."""
    app.router.add_post(PATH, _handler(settings, record_all, webhook_metrics))


def _handler(
    settings: WebhookSettings, record_all: RecordAll, m: WebhookMetrics
) -> Callable[[web.Request], Awaitable[web.Response]]:
    expected = f"Bearer {settings.token.strip()}".encode()

    async def handle(request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            response, outcome = await _handle(request)
        finally:
            m.seconds.observe(loop.time() - started)
        m.requests.labels(outcome).inc()
        return response

    async def _handle(request: web.Request) -> tuple[web.Response, str]:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _answer(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            ), "unauthorized"
        if request.content_length is not None and request.content_length > settings.max_body_bytes:
            return _too_large(settings), "too_large"
        body = await request.content.read(settings.max_body_bytes + 1)
        if len(body) > settings.max_body_bytes:
            return _too_large(settings), "too_large"
        try:
            delivery = parse_delivery(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            return _answer(400, f"the body is not JSON: {exc}"), "rejected"
        except PayloadError as exc:
            return _answer(400, str(exc)), "rejected"
        if delivery.truncated_alerts:
            log.warning(
                "Alertmanager left %d alert(s) out of a delivery to %s (max_alerts); they come with the next",
                delivery.truncated_alerts,
                delivery.receiver or "?",
            )
            m.truncated.inc(delivery.truncated_alerts)
        for message in delivery.rejected:
            log.warning("malformed alert in a delivery: %s", message)
        outcomes = await asyncio.to_thread(record_all, delivery.alerts) if delivery.alerts else []
        for outcome in outcomes:
            m.alerts.labels(_result(outcome)).inc()
        m.alerts.labels("rejected").inc(len(delivery.rejected))
        overall = combine([*outcomes, *(Rejected(message) for message in delivery.rejected)])
        status = http_status(overall)
        detail = {
            "recorded": sum(isinstance(o, Done) for o in outcomes),
            "unchanged": sum(isinstance(o, Unchanged) for o in outcomes),
            "skipped": sum(isinstance(o, Skipped) and not isinstance(o, OtherCluster) for o in outcomes),
            "other_cluster": [o.reason for o in outcomes if isinstance(o, OtherCluster)],
            "rejected": list(delivery.rejected),
            "retry": [o.reason for o in outcomes if isinstance(o, Retry)],
        }
        label = {200: "accepted", 400: "rejected"}.get(status, "retry")
        return web.json_response(detail, status=status, headers=retry_after(overall), dumps=_dumps), label

    return handle


def _result(outcome: Outcome) -> str:
    if isinstance(outcome, Done):
        return "recorded"
    if isinstance(outcome, Unchanged):
        return "duplicate"
    if isinstance(outcome, OtherCluster):
        return "other_cluster"
    if isinstance(outcome, Skipped):
        return "skipped"
    if isinstance(outcome, Rejected):
        return "rejected"
    return "retry"


def _too_large(settings: WebhookSettings) -> web.Response:
    return _answer(413, f"the delivery is larger than {settings.max_body_bytes} bytes")


def _answer(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers, dumps=_dumps)


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()
