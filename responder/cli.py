"""`gpuhealth responder` (the service) and the registration of the operator commands.

Entry point, reached by `gpuhealth.cli` through importlib: `register` adds `gpuhealth responder`
(serve until SIGINT/SIGTERM: the webhook on every replica, the reconciler on the leader;
`run_responder`) and the operator commands `gpuhealth quarantine ...` and `gpuhealth breaker
...`, whose arguments and code are `responder.commands` (some of them write: see there).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhealth.cliargs import CommandFailed, UsageError, command, listen_address
from responder.commands import (
    BREAKER_RESET_HELP,
    BREAKER_STATUS_HELP,
    EXTEND_HELP,
    LIST_HELP,
    RELEASE_HELP,
    RESPONDER_NAMESPACE,
    SHOW_HELP,
    add_breaker_reset_arguments,
    add_breaker_status_arguments,
    add_extend_arguments,
    add_list_arguments,
    add_release_arguments,
    add_show_arguments,
    cluster_options,
    connect,
    namespace_option,
)
from responder.settings import DEFAULT_PORT

if TYPE_CHECKING:
    from gpuhealth.kube.client import KubeClient


def register(subparsers: argparse._SubParsersAction) -> None:
    quarantine = subparsers.add_parser(
        "quarantine",
        help="show quarantined devices (DeviceQuarantine records in the cluster)",
        description="Where every quarantined GPU device stands, from the cluster's DeviceQuarantine records.",
    )
    actions = quarantine.add_subparsers(dest="quarantine_command", metavar="COMMAND", required=True)

    listing = actions.add_parser("list", help=LIST_HELP)
    cluster_options(listing)
    add_list_arguments(listing)

    show = actions.add_parser("show", help=SHOW_HELP)
    cluster_options(show)
    add_show_arguments(show)

    release = actions.add_parser("release", help=RELEASE_HELP)
    cluster_options(release)
    add_release_arguments(release)

    extend = actions.add_parser("extend", help=EXTEND_HELP)
    cluster_options(extend)
    add_extend_arguments(extend)

    service = subparsers.add_parser(
        "responder",
        help="run the responder: the Alertmanager webhook and, on the leader, the reconciler",
        description=(
            "Serve POST /webhook (Alertmanager deliveries recorded as DeviceQuarantine objects), "
            "/healthz, /readyz and /metrics; the replica that holds the leader Lease reconciles the "
            "records (quarantine, migration, release)."
        ),
    )
    cluster_options(service)
    service.add_argument(
        "--listen",
        metavar="HOST:PORT",
        type=listen_address,
        default=f":{DEFAULT_PORT}",
        help="where to serve (default: %(default)s)",
    )
    service.add_argument("--token-file", required=True, help="file holding the webhook's bearer token")
    service.add_argument(
        "--prometheus-url", required=True, help="Prometheus with the shipped rules (device health)"
    )
    service.add_argument(
        "-n",
        "--namespace",
        default=RESPONDER_NAMESPACE,
        help="the responder's namespace (default: %(default)s)",
    )
    service.add_argument(
        "--identity",
        default=None,
        help="this replica's name for leader election (default: host name and pid)",
    )
    service.add_argument(
        "--dry-run", action="store_true", help="decide and record everything, enforce nothing"
    )
    service.add_argument(
        "--tls-cert-file",
        metavar="FILE",
        help="serve HTTPS with this PEM certificate chain (with --tls-key-file; reloaded when it changes)",
    )
    service.add_argument("--tls-key-file", metavar="FILE", help="the certificate's PEM private key")
    service.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        default="",
        help=(
            "exporter-toolkit web configuration (TLS, basic auth for /metrics, rate limit); the webhook "
            "keeps its bearer token and the extender its TLS"
        ),
    )
    service.add_argument(
        "--config",
        metavar="FILE",
        action="append",
        help="YAML tunables: policy, breaker, migration, checks... (example: deploy/responder-config.yaml); "
        "repeated, each file's keys apply over the files before it (a component's addition)",
    )
    command(service, run_responder)

    breaker_parser = subparsers.add_parser(
        "breaker",
        help="the remediation circuit breaker: status and a person's reset",
        description="The breaker that holds back new automatic quarantines when too much fails at once.",
    )
    breaker_actions = breaker_parser.add_subparsers(dest="breaker_command", metavar="COMMAND", required=True)
    status = breaker_actions.add_parser("status", help=BREAKER_STATUS_HELP)
    cluster_options(status)
    namespace_option(status)
    add_breaker_status_arguments(status)
    reset = breaker_actions.add_parser("reset", help=BREAKER_RESET_HELP)
    cluster_options(reset)
    namespace_option(reset)
    add_breaker_reset_arguments(reset)


def run_responder(args: argparse.Namespace) -> int:
    """`gpuhealth responder`: serve until SIGINT/SIGTERM (exit 0) or a failure (exit 1)."""
    import asyncio
    import os
    import socket

    from gpuhealth import http
    from gpuhealth.tls import CertificateError, ReloadingCertificate, TlsSettings
    from gpuhealth.webconfig import WebConfigError
    from gpuhealth.webconfig import load as load_web_config
    from responder import config
    from responder.checks.jobs import CheckSettings
    from responder.service import WEB_GUARD, create_app
    from responder.settings import ResponderSettings

    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as exc:
        raise UsageError(f"--token-file {args.token_file}: {exc.strerror or exc}") from exc
    if not token:
        raise UsageError(f"--token-file {args.token_file}: the file is empty (the webhook never runs open)")
    host, port = args.listen
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        raise UsageError("--tls-cert-file and --tls-key-file go together: give both, or neither")
    if args.tls_cert_file and args.web_config_file:
        raise UsageError("--web.config.file has its own tls_server_config: give it or --tls-cert-file")
    try:
        tls = TlsSettings(args.tls_cert_file, args.tls_key_file) if args.tls_cert_file else None
        settings = ResponderSettings(
            token=token,
            identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
            prometheus_url=args.prometheus_url,
            namespace=args.namespace,
            kubeconfig=args.kubeconfig,
            dry_run=args.dry_run,
            server=http.ServerSettings(host=host, port=port, web_config_file=args.web_config_file),
            tls=tls,
            checks=CheckSettings(namespace=args.namespace),  # the file may name another
        )
        for path in args.config or ():
            settings = config.load(path, settings)
        certificate = ReloadingCertificate(tls.cert_file, tls.key_file) if tls is not None else None
        if args.web_config_file:
            load_web_config(args.web_config_file)  # refused here, before anything starts
    except WebConfigError as exc:
        raise UsageError(f"--web.config.file {exc}") from exc
    except config.ConfigError as exc:
        raise UsageError(f"--config {exc}") from exc
    except CertificateError as exc:
        raise UsageError(f"--tls-cert-file/--tls-key-file: {exc}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc

    def new_client() -> KubeClient:
        return connect(args)

    async def serve() -> None:
        app = create_app(settings, new_client, certificate=certificate)
        guard = app.get(WEB_GUARD)
        context = certificate.context if certificate is not None else guard.ssl_context if guard else None
        await http.serve(
            app,
            settings.server,
            on_started=lambda address: print(
                f"gpuhealth responder: serving on {http.format_listen(*address)} as {settings.identity}"
                + (" over HTTPS" if context is not None else "")
                + (" (dry-run)" if settings.dry_run else ""),
                flush=True,
            ),
            ssl_context=context,
        )

    try:
        asyncio.run(serve())
    except (http.ListenFailed, http.BackgroundTaskFailed) as exc:
        raise CommandFailed(str(exc)) from exc
    except WebConfigError as exc:
        raise UsageError(f"--web.config.file {exc}") from exc
    return 0
