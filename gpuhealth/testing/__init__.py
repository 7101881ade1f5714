"""Tooling for the tests and the demo: never imported by a service.

What lives here starts real servers around the code under test (Prometheus and
Alertmanager as child processes, a webhook recorder standing in for receivers) and waits
on them with deadlines. The exporter, the simulated cluster and the rules run without it.
"""
