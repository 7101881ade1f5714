"""Entry points: `gpuhealth exporter` and `gpuhealth devices`.

- `gpuhealth exporter --kubeconfig PATH [--node NAME] [--listen HOST:PORT] [--directory PATH]
  [--nvml auto|none|pynvml] [--pod-resources none|unix:///PATH]` observes the cluster (or one
  node) and serves `/metrics`, `/healthz`, `/readyz`. The launcher may add source choices
  (`exporter.sources`): the `gpuhealth` command adds the test harness's `sim:URL` where it imports.
- `gpuhealth exporter ... --shard N --total-shards M` (cluster mode): one of M exporters that
  split the fleet by a stable hash of the node name (`exporter.sharding`); it keeps and exports
  only the nodes of shard N.
- `gpuhealth exporter --from-file DUMP.json --once` reads a `kubectl get
  pods,resourceclaims,resourceslices,leases -A -o json` dump and prints the exposition
  (without `--once` it serves that fixed state instead). Observation times are the time
  the dump is read: a dump carries no observation times, only Lease renewals.
- `gpuhealth devices [--directory PATH] [--node N] [--health H] [-o table|wide|json|yaml]`
  shows what `kubectl describe pod` does not: device health, status age, message and pods,
  read from the device directory; `gpuhealth devices replay [--since T] [-o ...]` prints its
  log, streamed (JSON one document a line, YAML one document per record).

Exit codes (`gpuhealth.cliargs`): 2 bad flags or input (a dump, a kubeconfig, a directory
that cannot be read), 1 failure at run time (the address cannot be bound, the observer died).

This module wires settings, adapters and the state together; it holds no logic of its own
beyond presentation.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import orjson

from exporter import sources
from exporter.devices_view import device_document, device_rows, iso, render_table
from exporter.directory import Directory, DirectoryError, DirectoryReader, open_store
from exporter.podresources import PodResourcesSource
from exporter.settings import (
    DEFAULT_DIRECTORY,
    DEFAULT_HEALTH_PRODUCERS,
    DEFAULT_LISTEN,
    HEALTH_PRODUCER_FORM,
    DirectorySettings,
    ExporterSettings,
    HealthProducer,
    NvmlSettings,
    ObserverSettings,
    check_nvml_source,
    parse_health_producer,
)
from exporter.sharding import Shard
from exporter.snapshot import HEALTH_VALUES
from exporter.state import CLAIMS, LEASES, PODS, SLICES, DeviceStateStore, ObservationRecord
from gpuhealth import http
from gpuhealth.cliargs import (
    CommandFailed,
    UsageError,
    add_output_option,
    command,
    listen_address,
    positive_duration_seconds,
)
from gpuhealth.clock import Clock, SystemClock
from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.fields import SettingsError
from gpuhealth.http import BackgroundTaskFailed, ListenFailed, background, format_listen
from gpuhealth.kube.meta import NoTimeZone, strict_rfc3339
from gpuhealth.nvml import NvmlSource
from gpuhealth.tables import write_document

log = logging.getLogger(__name__)


# ----- registration ----------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    exporter = subparsers.add_parser(
        "exporter",
        help="observe device health (pod status, DRA, NVML) and serve Prometheus metrics",
        description="Observe allocatedResourcesStatus, DRA identities, node Leases and NVML; serve /metrics.",
    )
    exporter.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    exporter.add_argument(
        "--node", help="node mode: only this node's pods, slices and Lease, plus local NVML"
    )
    exporter.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        default="",
        help="exporter-toolkit web configuration: TLS, basic auth, rate limit (as node-exporter's)",
    )
    exporter.add_argument(
        "--listen",
        metavar="HOST:PORT",
        type=listen_address,
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT, :PORT or [IPv6]:PORT to serve on (default {DEFAULT_LISTEN})",
    )
    exporter.add_argument(
        "--directory",
        help=f"device directory SQLite file (default {DEFAULT_DIRECTORY}; offline mode: none unless given)",
    )
    exporter.add_argument(
        "--nvml",
        type=_nvml_source,
        default="auto",
        help=f"{sources.NVML.expected()} (node mode only; default auto)",
    )
    exporter.add_argument(
        "--pod-resources",
        default="none",
        help=f"{sources.POD_RESOURCES.expected()}: the kubelet's allocatable devices as idle "
        "device-plugin GPUs' evidence, from its pod-resources socket (unix:///var/lib/kubelet/"
        "pod-resources/kubelet.sock) (node mode with NVML, device-plugin nodes; default none)",
    )
    exporter.add_argument(
        "--health-producer",
        action="append",
        type=_health_producer,
        metavar=HEALTH_PRODUCER_FORM,
        help="a DRA driver's health producer pods (its kubelet plugin), whose readiness vouches for "
        "that driver's device health; repeatable, `none` for no producer (default: "
        + ", ".join(f"{p.driver}={p.namespace}/{p.selector}" for p in DEFAULT_HEALTH_PRODUCERS)
        + ")",
    )
    exporter.add_argument(
        "--slice-health-driver",
        action="append",
        default=[],
        metavar="DRIVER",
        help="a DRA driver whose device health is its ResourceSlice taints alone, with no health "
        "stream to the kubelet (the NVIDIA DRA driver: gpu.nvidia.com); repeatable (default: none)",
    )
    exporter.add_argument(
        "--shard",
        type=_whole_number,
        default=0,
        metavar="N",
        help="cluster mode: this exporter's shard, 0 to M-1 (default 0)",
    )
    exporter.add_argument(
        "--total-shards",
        type=_whole_number,
        default=1,
        metavar="M",
        help="cluster mode: split the nodes across M exporters by a stable hash of the node name "
        "(FNV-1a 64 modulo M); each keeps and exports only its shard's nodes (default 1: all)",
    )
    exporter.add_argument(
        "--nvml-poll-seconds",
        type=positive_duration_seconds,
        default=NvmlSettings.poll_seconds,
        help=argparse.SUPPRESS,
    )
    exporter.add_argument("--from-file", metavar="DUMP", help="offline: a `kubectl get ... -A -o json` dump")
    exporter.add_argument("--once", action="store_true", help="with --from-file: print the metrics and exit")
    command(exporter, run_exporter)

    devices = subparsers.add_parser(
        "devices",
        help="show device health, status age, message and pods from the device directory",
        description="Device health as the exporter's directory records it (kubectl describe pod shows none).",
    )
    _directory_option(devices)
    devices.add_argument("--node", help="only this node")
    devices.add_argument("--health", choices=HEALTH_VALUES, help="only devices reporting this health")
    add_output_option(devices)
    command(devices, run_devices)
    sub = devices.add_subparsers(dest="devices_command", metavar="{replay}")
    replay = sub.add_parser("replay", help="print the directory's log of status changes")
    _directory_option(replay)
    replay.add_argument("--since", help="RFC3339 time or relative age (30s, 10m, 2h, 1d)")
    replay.add_argument("--node", help="only this node")
    # `text` was this command's name for the table before the vocabulary was shared.
    add_output_option(replay, aliases={"text": "table"})
    command(replay, run_replay)


def _directory_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--directory", default=DEFAULT_DIRECTORY, help=f"device directory file (default {DEFAULT_DIRECTORY})"
    )


def _health_producer(value: str) -> HealthProducer | None:
    if value == "none":
        return None
    try:
        return parse_health_producer(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def health_producers(given: list[HealthProducer | None] | None) -> tuple[HealthProducer, ...]:
    """The producers `--health-producer` names: the shipped ones when absent, none for `none`."""
    if given is None:
        return DEFAULT_HEALTH_PRODUCERS
    if None in given and len(given) > 1:
        raise UsageError("--health-producer none cannot be combined with other producers")
    return tuple(p for p in given if p is not None)


def _whole_number(value: str) -> int:
    try:
        return int(value, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a whole number") from None


def shard_from_args(args: argparse.Namespace) -> Shard:
    """The shard `--shard N --total-shards M` names; UsageError saying what is wrong."""
    if args.node and (args.shard != 0 or args.total_shards != 1):
        raise UsageError(
            "--shard and --total-shards split cluster mode across exporters; "
            "--node (node mode) watches one node already: leave them out"
        )
    if args.total_shards < 1:
        raise UsageError(f"--total-shards {args.total_shards}: expected at least 1")
    if not 0 <= args.shard < args.total_shards:
        last = args.total_shards - 1
        raise UsageError(f"--shard {args.shard}: expected 0 to {last} (--total-shards {args.total_shards})")
    return Shard(args.shard, args.total_shards)


def _nvml_source(value: str) -> str:
    try:
        return check_nvml_source(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ----- gpuhealth exporter --------------------------------------------------------------


def settings_from_args(args: argparse.Namespace) -> ExporterSettings:
    if args.once and not args.from_file:
        raise UsageError("--once goes with --from-file (a live exporter keeps serving)")
    host, port = args.listen
    offline = bool(args.from_file)
    shard = shard_from_args(args)
    if args.web_config_file:
        from gpuhealth.webconfig import WebConfigError, load

        try:
            load(args.web_config_file)  # refused here, before anything starts
        except WebConfigError as exc:
            raise UsageError(f"--web.config.file {exc}") from exc
    try:
        base = ExporterSettings()
        return ExporterSettings(
            observer=ObserverSettings(
                node_name=args.node,
                health_producers=health_producers(args.health_producer),
                slice_health_drivers=tuple(args.slice_health_driver),
                shard=shard,
            ),
            directory=DirectorySettings(
                path=args.directory if args.directory else (None if offline else DEFAULT_DIRECTORY)
            ),
            nvml=NvmlSettings(source=args.nvml, poll_seconds=args.nvml_poll_seconds),
            pod_resources=args.pod_resources,
            server=replace(base.server, host=host, port=port, web_config_file=args.web_config_file),
            kubeconfig=args.kubeconfig,
        )
    except SettingsError as exc:
        raise UsageError(str(exc)) from exc


def run_exporter(args: argparse.Namespace) -> int:
    """`gpuhealth exporter`: exit 2 for bad flags or input, 1 when serving fails."""
    settings = settings_from_args(args)
    try:
        if args.from_file:
            dump = load_dump(args.from_file)
            if args.once:
                sys.stdout.buffer.write(offline_metrics(dump, settings, SystemClock()))
                sys.stdout.flush()
                return 0
            asyncio.run(_serve_static(dump, settings))
            return 0
        tune_collector(settings)
        asyncio.run(serve(settings))
    except DirectoryError as exc:
        raise UsageError(str(exc)) from exc
    except (ListenFailed, BackgroundTaskFailed) as exc:
        raise CommandFailed(str(exc)) from exc
    return 0


def tune_collector(settings: ExporterSettings) -> None:
    """Set the process's young-generation collection threshold (`collector_young_threshold`).

    Process-wide, so only the command does it: `serve` alone (tests, an embedding program)
    leaves the host process's collector as it is."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(settings.collector_young_threshold, middle, oldest)


