"""Ports for the loopback servers the tests and the demo start (etcd, the control plane,
Prometheus, Alertmanager, gpuhealth's own processes).

A port the kernel picks for a bind to port 0 comes from the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), the same range every
outgoing connection's local port is drawn from: between the moment it is found free and the
moment the server binds it, any client on the machine (a Prometheus scrape, an HTTP poll) may
take it, and the server fails with "address already in use" (seen in CI with four test
processes). Ports below that range are never given to outgoing connections, so a port picked
there and found free stays free unless another process picks the same one: each test process
(pytest-xdist's `PYTEST_XDIST_WORKER`, `gw<N>`) draws from a slice of its own.
"""

from __future__ import annotations

import os
import random
import socket

LOW, HIGH = 20000, 32760
"""Below the kernel's default ephemeral range, above the well-known and most registered ports."""
SLICES = 8
"""Test processes with slices of their own; more share them (the bind check still applies)."""

_rng = random.Random()
_handed: dict[int, int] = {}
"""Slice start -> how many ports this process has handed out from it: each call takes the next
port (from a random start), so one process never hands out a port twice while its slice lasts
(a random pick per call did: two servers of one test were given the same port)."""


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    width = (HIGH - LOW) // SLICES
    start = LOW + index * width
    return range(start, start + width)


def free_port() -> int:
    """A TCP port on 127.0.0.1, outside the ephemeral range, that was free a moment ago and that
    this process has not handed out before (while its slice lasts)."""
    ports = _slice()
    if ports.start not in _handed:
        _handed[ports.start] = _rng.randrange(len(ports))
    for _ in range(len(ports)):
        taken = _handed[ports.start]
        _handed[ports.start] = taken + 1
        port = ports[taken % len(ports)]
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    # Every port of the slice in use (a machine running far more servers than the tests): the
    # kernel's choice.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found
