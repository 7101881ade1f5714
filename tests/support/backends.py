"""The responder's backends as `responder.service` builds them, for tests that wire a responder.

One set per responder, its device-plugin check route, runtime class and DRA device class taken
from the check settings, handed to the checks, the migrator and the holders alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuhealth.kube.api import Api
from gpuhealth.kube.resources import Resource
from responder.checks.jobs import CheckSettings, JobChecks
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import DRA
from responder.records import Quarantine


def shipped(
    client: Api, rules: Resource | None = None, checks: CheckSettings | None = None, **options: Any
) -> Enforcer:
    """The shipped backends over `client` (`rules`: the DeviceTaintRule resource, None: no DRA)."""
    settings = checks or CheckSettings()
    return Enforcer(
        client,
        rules,
        device_class=settings.device_class,
        runtime_class=settings.runtime_class,
        check_route=settings.device_plugin_route,
        **options,
    )


def job_checks(
    client: Api, settings: CheckSettings | None = None, backends: Enforcer | None = None
) -> JobChecks:
    """The check runner over the shipped backends built from the same `settings`."""
    return JobChecks(client, backends or shipped(client, checks=settings), settings)


def identified(record: Quarantine) -> Quarantine:
    """`record` as a first pass identifies it on a cluster where its alert told the truth (a
    `driver` label: a device a ResourceSlice publishes, else a device plugin's): for tests that
    take a webhook's record straight to a backend, without a reconciler or a cluster to ask."""
    path = DRA if record.spec.driver else DEVICE_PLUGIN
    return replace(record, spec=replace(record.spec, path=path))
