"""The responder service: any replica records webhook deliveries; the leader reconciles.

Wiring only (an entry-point layer module): `create_app` builds the aiohttp app from settings
and clients — `POST /webhook` (`responder.webhook.server`, recording through `responder.webhook.recorder`),
`POST /scheduler/filter` (the scheduler extender, `responder.extender.server`, answered from the
`responder.extender.capacity` cache of Nodes and Pods), `/healthz`, `/readyz` and `/metrics`
(`gpuhealth.http`) — and runs, as background work of
the app, the leader election on a `coordination.k8s.io/v1` Lease (`gpuhealth.kube.elector`)
whose term runs the reconciler (`responder.reconcile.reconciler`) with the migration executor
(`responder.migrate.executor`). Every replica answers webhooks and the extender (each keeps its own
cache): the records are the only state, so any replica's recording is as good as the leader's,
and a replica that loses the lease stops acting before it says so (fencing), while its webhook
and extender go on.

Ready means: the API answered the CRD's discovery at start (so records can be written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuhealth import http, instruments
from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.elector import LeaderElector
from gpuhealth.tls import ReloadingCertificate, watch_certificate
from gpuhealth.web_guard import REFUSAL_REASONS, WebGuard, guard_app
from responder import metrics
from responder.checks.jobs import JobChecks
from responder.enforce.hold import DeviceHold, device_ids
from responder.enforce.hold_allocations import PrometheusAllocations
from responder.enforce.hold_devices import PodDevices
from responder.enforce.holders import DeviceHolders
from responder.enforce.node_taint import NodeTaint
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.extender.capacity import CapacityCache, run_cache
from responder.extender.server import FILTER_PATH, add_filter
from responder.ladder import without_reset
from responder.migrate.executor import Migrator, MigratorMetrics
from responder.migrate.readings import PrometheusReadings
from responder.reconcile.breaker_store import BreakerStore
from responder.reconcile.escalator import Escalator
from responder.reconcile.events import KubeEvents
from responder.reconcile.health import PrometheusHealth, cluster_selector
from responder.reconcile.reconciler import Reconciler, node_opted_out
from responder.reset.handoff import ResetHandoff
from responder.settings import ResponderSettings
from responder.webhook.recorder import Recorder
from responder.webhook.server import PATH as WEBHOOK_PATH
from responder.webhook.server import WebhookMetrics, WebhookSettings, add_webhook

log = logging.getLogger(__name__)

LEADER_LEASE = "gpuhealth-responder"
"""The leader election Lease's name, in the responder's namespace."""

WEB_GUARD = web.AppKey("web_guard", WebGuard)
"""The app's web configuration, when `--web.config.file` gave one (serve with its `ssl_context`)."""
OWN_AUTH_PATHS = frozenset({WEBHOOK_PATH, FILTER_PATH})
"""Endpoints outside the web configuration's basic auth, inside its TLS, SAN check and rate
limit: Alertmanager sends the webhook its bearer token (one Authorization header: it cannot send
a password too), and kube-scheduler's extender client can present only a client certificate
(`client_allowed_sans` with `VerifyClientCertIfGiven`: docs/web-config.md)."""

ClientFactory = Callable[[], KubeClient]
"""Makes one API client: the webhook, the elector, the reconciler and its watch each get their
own, so a blocked watch or a slow write never queues behind another's connection."""


