"""Prometheus rules and Alertmanager routing for gpuhealth.

This package owns the one configuration of thresholds and selectors (`config.yaml`), the
jinja2 templates that turn it into rule files and an Alertmanager config, and the rendered,
committed outputs under `prometheus/` and `alertmanager/`. Rendering is a pure function
from settings to file texts (`render.py`); `cli.py` is the thin command around it.
Nothing here talks to Prometheus or Kubernetes at run time.
"""
