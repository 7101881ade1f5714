"""Build the official client's ApiClient from a kubeconfig or the in-cluster config.

The same code points at the simulated cluster (whose kubeconfig the simulator writes) or a
real cluster; the client's configuration handles every kubeconfig form (client
certificates, exec plugins and token refresh, in-cluster service accounts).
"""

from __future__ import annotations

import os

import yaml
from kubernetes import client, config


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An ApiClient for `kubeconfig`, or in-cluster config when none is given and we run in a Pod."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(context=context, client_configuration=configuration)
    return client.ApiClient(configuration)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ContextError(ValueError):
    """The kubeconfig names no such context."""


def context_namespace(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    in_cluster_file: str = SERVICE_ACCOUNT_NAMESPACE,
) -> str | None:
    """The namespace the kubeconfig's context sets, as kubectl reads it for `-n`; None when none.

    `kubeconfig` None means kubectl's own search ($KUBECONFIG, a list of files merged, else
    ~/.kube/config); without any kubeconfig, a Pod's service account namespace. `context` None
    is the current context; one the kubeconfig does not have raises ContextError.
    """
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except config.ConfigException:
        if kubeconfig or context:
            raise
        try:
            with open(in_cluster_file) as file:
                return file.read().strip() or None
        except OSError:
            return None
    name = context or (current or {}).get("name")
    for entry in contexts or ():
        if entry.get("name") == name:
            namespace = (entry.get("context") or {}).get("namespace")
            return namespace if isinstance(namespace, str) and namespace else None
    if context:
        raise ContextError(f"context {context!r} does not exist in the kubeconfig")
    return None


def kubectl_current_context(kubeconfig: str | None = None) -> str | None:
    """The current context as kubectl picks it from a list of kubeconfig files: the first file
    that sets one. The official client lets the last file win, so a command that must agree
    with kubectl names this context explicitly. None when no file sets one (or none is read).

    `kubeconfig` None is $KUBECONFIG (files separated by the path separator), else ~/.kube/config.
    """
    paths = kubeconfig or os.environ.get("KUBECONFIG") or os.path.join("~", ".kube", "config")
    for path in paths.split(os.pathsep):
        if not path:
            continue
        try:
            with open(os.path.expanduser(path)) as file:
                document = yaml.safe_load(file)
        except (OSError, yaml.YAMLError):
            continue  # kubectl skips files it cannot read too; the client reports real errors
        current = document.get("current-context") if isinstance(document, dict) else None
        if isinstance(current, str) and current:
            return current
    return None
