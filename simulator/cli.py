"""`gpuhealth sim`: serve a simulated cluster running a scenario, and print what happens.

Entry point only: argument parsing and progress output; signals are handled by
`gpuhealth.http.stop_on_signals`. The cluster itself is `simulator.runner.SimulatedCluster`
(`--control-plane simulated`, the default), or a real control plane built from upstream,
`simulator.controlplane.ControlPlane` (`--control-plane real`).
Exit codes: 0 stopped as asked, 1 failed at run time (a taken port, a broken built-in, a
component that would not start), 2 bad flags or scenario file.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuhealth.cliargs import (
    CommandFailed,
    UsageError,
    add_output_option,
    command,
    duration_seconds,
    listen_address,
    positive_float,
)
from gpuhealth.http import complete, format_listen, stop_on_signals
from gpuhealth.tables import write_document, write_table
from simulator.apiserver.versions import DEFAULT as DEFAULT_VERSION
from simulator.apiserver.versions import SUPPORTED as SUPPORTED_VERSIONS
from simulator.apiserver.versions import KubernetesVersion, parse_feature_gates
from simulator.fleet import DeviceHealthChanged, FaultApplied, FleetEvent, GpuReset, NodeChanged
from simulator.fleet.extender_client import SchedulerConfigError
from simulator.runner import SimulatedCluster
from simulator.scenario import Scenario, ScenarioError, list_builtins, resolve

if TYPE_CHECKING:  # imported when used: the real control plane needs the dev extra (cryptography)
    from simulator.controlplane import ControlPlane


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="serve a simulated Kubernetes cluster with GPUs and a fault scenario",
        description=(
            "Serve a simulated cluster (Kubernetes API subset over HTTP, simulated kubelets, GPUs, "
            "NVML) running a scenario. Prints the API URL and the kubeconfig path; Ctrl-C stops it."
        ),
    )
    parser.add_argument(
        "--scenario", default="xid-and-unknown", help="built-in name or YAML file (default: %(default)s)"
    )
    parser.add_argument(
        "--control-plane",
        choices=("simulated", "real"),
        default="simulated",
        help="simulated: the in-process apiserver and controllers (fast, the default); real: etcd, "
        "kube-apiserver, kube-controller-manager and kube-scheduler built by tools/upstream/build.py",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        type=listen_address,
        default="127.0.0.1:0",
        help="HOST:PORT, :PORT or [IPv6]:PORT to serve on; port 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig-out", default=None, help="where to write the kubeconfig (default: a temp dir)"
    )
    parser.add_argument(
        "--speed", type=positive_float, default=1.0, help="simulated seconds per wall second (default: 1)"
    )
    parser.add_argument(
        "--kubernetes-version",
        choices=SUPPORTED_VERSIONS,
        default=DEFAULT_VERSION,
        help="the Kubernetes version the API serves as: /version, DeviceTaintRule versions; with "
        "--control-plane real, which pinned build runs (default: %(default)s)",
    )
    parser.add_argument(
        "--feature-gates",
        metavar="GATE=BOOL,...",
        default="",
        help="feature gates, e.g. DRADeviceTaintRules=true (off by default on 1.36; the real control "
        "plane turns on what gpuhealth needs and passes any gate to every component)",
    )
    parser.add_argument(
        "--token-file", default=None, help="require this bearer token (file content) from clients"
    )
    parser.add_argument(
        "--duration",
        type=duration_seconds,
        default=None,
        help="stop after this much simulated time (seconds, or e.g. 90s, 10m, 1h)",
    )
    parser.add_argument(
        "--scheduler-config",
        metavar="FILE",
        default=None,
        help="KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) file: the extenders to call",
    )
    parser.add_argument(
        "--print-events", action="store_true", help="print each device health change written into pod status"
    )
    parser.add_argument("--list-scenarios", action="store_true", help="list the built-in scenarios and exit")
    add_output_option(parser)
    command(parser, run)


def list_scenarios(output: str, out: TextIO) -> None:
    """The built-in scenarios (`-o table|wide|json|yaml`); wide and documents load each one."""
    if output == "table":
        write_table(["NAME", "DESCRIPTION"], [list(row) for row in list_builtins()], out)
        return
    rows: list[dict[str, Any]] = []
    for name, description in list_builtins():
        sc = resolve(name)
        rows.append(
            {
                "name": name,
                "description": description,
                "nodes": len(sc.nodes),
                "gpus": sc.gpu_count(),
                "faults": len(sc.timeline),
            }
        )
    if output == "wide":
        headers = ["NAME", "NODES", "GPUS", "FAULTS", "DESCRIPTION"]
        keys = ("name", "nodes", "gpus", "faults", "description")
        cells = [[str(r[k]) for k in keys] for r in rows]
        write_table(headers, cells, out)
    else:
        write_document({"scenarios": rows}, output, out)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.list_scenarios:
        try:
            list_scenarios(args.output, out)
        except ScenarioError as exc:
            raise CommandFailed(f"built-in scenario is broken: {exc.message}") from exc
        return 0
    try:
        token = None
        if args.token_file:
            token = Path(args.token_file).read_text().strip()
            if not token:
                raise UsageError(f"--token-file {args.token_file}: the file is empty")
        scenario = resolve(args.scenario)
        try:
            gates = parse_feature_gates(args.feature_gates)
            if args.control_plane == "real":
                return _run_real(args, scenario, gates, out)
            version = KubernetesVersion(args.kubernetes_version, gates)
        except ValueError as exc:
            raise UsageError(f"--feature-gates: {exc}") from exc
    except ScenarioError as exc:
        raise UsageError(exc.message) from exc
    except OSError as exc:
        raise UsageError(f"--token-file {args.token_file}: {exc.strerror or exc}") from exc
    listen = format_listen(*args.listen)
    try:
        cluster = SimulatedCluster(
            scenario,
            speed=args.speed,
            listen=listen,
            token=token,
            kubeconfig_out=args.kubeconfig_out,
            kubernetes_version=version,
            scheduler_config=args.scheduler_config,
        )
    except SchedulerConfigError as exc:
        raise UsageError(f"--scheduler-config {exc}") from exc
    try:
        return asyncio.run(_serve(cluster, args, args.duration, out))
    except OSError as exc:  # e.g. the port is taken
        raise CommandFailed(str(exc)) from exc


async def _serve(
    cluster: SimulatedCluster, args: argparse.Namespace, stop_after: float | None, out: TextIO
) -> int:
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    sc = cluster.scenario
    print(
        f"gpuhealth sim: scenario {sc.name}: {len(sc.nodes)} nodes, {sc.gpu_count()} GPUs, "
        f"{len(sc.timeline)} timeline faults; speed {args.speed:g}x; building the fleet...",
        file=out,
        flush=True,
    )
    cluster.fleet.listeners.append(lambda event: _print_event(event, args.print_events, out))
    # Signals stop the run from here on, also while the fleet is still being built.
    with stop_on_signals(stop):
        async with cluster:
            print(f"API server: {cluster.url}", file=out)
            print(f"kubeconfig: {cluster.kubeconfig_path}", file=out)
            print(
                f"{len(cluster.fleet.pods)} pods running. "
                f"Try: KUBECONFIG={cluster.kubeconfig_path} kubectl get nodes (Ctrl-C stops)",
                file=out,
                flush=True,
            )
            if stop_after is not None:
                cluster.fleet.call_at(stop_after, lambda: complete(stop))
            await stop
            status = cluster.fleet.status()
            applied, total = status["timeline"]["applied"], status["timeline"]["total"]
            print(
                f"stopped after {status['simulatedSeconds']:.0f} simulated seconds; "
                f"{applied}/{total} timeline faults applied",
                file=out,
                flush=True,
            )
    return 0


# ----- --control-plane real ---------------------------------------------------------------------


class _Interrupted(Exception):
    """SIGINT or SIGTERM while the real control plane starts or stops."""


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise `_Interrupted` (outside the event loop)."""

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """While the control plane stops: a second Ctrl-C must not leave half of it running."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_real(args: argparse.Namespace, scenario: Scenario, gates: dict[str, bool], out: TextIO) -> int:
    """Start the real control plane, serve it until a signal (or --duration), stop it."""
    from simulator.controlplane import ControlPlane, ControlPlaneError, ControlPlaneSettings
    from simulator.controlplane.scheduler import merged_config

    for flag, value, default in (
        ("--listen", args.listen, ("127.0.0.1", 0)),
        ("--token-file", args.token_file, None),
    ):
        if value != default:
            raise UsageError(
                f"{flag} applies to --control-plane simulated: the real kube-apiserver serves TLS on a "
                "free loopback port and authenticates with client certificates and service-account tokens"
            )
    if args.speed != 1.0:
        raise UsageError(
            "--speed applies to --control-plane simulated: on a real control plane the fleet runs in real "
            "time, so its Lease and status periods meet the real controllers' grace periods"
        )
    if args.scheduler_config:
        try:  # a bad file is the user's input: refuse it before anything starts
            text = Path(args.scheduler_config).read_text()
            merged_config(text, args.scheduler_config, Path(args.scheduler_config))
        except OSError as exc:
            raise UsageError(f"--scheduler-config {args.scheduler_config}: {exc.strerror or exc}") from exc
        except ControlPlaneError as exc:
            raise UsageError(f"--scheduler-config {exc}") from exc
    settings = ControlPlaneSettings(
        kubernetes=args.kubernetes_version,
        feature_gates=gates,
        kubeconfig_out=Path(args.kubeconfig_out) if args.kubeconfig_out else None,
        scheduler_config=Path(args.scheduler_config) if args.scheduler_config else None,
    )
    plane = ControlPlane(settings)
    print(
        f"gpuhealth sim: real control plane, Kubernetes {settings.kubernetes} "
        f"(etcd, kube-apiserver, kube-controller-manager, kube-scheduler); starting...",
        file=out,
        flush=True,
    )
    try:
        try:
            with _signals_raise():
                plane.start()
                timings = ", ".join(f"{k} {v:.1f} s" for k, v in plane.timings.items())
                print(f"started ({timings})", file=out)
                print(f"API server: {plane.url}", file=out)
                print(f"kubeconfig: {plane.kubeconfig_path}", file=out)
                print(f"work directory (logs, audit.log): {plane.workdir}", file=out, flush=True)
        except _Interrupted:
            return 0  # stopped as asked, before it was serving
        except ControlPlaneError as exc:
            raise CommandFailed(str(exc)) from exc
        return asyncio.run(_serve_real(plane, scenario, args, out))
    finally:
        with _signals_ignored():
            plane.stop()


async def _serve_real(plane: ControlPlane, scenario: Scenario, args: argparse.Namespace, out: TextIO) -> int:
    from simulator.controlplane import ControlPlaneError
    from simulator.runner import NodeAgents

    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with stop_on_signals(stop):
        # The agents run in real time: their Lease and status periods then meet the real
        # controllers' default grace periods unchanged (docs/simulator.md, "Time").
        async with NodeAgents(scenario, plane.kubeconfig_path, speed=1.0) as agents:
            agents.fleet.listeners.append(lambda event: _print_event(event, True, out))
            print(
                f"the scenario's fleet ({scenario.name}: {len(scenario.nodes)} nodes) runs as nodes of the "
                "real control plane, in real time; its workloads are Jobs and Deployments for the real "
                f"controllers. Try: KUBECONFIG={plane.kubeconfig_path} kubectl get nodes,pods -A"
                " (Ctrl-C stops)",
                file=out,
                flush=True,
            )
            if args.duration is not None:
                asyncio.get_running_loop().call_later(args.duration, complete, stop)
            while not stop.done():
                try:
                    plane.check_running()
                except ControlPlaneError as exc:
                    raise CommandFailed(str(exc)) from exc
                await asyncio.wait([stop], timeout=1.0)
    print("stopping the fleet and the control plane", file=out, flush=True)
    return 0


def _stamp(time_s: float, wall: float) -> str:
    clock = datetime.fromtimestamp(wall, UTC).strftime("%H:%M:%S")
    return f"[t+{time_s:7.1f}s {clock}]"


def format_event(event: FleetEvent, *, health: bool = True, offset: float = 0.0) -> str | None:
    """One progress line for a fleet event (None for events not shown).

    `offset` is subtracted from the simulated time, for runs whose timeline was shifted.
    """
    stamp = _stamp(event.time - offset, event.wall)
    if isinstance(event, FaultApplied):
        return f"{stamp} fault   {event.fault.describe()}"
    if isinstance(event, NodeChanged):
        return f"{stamp} node    {event.node}: {event.what}"
    if isinstance(event, GpuReset):
        cards = ", ".join(event.uuids) or "every GPU"
        return f"{stamp} reset   {event.node} {cards}: {event.what}" + (
            f" ({event.reason})" if event.reason else ""
        )
    if isinstance(event, DeviceHealthChanged) and health:
        pods = ", ".join(event.pods[:4]) + (f" (+{len(event.pods) - 4} more)" if len(event.pods) > 4 else "")
        line = f"{stamp} health  {event.node}/{event.device}: {event.old} -> {event.new}  pods: {pods}"
        if event.message:
            line += f"  message: {event.message[:80]}"
        return line
    return None


def _print_event(event: FleetEvent, print_health: bool, out: TextIO) -> None:
    line = format_event(event, health=print_health)
    if line is not None:
        print(line, file=out, flush=True)
