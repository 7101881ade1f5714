"""kubectl's flags for naming the cluster and the namespace, and how kubectl resolves them.

Entry-point layer (parsing, and reading the kubeconfig file for its context's namespace).
"""

from __future__ import annotations

import argparse

from gpuhealth.cliargs import UsageError

DEFAULT_NAMESPACE = "default"


def cluster_flags(
    parser: argparse.ArgumentParser, *, all_namespaces: bool = False, component_namespace: str | None = None
) -> None:
    """kubectl's flags for naming the cluster and the namespace.

    `component_namespace`: the command reads an object of gpuhealth's own (the breaker's
    ConfigMap), which lives in the namespace gpuhealth was installed in, whatever the user's
    context says; `-n` names that namespace and this is its default. Reading the context's
    namespace there would report a breaker that never tripped."""
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    if component_namespace is not None:
        parser.add_argument(
            "-n",
            "--namespace",
            default=component_namespace,
            help="the responder's namespace, where the breaker's ConfigMap lives (default: %(default)s)",
        )
    else:
        parser.add_argument(
            "-n", "--namespace", help="namespace (default: the context's namespace, then 'default')"
        )
    if all_namespaces:
        parser.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="every namespace (overrides -n, as in kubectl)",
        )


def resolve_namespace(args: argparse.Namespace) -> str | None:
    """The namespace a command works in, as kubectl picks it; None for every namespace (-A)."""
    if getattr(args, "all_namespaces", False):
        return None
    if args.namespace:
        return str(args.namespace)
    from gpuhealth.kube.config import ContextError, context_namespace

    try:
        return context_namespace(args.kubeconfig, args.context) or DEFAULT_NAMESPACE
    except ContextError as exc:
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # the client's config loader raises several kinds
        raise UsageError(f"cannot load the kubeconfig: {exc}") from exc