def _open_directory(
    settings: ExporterSettings, clock: Clock, on_write: Callable[[float], None] | None = None
) -> Directory | None:
    if settings.directory.path is None:
        return None
    return Directory(
        settings.directory.path,
        clock=clock,
        heartbeat_flush_seconds=settings.directory.heartbeat_flush_seconds,
        change_flush_seconds=settings.directory.change_flush_seconds,
        on_write=on_write,
    )


def offline_metrics(dump: dict[str, list[Any]], settings: ExporterSettings, clock: Clock) -> bytes:
    """The exposition for a cluster dump (what `--from-file --once` prints)."""
    from exporter.exposition import render_metrics
    from exporter.observer import persist

    store, directory = _offline_store(dump, settings, clock)
    if directory is not None:
        persist(store, directory, force=True)
        directory.close()
    return render_metrics(store.snapshot(), clock.now())


def _offline_store(
    dump: dict[str, list[Any]], settings: ExporterSettings, clock: Clock
) -> tuple[DeviceStateStore, Directory | None]:
    directory = _open_directory(settings, clock)
    store = open_store(
        directory,
        clock,
        node_name=settings.observer.node_name,
        slice_health_drivers=settings.observer.slice_health_drivers,
        shard=settings.observer.shard,
    )
    # Identities first, so DRA entries resolve on the first pass.
    for resource in (CLAIMS, SLICES, LEASES, PODS):
        items = dump.get(resource, [])
        if settings.observer.node_name and resource == PODS:
            items = [p for p in items if _node_name(p) == settings.observer.node_name]
        store.relist(resource, items)
    errors = store.stats.parse_errors
    if errors:
        # Offline there are no self metrics to count them in: say what was skipped.
        log.warning(
            "dump: skipped or degraded malformed pieces: %s",
            ", ".join(f"{n} {reason}" for reason, n in sorted(errors.items())),
        )
    return store, directory


