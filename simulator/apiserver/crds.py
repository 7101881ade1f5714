"""CustomResourceDefinitions as the simulated apiserver serves them: what a stored CRD makes
servable, and the status the apiextensions controllers would give it.

`established` checks a CRD's schemas (the custom resources are validated against them) and sets
its status in the same write (names accepted, Established, the storage version recorded), where
the real controllers take a moment after it. The store
adds the resulting `ResourceInfo` to its registry when the write commits, and on the CRD's
deletion removes every custom resource first, with events, as the real API does.
"""

from __future__ import annotations

from typing import Any

from simulator.apiserver.resources import ResourceInfo, info_from_crd
from simulator.apiserver.validation import Validator


def established(validator: Validator, crd: dict[str, Any], *, keep_status: bool = False) -> ResourceInfo:
    """The resource `crd` serves, its schemas checked (422 otherwise); sets its status.

    `keep_status`: an update keeps status fields the CRD already has besides those set here."""
    info = info_from_crd(crd)
    validator.check_custom_schemas(info, crd)
    status = crd_status(crd)
    crd["status"] = {**(crd.get("status") or {}), **status} if keep_status else status
    return info


def crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    """The status of a CRD whose names were accepted and which is established."""
    names = (crd.get("spec") or {}).get("names") or {}
    stored = [
        v["name"]
        for v in (crd.get("spec") or {}).get("versions") or ()
        if isinstance(v, dict) and v.get("storage")
    ]
    return {
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": dict(names),
        "storedVersions": stored,
    }


def served_key(crd: dict[str, Any]) -> str:
    """The registry key (`plural.group`) of the resource a CRD defines."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    return f"{names.get('plural')}.{spec.get('group')}"


__all__ = ["crd_status", "established", "served_key"]
