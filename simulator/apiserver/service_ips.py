"""ClusterIP allocation for Services, as the apiserver's service registry does it at create.

Single-stack IPv4 from one service CIDR (kubeadm's default 10.96.0.0/12). The first address
belongs to the `kubernetes` Service; dynamic allocations come from the upper part of the range
(the lower sixteenth is left for addresses clients ask for, as the real allocator prefers), drawn
with the store's seeded random source so runs repeat. Headless Services (`clusterIP: None`) and
ExternalName Services get no address. Every refusal is a 422 worded as the real one.

Pure: the caller passes the addresses in use.
"""

from __future__ import annotations

import ipaddress
import random
from typing import Any

from simulator.apiserver.errors import ApiError, invalid

DEFAULT_SERVICE_CIDR = "10.96.0.0/12"
NONE = "None"


def kubernetes_service_ip(cidr: str = DEFAULT_SERVICE_CIDR) -> str:
    """The address of the `kubernetes` Service: the range's first usable address."""
    return str(ipaddress.IPv4Network(cidr)[1])


def _refuse(name: str, field: str, message: str) -> ApiError:
    return invalid("Service", "", name, [(field, message)])


def _go_strings(values: list[str]) -> str:
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


def allocate(
    service: dict[str, Any], used: set[str], rng: random.Random, cidr: str = DEFAULT_SERVICE_CIDR
) -> None:
    """Fill spec.clusterIP, clusterIPs, ipFamilies and ipFamilyPolicy of a Service being created."""
    name = str(service.get("metadata", {}).get("name", ""))
    spec = service.get("spec")
    if not isinstance(spec, dict):
        return  # schema validation reports it
    spec.setdefault("type", "ClusterIP")
    if spec["type"] == "ExternalName":
        return
    network = ipaddress.IPv4Network(cidr)
    families = spec.get("ipFamilies")
    if isinstance(families, list):
        for i, family in enumerate(families):
            if family != "IPv4":
                raise _refuse(
                    name,
                    f"spec.ipFamilies[{i}]",
                    f'Invalid value: "{family}": not configured on this cluster',
                )
    wanted = spec.get("clusterIP") or next(iter(spec.get("clusterIPs") or ()), None)
    if wanted == NONE:
        ip = NONE
    elif wanted:
        try:
            address = ipaddress.ip_address(str(wanted))
        except ValueError:
            raise _refuse(
                name,
                "spec.clusterIPs[0]",
                f'Invalid value: "{wanted}": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)',
            ) from None
        ip = str(address)
        if address not in network or address in (network.network_address, network.broadcast_address):
            raise _refuse(
                name,
                "spec.clusterIPs",
                f"Invalid value: {_go_strings([ip])}: failed to allocate IP {ip}: the provided IP ({ip}) is "
                f"not in the valid range. The range of valid IPs is {cidr}",
            )
        if ip in used:
            raise _refuse(
                name,
                "spec.clusterIPs",
                f"Invalid value: {_go_strings([ip])}: failed to allocate IP {ip}: "
                "provided IP is already allocated",
            )
    else:
        ip = _dynamic(network, used, rng)
    spec["clusterIP"] = ip
    spec["clusterIPs"] = [ip]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")


def _dynamic(network: ipaddress.IPv4Network, used: set[str], rng: random.Random) -> str:
    size = network.num_addresses
    low = max(2, size // 16)  # the static band: left to clients who ask for an address
    high = size - 2
    for _ in range(64):
        candidate = str(network[rng.randint(low, high)])
        if candidate not in used:
            return candidate
    for offset in range(low, high + 1):  # a nearly full range: take the first free one
        candidate = str(network[offset])
        if candidate not in used:
            return candidate
    raise ApiError(500, "InternalError", "failed to allocate a serviceIP: range is full")


__all__ = ["DEFAULT_SERVICE_CIDR", "allocate", "kubernetes_service_ip"]