def _node_name(pod: dict[str, Any]) -> object:
    # A malformed spec belongs to no node; the store counts such pods when it parses them.
    spec = pod.get("spec")
    return spec.get("nodeName") if isinstance(spec, dict) else None


async def _serve_static(dump: dict[str, list[Any]], settings: ExporterSettings) -> None:
    from prometheus_client import CollectorRegistry

    from exporter.observer import persist
    from exporter.self_metrics import ExporterMetrics
    from exporter.server import create_app

    clock = SystemClock()
    store, directory = _offline_store(dump, settings, clock)
    registry = CollectorRegistry()
    metrics = ExporterMetrics(registry, settings.observer.shard)
    metrics.track(store)
    app = create_app(
        settings.server, snapshot=store.snapshot, clock=clock, registry=registry, ready=lambda: True
    )
    served = False

    def started(address: tuple[str, int]) -> None:
        nonlocal served
        served = True
        log.info("serving %d devices from a dump on %s", store.devices_tracked, format_listen(*address))

    ssl_context = _guard(app, settings, metrics)
    try:
        await http.serve(app, settings.server, on_started=started, ssl_context=ssl_context)
    finally:
        if directory is not None:
            if served:
                persist(store, directory, force=True)
            directory.close()


def pod_resources_source(settings: ExporterSettings) -> PodResourcesSource | None:
    """The kubelet pod-resources reader the settings ask for; None when off or in cluster mode."""
    choice, node = settings.pod_resources, settings.observer.node_name
    if node is None:
        return None
    try:
        return sources.POD_RESOURCES.open(choice, node)
    except ValueError as exc:
        raise UsageError(f"--pod-resources {choice}: {exc}") from exc


