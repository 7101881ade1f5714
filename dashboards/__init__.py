"""Grafana dashboards as code: four classic dashboard JSON files generated from Python.

Tooling beside the services (the layer of `demo` and `bench`): `definitions` describes the
Fleet, Device, Remediation and Pipeline health dashboards in our own small dataclasses,
`sdk` is the only module that touches grafana-foundation-sdk, `render` writes
dashboards/<name>.json (committed; `python -m dashboards --check` fails when they are stale),
`queries` reads the panel queries back out of the JSON with the variables substituted, and
`check` asks a live Prometheus whether every panel query returns data.
"""