def create_app(
    settings: ResponderSettings,
    new_client: ClientFactory,
    *,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    certificate: ReloadingCertificate | None = None,
) -> web.Application:
    """The service's app; with `certificate` (built from `settings.tls`, its context handed to
    the site) a background check picks up rotated files."""
    clock = clock or SystemClock()
    registry = registry or CollectorRegistry()
    # The webhook reads its body with its own, smaller limit; this one bounds the extender's
    # NodeList (the largest body anyone sends us).
    app = web.Application(
        client_max_size=max(settings.webhook_max_body_bytes, settings.extender_max_body_bytes) + 64 * 1024
    )

    webhook_client = new_client()
    recorder = Recorder(webhook_client, clock, settings.intake)
    add_webhook(
        app,
        WebhookSettings(settings.token, max_body_bytes=settings.webhook_max_body_bytes),
        recorder.record_all,
        WebhookMetrics(registry),
    )
    scheduled = instruments.counter(metrics.EXTENDER_SCHEDULED, registry)
    capacity = CapacityCache(on_scheduled=scheduled.inc)
    add_filter(app, capacity, registry)
    http.add_metrics(app, registry, settings.server)
    refused = instruments.counter(metrics.HTTP_REFUSED, registry)
    for reason in REFUSAL_REASONS:
        refused.labels(reason)  # 0 from the start: a rate of refusals needs a baseline
    failures = instruments.counter(metrics.WEB_CONFIG_RELOAD_FAILURES, registry)
    if settings.server.web_config_file:
        app[WEB_GUARD] = guard_app(
            app,
            settings.server.web_config_file,
            on_refused=lambda reason: refused.labels(reason).inc(),
            on_reload_failed=failures.inc,
            own_auth_paths=OWN_AUTH_PATHS,
        )
    ready = {"api": False}
    http.add_probes(app, ready=lambda: ready["api"], not_ready="the API has not answered yet")

    leader = instruments.gauge(metrics.LEADER, registry)
    transitions = instruments.counter(metrics.LEADER_TRANSITIONS, registry)

    def leading_changed(leading: bool) -> None:
        leader.set(1 if leading else 0)
        transitions.inc()
        log.info("%s %s leading", settings.identity, "started" if leading else "stopped")

    async def elect_and_reconcile() -> None:
        api = new_client()
        watch = new_client()
        elector_client = new_client()
        try:
            rules = await asyncio.to_thread(discover, api)
            if rules is None:
                log.warning(
                    "the cluster serves no DeviceTaintRule version: DRA devices cannot be quarantined"
                )
            ready["api"] = True
            reconciler_settings = settings.reconciler
            if settings.dry_run:
                # A dry run enforces nothing, and asks no controller to reset a card either.
                policy = dataclasses.replace(
                    reconciler_settings.policy,
                    dry_run=True,
                    ladder=without_reset(reconciler_settings.policy.ladder),
                )
                reconciler_settings = dataclasses.replace(reconciler_settings, policy=policy)
            # Which device each pod got where the kubelet does not say (before 1.36): one reading,
            # shared by the hold and by the backend that says which pods hold a card (the moves,
            # the release's wait for the card to be free).
            pod_devices = PodDevices(device_ids, PrometheusAllocations(settings.prometheus_url))
            # The one set of backends: everything that enforces, holds, checks or moves asks it.
            enforcer = Enforcer(
                api,
                rules,
                device_class=settings.checks.device_class,
                runtime_class=settings.checks.runtime_class,
                check_route=settings.checks.device_plugin_route,
                ramp_pods=settings.ramp_pods,
                devices=pod_devices,
                clock=clock,
            )
            migrator = Migrator(
                api,
                settings.migrator,
                clock,
                backends=enforcer,
                metrics=MigratorMetrics(registry),
                namespace=settings.namespace,
                readings=PrometheusReadings(settings.prometheus_url),
            )
            resets = ResetHandoff(api, settings.reset) if reconciler_settings.policy.ladder.resets() else None
            unserved = None if resets is None else await asyncio.to_thread(resets.unserved)
            if unserved is not None:
                log.error("reset hand-off: %s", unserved)
            checks = JobChecks(api, enforcer, settings.checks)
            reconciler = Reconciler(
                api,
                enforcer=enforcer,
                health=PrometheusHealth(
                    settings.prometheus_url,
                    selector=cluster_selector(settings.intake.cluster_label, settings.intake.cluster),
                ),
                checks=checks,
                resets=resets,
                events=KubeEvents(api),
                breaker_store=BreakerStore(api, settings.namespace),
                settings=reconciler_settings,
                clock=clock,
                registry=registry,
                migrate=None if settings.dry_run else migrator.step,
                finish=None if settings.dry_run else migrator.finish,
                watch_client=watch,
                holders=DeviceHolders(api, enforcer),
                hold=DeviceHold(api, settings.namespace, settings.hold, devices=pod_devices),
                hold_aside=checks.through_kubelet,
                escalator=Escalator(
                    NodeTaint(api),
                    reconciler_settings.escalation,
                    reconciler_settings.policy.breaker,
                    registry,
                    opted_out=node_opted_out,
                    dry_run=settings.dry_run,
                ),
            )
            elector = LeaderElector(
                elector_client,
                namespace=settings.namespace,
                name=LEADER_LEASE,
                identity=settings.identity,
                settings=settings.election,
                clock=clock,
                on_leading_changed=leading_changed,
            )
            await elector.run(reconciler.run)
        finally:
            for client in (api, watch, elector_client):
                client.close()

    app.cleanup_ctx.append(http.background("leader-election", elect_and_reconcile))

    async def watch_capacity() -> None:
        await run_cache(capacity, new_client(), settings.capacity)

    app.cleanup_ctx.append(http.background("capacity-cache", watch_capacity))

    if certificate is not None:
        every = settings.tls.reload_check_seconds if settings.tls is not None else 30.0
        app.cleanup_ctx.append(
            http.background("certificate-reload", lambda: watch_certificate(certificate, every))
        )

    async def close_webhook_client(_app: web.Application) -> None:
        webhook_client.close()

    app.on_cleanup.append(close_webhook_client)
    return app
