"""What the dashboards are generated for: scrape job names.

The job names of the exporter and the responder come from `rules/config.yaml` (`selectors`),
the file the rules and the deployment read too, so one edit renames a job everywhere.
Alertmanager's own job is not gpuhealth's to name; `alertmanager` is what its Helm chart and
the Prometheus Operator's ServiceMonitor examples call it, and the setting says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rules.render import DEFAULT_CONFIG, load_config

ALERTMANAGER_JOB = "alertmanager"


@dataclass(frozen=True)
class Settings:
    exporter_job: str = "gpuhealth-exporter"
    """Scrape job of the exporters (rules/config.yaml `selectors.exporter_job`)."""
    responder_job: str = "gpuhealth-responder"
    """Scrape job of the responder replicas (rules/config.yaml `selectors.responder_job`)."""
    alertmanager_job: str = ALERTMANAGER_JOB
    """Scrape job of Alertmanager's own /metrics (notification counters)."""

    def __post_init__(self) -> None:
        for name in ("exporter_job", "responder_job", "alertmanager_job"):
            value = getattr(self, name)
            # Written into `job="..."` matchers: a quote or backslash would break every query.
            if not value.strip() or any(c in value for c in '"\\'):
                raise ValueError(
                    f"dashboard settings: {name} must be a job name without quotes, got {value!r}"
                )


def load(rules_config: Path = DEFAULT_CONFIG) -> Settings:
    """Settings with the job names of `rules_config` (its `selectors`)."""
    selectors = load_config(rules_config).selectors
    return Settings(exporter_job=selectors.exporter_job, responder_job=selectors.responder_job)
