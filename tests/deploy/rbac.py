"""RBAC as the apiserver evaluates it, over the built manifests, for the deploy tests.

A `Call` is what the simulated apiserver's audit log records for one request; a `Grant` is one
(scope, group, resource, verb) a service account holds through a binding. `unauthorized`
lists calls no grant allows; `unused` lists grants no call needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ALL_NAMESPACES = "*"


@dataclass(frozen=True, order=True)
class Call:
    verb: str
    group: str
    resource: str
    """resource or resource/subresource, as RBAC names it."""
    namespace: str
    """"" for a cluster-scoped object or a request across all namespaces."""

    @classmethod
    def from_audit(cls, event: dict[str, Any]) -> Call:
        resource = event["resource"] + (f"/{event['subresource']}" if event["subresource"] else "")
        return cls(event["verb"], event["group"], resource, event["namespace"])

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{where}"


@dataclass(frozen=True, order=True)
class Grant:
    scope: str
    """A namespace (a RoleBinding's), or ALL_NAMESPACES (a ClusterRoleBinding's)."""
    group: str
    resource: str
    verb: str
    via: str
    """The binding and role that grant it, for messages."""

    def allows(self, call: Call) -> bool:
        if (self.group, self.resource, self.verb) != (call.group, call.resource, call.verb):
            return False
        return self.scope == ALL_NAMESPACES or self.scope == call.namespace

    def __str__(self) -> str:
        where = "everywhere" if self.scope == ALL_NAMESPACES else f"in {self.scope}"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where} (via {self.via})"


def user(namespace: str, service_account: str) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


def grants(objects: Iterable[dict[str, Any]], service_account_user: str) -> list[Grant]:
    """Every grant the bindings in `objects` give `service_account_user` (a ServiceAccount's user,
    `user(namespace, name)`, or a person's user name bound as a `User` subject)."""
    objects = list(objects)
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: list[Grant] = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            (
                s.get("kind") == "ServiceAccount"
                and user(s.get("namespace", ""), s["name"]) == service_account_user
            )
            or (s.get("kind") == "User" and s["name"] == service_account_user)
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "")
        key = (ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])
        if key not in roles:
            raise AssertionError(f"{binding['kind']} {binding['metadata']['name']} refers to a missing {key}")
        scope = ALL_NAMESPACES if binding["kind"] == "ClusterRoleBinding" else namespace
        via = f"{binding['kind']} {binding['metadata']['name']} -> {ref['kind']} {ref['name']}"
        for rule in roles[key].get("rules") or []:
            if rule.get("resourceNames") or rule.get("nonResourceURLs"):
                raise AssertionError(f"{via}: resourceNames/nonResourceURLs are not modelled here")
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        if "*" in (group, resource, verb):
                            raise AssertionError(f"{via}: a wildcard is never least privilege")
                        out.append(Grant(scope, group, resource, verb, via))
    return out


def unauthorized(calls: Iterable[Call], held: list[Grant]) -> list[Call]:
    return sorted({c for c in calls if not any(g.allows(c) for g in held)})


def unused(calls: Iterable[Call], held: list[Grant]) -> list[Grant]:
    calls = set(calls)
    return sorted(g for g in held if not any(g.allows(c) for c in calls))
