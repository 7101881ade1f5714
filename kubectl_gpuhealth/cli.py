"""The `kubectl gpuhealth` command line.

kubectl runs a plugin with every argument after its name and nothing else: global flags
before the name are refused by kubectl itself, so the plugin reads `--kubeconfig` and
`--context` on its own (without them, kubectl's search: $KUBECONFIG, then ~/.kube/config,
then a Pod's service account). The namespace is `-n/--namespace`, else the context's
namespace, else `default`, as for `kubectl get`; `-A` means every namespace.

- `kubectl gpuhealth devices ...` (`kubectl_gpuhealth.devices`);
- `kubectl gpuhealth quarantine list|show|release ...` and `kubectl gpuhealth breaker
  status|reset ...`: the `gpuhealth` commands' own arguments and code (`responder.commands`); the
  records are cluster-scoped, so `-n` and `-A` change nothing there (as for `kubectl get
  nodes`); the breaker's ConfigMap lives in the responder's namespace, which `-n` names,
  `gpuhealth-system` (the install's) unless given: never the context's namespace, where
  the ConfigMap is not and the breaker would read as never tripped.

Errors and exit codes are those of every gpuhealth command (`gpuhealth.cliargs`): one line
`kubectl gpuhealth <cmd>: error: ...`; 0 ok, 1 failure at run time (the cluster cannot be
read, a record is missing, an exporter does not answer), 2 bad flags or input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gpuhealth import __version__
from gpuhealth.cli import run_command
from kubectl_gpuhealth import devices
from kubectl_gpuhealth.flags import cluster_flags
from responder import commands as operator_commands

PROG = "kubectl gpuhealth"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GPU device health, quarantines and the remediation breaker, from kubectl.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    devices.register(commands, cluster_flags)

    quarantine = commands.add_parser(
        "quarantine",
        help="quarantined devices (DeviceQuarantine records)",
        description="Where every quarantined GPU device stands, from the cluster's DeviceQuarantine records.",
    )
    actions = quarantine.add_subparsers(dest="quarantine_command", metavar="COMMAND", required=True)
    listing = actions.add_parser("list", help=operator_commands.LIST_HELP)
    cluster_flags(listing, all_namespaces=True)
    operator_commands.add_list_arguments(listing)
    show = actions.add_parser("show", help=operator_commands.SHOW_HELP)
    cluster_flags(show)
    operator_commands.add_show_arguments(show)
    release = actions.add_parser("release", help=operator_commands.RELEASE_HELP)
    cluster_flags(release)
    operator_commands.add_release_arguments(release)

    breaker = commands.add_parser(
        "breaker",
        help="the remediation circuit breaker: status and a person's reset",
        description=(
            "The breaker that holds back new automatic quarantines when too much fails at once; "
            "-n names the responder's namespace, where its ConfigMap lives (not the context's)."
        ),
    )
    breaker_actions = breaker.add_subparsers(dest="breaker_command", metavar="COMMAND", required=True)
    status = breaker_actions.add_parser("status", help=operator_commands.BREAKER_STATUS_HELP)
    cluster_flags(status, component_namespace=operator_commands.RESPONDER_NAMESPACE)
    operator_commands.add_breaker_status_arguments(status)
    reset = breaker_actions.add_parser("reset", help=operator_commands.BREAKER_RESET_HELP)
    cluster_flags(reset, component_namespace=operator_commands.RESPONDER_NAMESPACE)
    operator_commands.add_breaker_reset_arguments(reset)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "context", None) is None and hasattr(args, "kubeconfig"):
        # kubectl's current context, which the official client would pick differently from a
        # list of kubeconfig files: the namespace and the connection both follow kubectl.
        from gpuhealth.kube.config import kubectl_current_context

        args.context = kubectl_current_context(args.kubeconfig)
    # Warnings (an exporter that did not answer) go to stderr as `WARNING: ...`; kubectl's own
    # output stays clean for scripts.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
    return run_command(parser, args)


if __name__ == "__main__":
    sys.exit(main())
