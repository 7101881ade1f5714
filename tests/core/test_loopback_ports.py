"""Loopback ports for test servers: outside the kernel's ephemeral range, one slice per test process.

Aspects: a port is below the ephemeral range (outgoing connections never take it between the
pick and the server's bind); each pytest-xdist worker draws from its own slice; a port in use
is never returned.
"""

from __future__ import annotations

import socket

import pytest

from gpuhealth import loopback_ports
from gpuhealth.loopback_ports import HIGH, LOW, SLICES, free_port


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768


def test_a_port_is_below_the_ephemeral_range_and_in_the_worker_s_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ephemeral_low() > HIGH
    width = (HIGH - LOW) // SLICES
    for worker in (0, 3, SLICES + 1):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        start = LOW + (worker % SLICES) * width
        for _ in range(20):
            assert start <= free_port() < start + width


def test_a_port_in_use_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    taken: list[socket.socket] = []
    ports = set()
    try:
        for _ in range(30):
            sock = socket.socket()
            port = free_port()
            sock.bind(("127.0.0.1", port))  # would raise if it were in use
            taken.append(sock)
            ports.add(port)
    finally:
        for sock in taken:
            sock.close()
    assert len(ports) == 30


def test_outside_pytest_xdist_the_first_slice_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert loopback_ports._slice().start == LOW


def test_one_process_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI's chaos run: two servers of one test were given the same port by a random pick per call.
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw6")
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == 500
