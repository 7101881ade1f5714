"""Path names come from the shipped backends: the CRD's enum and the metrics' values follow them.

Aspect: a record's `spec.path` names the backend that enforces it (`responder.enforce.backends`);
each backend declares its own, so adding one is its module plus its entry in
`responder.enforce.shipped.Enforcer`, and the CRD and the migration metric are held to them here.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from responder.enforce.shipped import Enforcer
from responder.migrate.executor import Migrator, MigratorMetrics, MigratorSettings

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
SHIPPED = Enforcer(None, None)


def test_the_crds_path_enum_is_the_shipped_backends_paths() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    [version] = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert sorted(spec["properties"]["path"]["enum"]) == sorted(SHIPPED.paths)
    # The webhook stores no path: the reconciler's first pass that a backend claims the device on does.
    assert "path" not in spec["required"]


def test_the_backends_claim_in_their_declared_order_with_distinct_paths() -> None:
    assert SHIPPED.paths == tuple(b.path for b in SHIPPED.ordered)
    assert len(set(SHIPPED.paths)) == len(SHIPPED.paths)
    # DRA claims first: a device a ResourceSlice publishes is DRA's, whatever its node advertises.
    assert SHIPPED.paths.index("dra") < SHIPPED.paths.index("device-plugin")
    holds = {b.path: b.holds_card for b in SHIPPED.ordered}
    assert (holds["dra"], holds["device-plugin"]) == (False, True)


def test_the_migration_recovery_metric_starts_with_one_series_per_backend_path() -> None:
    registry = CollectorRegistry()
    Migrator(
        None,  # type: ignore[arg-type]  (constructing reads nothing)
        MigratorSettings(),
        ManualClock(0.0),
        metrics=MigratorMetrics(registry),
        backends=SHIPPED,
    )
    paths = {
        s.labels["path"]
        for m in registry.collect()
        if m.name == "gpuhealth_migration_recovery_seconds"
        for s in m.samples
    }
    assert paths == set(SHIPPED.paths)
