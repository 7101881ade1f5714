"""Build the official client's ApiClient from a kubeconfig or the in-cluster config.

The same code points at the simulated cluster (whose kubeconfig the simulator writes) or a
real cluster; the client's configuration handles every kubeconfig form (client
certificates, exec plugins and token refresh, in-cluster service accounts).
"""

from __future__ import annotations

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