def nvml_source(settings: ExporterSettings) -> NvmlSource | None:
    """The NVML reader the settings ask for, started; None in cluster mode or without a driver."""
    choice = settings.nvml.source
    node = settings.observer.node_name
    if node is None:
        return None
    try:
        source = sources.NVML.open(choice, node)
    except ValueError as exc:
        raise UsageError(f"--nvml {choice}: {exc}") from exc
    if source is None:
        return None
    if not source.start():
        # The source has said why, once; the exporter carries on without NVML series.
        if choice == "pynvml":
            log.warning("--nvml pynvml: NVML is not available; continuing without NVML readings")
        return None
    return source


async def serve(
    settings: ExporterSettings, *, clock: Clock | None = None, started: asyncio.Event | None = None
) -> None:
    """Run the live exporter until SIGTERM/SIGINT (or cancellation).

    The observer runs as the app's background task: started with it, cancelled when it
    stops; if it dies, serving stops and this raises `gpuhealth.http.BackgroundTaskFailed`.
    A taken address raises `gpuhealth.http.ListenFailed`.
    """
    from prometheus_client import CollectorRegistry

    from exporter.observer import Observer
    from exporter.self_metrics import ExporterMetrics
    from exporter.server import create_app
    from gpuhealth.kube.config import api_client
    from gpuhealth.kube.transport import KubeTransport

    clock = clock or SystemClock()
    registry = CollectorRegistry()
    metrics = ExporterMetrics(registry, settings.observer.shard)
    directory = _open_directory(settings, clock, on_write=metrics.directory_write.observe)
    nvml = nvml_source(settings)
    try:
        store = open_store(
            directory,
            clock,
            node_name=settings.observer.node_name,
            nvml=nvml is not None,
            slice_health_drivers=settings.observer.slice_health_drivers,
            shard=settings.observer.shard,
        )
        metrics.track(store)
        try:
            transport = KubeTransport(api_client(settings.kubeconfig))
        except Exception as exc:
            raise UsageError(f"cannot load the kubeconfig: {exc}") from exc
        observer = Observer(
            transport,
            store,
            clock=clock,
            settings=settings.observer,
            directory=directory,
            metrics=metrics,
            nvml=nvml,
            nvml_poll_seconds=settings.nvml.poll_seconds,
            pod_resources=pod_resources_source(settings) if nvml is not None else None,
        )
        app = create_app(
            settings.server, snapshot=store.snapshot, clock=clock, registry=registry, ready=observer.ready
        )
        app.cleanup_ctx.append(background("observer", observer.run))

        def on_started(address: tuple[str, int]) -> None:
            shard = settings.observer.shard
            log.info(
                "exporter on %s (%s mode, directory %s, NVML %s)",
                format_listen(*address),
                f"node {settings.observer.node_name}"
                if settings.observer.node_name
                else f"cluster, shard {shard.index} of {shard.total}"
                if shard.sharded
                else "cluster",
                settings.directory.path or "in memory",
                "on" if nvml is not None else "off",
            )
            if started is not None:
                started.set()

        await http.serve(
            app, settings.server, on_started=on_started, ssl_context=_guard(app, settings, metrics)
        )
    finally:
        if directory is not None:
            directory.close()
        if nvml is not None:
            nvml.close()


