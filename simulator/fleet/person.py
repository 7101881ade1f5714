"""The person at the keyboard: the timeline's actions (`simulator.model.ACTIONS`) through the API.

What an operator or a tenant does with kubectl while the fleet runs, written as kubectl writes
it and through the same seam the node agents use (`node_api.NodeApi`), so it reaches whichever
API server the fleet runs beside: the simulated one in process, or a real kube-apiserver over
HTTP. Nothing here touches the fleet's records; the controllers of that control plane answer:

- `scale`: `kubectl scale deployment/NAME --replicas=N`. The simulated cluster does not serve
  the scale subresource (`docs/simulator.md`, "Deliberately unsupported"), so it is the patch
  that kubectl's fallback and `kubectl edit` make: `spec.replicas` of the Deployment. The real
  Deployment and ReplicaSet controllers, or for the scenario's own workloads on the simulated
  control plane the fleet's (`job_controller`), add or remove pods.
- `delete-pods`: `kubectl delete pods -n NS -l SELECTOR [--field-selector spec.nodeName=NODE]`:
  every matching pod deleted with its own grace period, as kubectl does; a pod already gone
  between the list and its delete is no error (kubectl's `--ignore-not-found` is what a person
  who races a controller sees anyway).
"""

from __future__ import annotations

import logging
from typing import Any

from simulator.apiserver.errors import ApiError
from simulator.fleet.node_api import PODS, NodeApi
from simulator.model import Fault

log = logging.getLogger(__name__)

DEPLOYMENTS = "deployments.apps"


class Person:
    """Carries out a timeline action (`Fault.is_action`) through `api`."""

    def __init__(self, api: NodeApi) -> None:
        self._api = api

    def act(self, action: Fault) -> list[str]:
        """Do `action`; returns what it changed, one `namespace/name` per object (for the log)."""
        if action.kind == "scale":
            return self._scale(action)
        if action.kind == "delete-pods":
            return self._delete_pods(action)
        raise ValueError(f"not a person's action: {action.kind}")

    def _scale(self, action: Fault) -> list[str]:
        assert action.workload is not None and action.replicas is not None
        replicas = action.replicas

        def patch(obj: dict[str, Any]) -> None:
            obj.setdefault("spec", {})["replicas"] = replicas

        try:
            self._api.mutate(DEPLOYMENTS, action.workload, action.namespace, patch)
        except ApiError as exc:
            # kubectl prints the server's answer and exits 1; the run goes on, as a person's would.
            log.warning("scale deployment %s/%s: %s", action.namespace, action.workload, exc)
            return []
        return [f"{action.namespace}/{action.workload}"]

    def _delete_pods(self, action: Fault) -> list[str]:
        field = f"spec.nodeName={action.node}" if action.node is not None else None
        try:
            pods = self._api.list(
                PODS, action.namespace, label_selector=action.selector, field_selector=field
            )
        except ApiError as exc:
            log.warning("list pods -n %s -l %s: %s", action.namespace, action.selector, exc)
            return []
        deleted = []
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue  # already terminating: kubectl's delete changes nothing for it
            try:
                self._api.delete(PODS, meta["name"], meta["namespace"])
            except ApiError as exc:
                if exc.code != 404:  # gone since the list: what the person wanted
                    log.warning("delete pod %s/%s: %s", meta["namespace"], meta["name"], exc)
                continue
            deleted.append(f"{meta['namespace']}/{meta['name']}")
        return deleted