def _guard(app: Any, settings: ExporterSettings, metrics: Any) -> Any:
    """The app behind `--web.config.file` when given: the TLS context to serve with (or None)."""
    if not settings.server.web_config_file:
        return None
    from gpuhealth.web_guard import guard_app
    from gpuhealth.webconfig import WebConfigError

    try:
        guard = guard_app(
            app,
            settings.server.web_config_file,
            on_refused=lambda reason: metrics.http_refused.labels(reason).inc(),
            on_reload_failed=metrics.web_config_reload_failures.inc,
        )
    except WebConfigError as exc:
        raise UsageError(f"--web.config.file {exc}") from exc
    return guard.ssl_context


# ----- dumps ------------------------------------------------------------------------------

_KINDS = {"Pod": PODS, "ResourceClaim": CLAIMS, "ResourceSlice": SLICES, "Lease": LEASES}


def load_dump(path: str) -> dict[str, list[Any]]:
    """Objects of a `kubectl get ... -o json` dump by resource; UsageError naming what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the dump ({exc.strerror})") from exc
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc}); expected `kubectl get ... -o json` output") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object (a List or PodList), found {type(doc).__name__}")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind in _KINDS:
        items: list[Any] = [doc]
    elif isinstance(kind, str) and kind.endswith("List"):
        items = doc.get("items")  # type: ignore[assignment]
        if not isinstance(items, list):
            raise UsageError(f"{path}: {kind} without an `items` array")
    else:
        raise UsageError(f"{path}: `kind` is {kind!r}; expected List, PodList or another *List from kubectl")
    default_kind = kind.removesuffix("List") if isinstance(kind, str) else ""
    out: dict[str, list[Any]] = {PODS: [], CLAIMS: [], SLICES: [], LEASES: []}
    skipped: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise UsageError(f"{path}: items[{index}] is not an object")
        item_kind = item.get("kind") or default_kind
        resource = _KINDS.get(item_kind) if isinstance(item_kind, str) else None
        if resource is None:
            skipped[str(item_kind)] = skipped.get(str(item_kind), 0) + 1
            continue
        out[resource].append(item)
    if skipped:
        log.info("dump: skipped %s", ", ".join(f"{n} {k}" for k, n in sorted(skipped.items())))
    return out


# ----- gpuhealth devices ---------------------------------------------------------------


def run_devices(args: argparse.Namespace, *, clock: Clock | None = None, out: TextIO | None = None) -> int:
    try:
        return _run_devices(args, clock or SystemClock(), out or sys.stdout)
    except DirectoryError as exc:  # the file named is missing or not a directory: bad input
        raise UsageError(str(exc)) from exc


def _run_devices(args: argparse.Namespace, clock: Clock, out: TextIO) -> int:
    reader = DirectoryReader(args.directory)
    try:
        devices = [
            d
            for d in reader.devices()
            if (args.node is None or d.node == args.node) and (args.health is None or d.health == args.health)
        ]
        rows = device_rows(devices, reader.leases(), clock.now())
    finally:
        reader.close()
    if args.output in ("json", "yaml"):
        write_document({"devices": [device_document(d, age) for d, age in rows]}, args.output, out)
        return 0
    if not rows:
        out.write(
            "No devices recorded" + (" matching the filters" if args.node or args.health else "") + ".\n"
        )
        return 0
    render_table(rows, wide=args.output == "wide", out=out)
    return 0


def parse_since(value: str, now: float) -> float:
    """`--since`: an RFC3339 time or an age back from now (30s, 10m, 2h, 1d)."""
    try:
        return now - parse_duration(value, bare_seconds=False)
    except DurationError:
        pass
    try:
        return strict_rfc3339(value.strip()).timestamp()
    except NoTimeZone:
        raise UsageError(f"--since {value!r}: give a time zone (Z or +hh:mm)") from None
    except ValueError as exc:
        raise UsageError(
            f"--since {value!r}: expected RFC3339 (2026-01-15T08:00:00Z) or an age (30s, 10m, 2h, 1d)"
        ) from exc


def record_document(record: ObservationRecord) -> dict[str, Any]:
    return {
        "time": iso(record.observed_at),
        "node": record.node,
        "device": record.device,
        "statusVersion": record.status_version,
        "health": record.health,
        "message": record.message,
        "namespace": record.namespace,
        "pod": record.pod,
        "container": record.container,
        "resource": record.resource,
        "claim": record.claim,
        "podResourceVersion": record.pod_resource_version,
    }


def run_replay(args: argparse.Namespace, *, clock: Clock | None = None, out: TextIO | None = None) -> int:
    try:
        return _run_replay(args, clock or SystemClock(), out or sys.stdout)
    except DirectoryError as exc:
        raise UsageError(str(exc)) from exc


def _run_replay(args: argparse.Namespace, clock: Clock, out: TextIO) -> int:
    since = parse_since(args.since, clock.now()) if args.since else None
    reader = DirectoryReader(args.directory)
    try:
        for record in reader.replay(since):
            if args.node is not None and record.node != args.node:
                continue
            out.write(_replay_line(record, args.output))
    finally:
        reader.close()
    return 0


def _replay_line(record: ObservationRecord, output: str) -> str:
    """One record as streamed by `devices replay`: the log is printed as it is read, so JSON
    is one document a line and YAML one document per record, never a list held in memory."""
    if output == "json":
        return orjson.dumps(record_document(record)).decode() + "\n"
    if output == "yaml":
        import yaml

        return yaml.safe_dump(record_document(record), sort_keys=False, explicit_start=True)
    evidence = f"{record.namespace}/{record.pod}/{record.container}" if record.pod else "-"
    wide = ""
    if output == "wide":
        # What identifies the allocation beyond the pod: for DRA the claim, for device plugins
        # the resource name, and the pod resourceVersion the status was read at.
        wide = f"  {record.resource or '-'}  {record.claim or '-'}  rv={record.pod_resource_version or '-'}"
    message = f"  {record.message}" if record.message else ""
    return (
        f"{iso(record.observed_at)}  {record.node}  {record.device}  v{record.status_version}  "
        f"{record.health}  {evidence}{wide}{message}\n"
    )
