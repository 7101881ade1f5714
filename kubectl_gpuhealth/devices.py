"""`kubectl gpuhealth devices`: device health, status age, message, pods and quarantine state.

Where the devices come from (one of):
- the cluster (default): the exporter pods (`--exporter-namespace`, `--exporter-selector`),
  each asked for its `GET /api/v1/devices` through the apiserver's pod proxy
  (`pods/NAME:PORT/proxy`, RBAC `get pods/proxy`), so no network path to the pods is needed;
  node-mode pods answer for their node, a cluster-mode pod for all; with `--node` or `--pod`
  only the exporter on that node is asked when there is one;
- `--exporter-url URL` (repeatable): exporters reached directly (a port-forward);
- `--directory FILE`: a device directory file, read-only, as `gpuhealth devices` reads it;
  this mode never contacts the cluster.

Each device is shown with the state of its `DeviceQuarantine` record (cluster modes). What is
shown: with `-n` (or the context's namespace) devices some pod of that namespace holds, with
`-A` every device, idle ones too; `-l` keeps devices held by the pods the selector picks;
`--node` and `--health` filter further. `--pod [NAMESPACE/]NAME` reads that pod: one line per
entry of its `allocatedResourcesStatus` (the kubelet's report now), with the status age the
exporter derives and the record's phase (what `kubectl describe pod` cannot show).

An exporter that does not answer is a warning naming it; the devices the others gave are
printed and the command exits 1, as kubectl does when part of a request fails.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

import orjson

from exporter import devices_view
from exporter.devices_view import Column, Row, ViewError, device_document, read_devices_document
from exporter.directory import DirectoryError, DirectoryReader
from exporter.identity import ClaimInfo, parse_claim
from exporter.settings import DEFAULT_PORT
from exporter.snapshot import HEALTH_VALUES
from gpuhealth.cliargs import CommandFailed, UsageError, add_output_option, command
from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import ApiError, NotFound
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM
from gpuhealth.tables import human_duration, truncate, write_document, write_table
from kubectl_gpuhealth.flags import resolve_namespace
from kubectl_gpuhealth.join import (
    DeviceKey,
    PodDevice,
    claim_names,
    merge_views,
    pod_devices,
    records_by_device,
    select,
)
from responder.commands import CRD_HINT, connect
from responder.records import QUARANTINES, Quarantine, RecordError, from_object

EXPORTER_NAMESPACE = "gpuhealth-system"
EXPORTER_SELECTOR = "app.kubernetes.io/name=gpuhealth-exporter"
FETCH_TIMEOUT_SECONDS = 10.0
MAX_PARALLEL = 16
"""Exporters asked at once: a 1,000-node DaemonSet answers in about 60 rounds, not 1,000."""


def register(
    commands: argparse._SubParsersAction, cluster_flags: Callable[..., None]
) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "devices",
        help="device health, status age, message, pods and quarantine state",
        description=(
            "GPU device health as the gpuhealth exporters see it (kubectl describe pod shows none), "
            "with each device's quarantine state. --pod shows one pod's devices."
        ),
    )
    cluster_flags(parser, all_namespaces=True)
    parser.add_argument("-l", "--selector", help="only devices held by the pods this label selector picks")
    parser.add_argument(
        "--pod",
        metavar="[NAMESPACE/]NAME",
        help="one pod's devices: the kubelet's report, age and quarantine",
    )
    parser.add_argument("--node", help="only this node's devices")
    parser.add_argument("--health", choices=HEALTH_VALUES, help="only devices reporting this health")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--directory", metavar="FILE", help="read a device directory file instead of the cluster"
    )
    source.add_argument(
        "--exporter-url",
        metavar="URL",
        action="append",
        help="ask this exporter directly (repeatable), e.g. http://127.0.0.1:9401 through a port-forward",
    )
    parser.add_argument(
        "--exporter-namespace",
        default=EXPORTER_NAMESPACE,
        help="namespace of the exporter pods (default: %(default)s)",
    )
    parser.add_argument(
        "--exporter-selector",
        default=EXPORTER_SELECTOR,
        help="label selector of the exporter pods (default: %(default)s)",
    )
    parser.add_argument(
        "--exporter-port",
        default=str(DEFAULT_PORT),
        help="the exporters' port, a number or a container port name (default: %(default)s)",
    )
    parser.add_argument(
        "--exporter-scheme",
        choices=("http", "https"),
        default="http",
        help="https where the exporters serve TLS (--web.config.file; docs/web-config.md)",
    )
    parser.add_argument("--no-headers", action="store_true", help="leave out the table's header line")
    add_output_option(parser)
    command(parser, run_devices)
    return parser


@dataclass
class _Report:
    """What one run gathered, and what went wrong on the way (warnings, failures)."""

    prog: str
    err: TextIO
    failed: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        self.err.write(f"{self.prog}: warning: {message}\n")

    def fail(self, message: str) -> None:
        self.failed.append(message)
        self.warn(message)


def run_devices(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out, err, clock = out or sys.stdout, err or sys.stderr, clock or SystemClock()
    namespace = resolve_namespace(args)
    _check(args)
    report = _Report(args.prog, err)
    if args.directory:
        rows = _directory_rows(args.directory, clock)
        shown = select(rows, namespace=namespace, node=args.node, health=args.health)
        _print_devices(args, shown, None, namespace, out, err)
        return 0
    with contextlib.ExitStack() as owned:
        active = client if client is not None else owned.enter_context(contextlib.closing(connect(args)))
        if args.pod:
            return _run_pod(args, active, namespace, report, out, err)
        pods = _selected_pods(active, args.selector, namespace) if args.selector else None
        rows = _gather(args, active, args.node, report)
        records = _records(active, report)
        shown = select(rows, namespace=namespace, node=args.node, health=args.health, pods=pods)
        _print_devices(args, shown, records, namespace, out, err)
    return 1 if report.failed else 0


def _check(args: argparse.Namespace) -> None:
    if args.directory and (args.pod or args.selector):
        raise UsageError("--pod and -l read pods from the cluster; --directory reads only a local file")
    if args.pod and (args.selector or args.node or args.health):
        raise UsageError("--pod shows one pod's devices: -l, --node and --health do not apply")
    for url in args.exporter_url or ():
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--exporter-url {url!r}: expected an http:// or https:// URL")


def _pod_target(text: str, namespace: str | None) -> tuple[str, str]:
    ns, slash, name = text.rpartition("/")
    if not slash:
        ns = namespace or "default"
    if not name or (slash and not ns) or "/" in ns:
        raise UsageError(f"--pod {text!r}: expected NAME or NAMESPACE/NAME")
    return ns, name


# ----- sources -------------------------------------------------------------------------


def _directory_rows(path: str, clock: Clock) -> list[Row]:
    try:
        reader = DirectoryReader(path)
    except DirectoryError as exc:
        raise UsageError(str(exc)) from exc
    try:
        return devices_view.device_rows(reader.devices(), reader.leases(), clock.now())
    finally:
        reader.close()


def _gather(args: argparse.Namespace, client: Api, node: str | None, report: _Report) -> list[Row]:
    """Every answering exporter's rows, merged; CommandFailed when none answered."""
    if args.exporter_url:
        fetches = [(url, _url_fetch(url)) for url in args.exporter_url]
    else:
        fetches = _pod_fetches(args, client, node)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(fetches))) as pool:
        answers = list(pool.map(lambda f: _answer(*f), fetches))
    views = []
    for (what, _), (rows, problem) in zip(fetches, answers, strict=True):
        if problem is not None:
            report.fail(f"{what}: {problem}")
        else:
            views.append(rows)
    if not views:
        raise CommandFailed(f"no exporter answered ({len(fetches)} asked; see the warnings above)")
    return merge_views(views)


def _answer(what: str, fetch: Callable[[], Any]) -> tuple[list[Row], str | None]:
    try:
        _, rows = read_devices_document(fetch())
    except ViewError as exc:
        return [], f"not a device view ({exc})"
    except (ApiError, OSError, ValueError) as exc:
        return [], str(exc) or type(exc).__name__
    return rows, None


def _url_fetch(url: str) -> Callable[[], Any]:
    def fetch() -> Any:
        target = url.rstrip("/") + devices_view.PATH
        try:
            with urllib.request.urlopen(target, timeout=FETCH_TIMEOUT_SECONDS) as answer:
                return orjson.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise OSError(f"GET {target}: HTTP {exc.code}") from exc
        except urllib.error.URLError as exc:
            raise OSError(f"GET {target}: {exc.reason}") from exc

    return fetch


def _pod_fetches(
    args: argparse.Namespace, client: Api, node: str | None
) -> list[tuple[str, Callable[[], Any]]]:
    namespace, selector = args.exporter_namespace, args.exporter_selector
    try:
        pods = client.list(POD, namespace=namespace, label_selector=selector).items
    except ApiError as exc:
        raise CommandFailed(f"cannot list the exporter pods in {namespace}: {exc}") from exc
    if not pods:
        raise CommandFailed(
            f"no exporter pods in namespace {namespace!r} match {selector!r}: install the exporter, "
            "or name it with --exporter-namespace/--exporter-selector, --exporter-url or --directory"
        )
    if node is not None:
        # A node-mode exporter on the node knows its devices; without one, a cluster-mode one may.
        on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
        pods = on_node or pods
    names = sorted(str(p["metadata"]["name"]) for p in pods)
    return [
        (
            f"exporter pod {namespace}/{name}",
            partial(
                client.proxy_get,
                POD,
                name,
                devices_view.PATH,
                namespace=namespace,
                port=args.exporter_port,
                scheme="https" if args.exporter_scheme == "https" else "",
            ),
        )
        for name in names
    ]


def _records(client: Api, report: _Report) -> dict[DeviceKey, Quarantine] | None:
    """The records by device; None (with a warning) when the cluster does not serve them."""
    try:
        objects = client.list(QUARANTINES).items
    except NotFound:
        report.warn(f"DeviceQuarantine is not served by this cluster ({CRD_HINT}): quarantine state unknown")
        return None
    except ApiError as exc:
        report.warn(f"cannot read the DeviceQuarantine records ({exc}): quarantine state unknown")
        return None
    records = []
    for obj in objects:
        try:
            records.append(from_object(obj))
        except RecordError as exc:
            report.warn(f"{(obj.get('metadata') or {}).get('name', '?')}: unreadable record ({exc}); skipped")
    return records_by_device(records)


def _selected_pods(client: Api, selector: str, namespace: str | None) -> set[tuple[str, str]]:
    try:
        pods = client.list(POD, namespace=namespace, label_selector=selector).items
    except ApiError as exc:
        raise CommandFailed(f"cannot list pods with -l {selector!r}: {exc}") from exc
    return {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}


# ----- output --------------------------------------------------------------------------


def _quarantine_document(record: Quarantine | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "name": record.name,
        "phase": str(record.status.phase),
        "phaseReason": record.status.phase_reason,
        "action": record.spec.action,
        "reason": record.spec.reason,
        "actor": record.spec.actor,
        "expiresAt": record.spec.expires_at,
    }


def _phase(record: Quarantine | None) -> str:
    return str(record.status.phase) if record is not None else "-"


def _none_found(namespace: str | None, err: TextIO, what: str = "devices") -> None:
    # As kubectl: the note goes to stderr, so a script reading stdout sees nothing.
    where = f" in {namespace} namespace" if namespace is not None else ""
    err.write(f"No {what} found{where}.\n")


def _print_devices(
    args: argparse.Namespace,
    rows: list[Row],
    records: dict[DeviceKey, Quarantine] | None,
    namespace: str | None,
    out: TextIO,
    err: TextIO,
) -> None:
    def record(device_key: DeviceKey) -> Quarantine | None:
        return records.get(device_key) if records is not None else None

    if args.output in ("json", "yaml"):
        docs = []
        for device, age in rows:
            doc = device_document(device, age)
            if records is not None:
                doc["quarantine"] = _quarantine_document(record((device.node, device.device)))
            docs.append(doc)
        write_document({"devices": docs}, args.output, out)
        return
    if not rows:
        _none_found(namespace, err)
        return
    extra: list[Column] = []
    if records is not None:
        extra = [
            Column("QUARANTINE", lambda d, _: _phase(record((d.node, d.device)))),
            Column(
                "RECORD",
                lambda d, _: getattr(record((d.node, d.device)), "name", "-"),
                wide_only=True,
            ),
        ]
    devices_view.render_table(
        rows, wide=args.output == "wide", out=out, extra=extra, no_headers=args.no_headers
    )


# ----- --pod ---------------------------------------------------------------------------


def _run_pod(
    args: argparse.Namespace,
    client: Api,
    namespace: str | None,
    report: _Report,
    out: TextIO,
    err: TextIO,
) -> int:
    pod_namespace, name = _pod_target(args.pod, namespace)
    try:
        pod = client.get(POD, name, namespace=pod_namespace)
    except NotFound:
        raise CommandFailed(f'pods "{name}" not found in namespace {pod_namespace}') from None
    except ApiError as exc:
        raise CommandFailed(f"cannot read pod {pod_namespace}/{name}: {exc}") from exc
    claims = _claims(client, pod_namespace, claim_names(pod), report)
    node = str((pod.get("spec") or {}).get("nodeName") or "") or None
    rows: list[Row] = []
    if node is not None:
        # Without any exporter the kubelet's report is still worth printing; the warnings say why.
        with contextlib.suppress(CommandFailed):
            rows = _gather(args, client, node, report)
    records = _records(client, report)
    found = pod_devices(pod, claims, rows, records or {})
    _print_pod(args, pod_namespace, name, node, found, records is not None, out, err)
    return 1 if report.failed else 0


def _claims(client: Api, namespace: str, names: list[str], report: _Report) -> dict[str, ClaimInfo]:
    claims = {}
    for name in names:
        try:
            parsed = parse_claim(client.get(RESOURCE_CLAIM, name, namespace=namespace))
        except ApiError as exc:
            report.warn(f"ResourceClaim {namespace}/{name}: {exc}; its devices stay unresolved")
            continue
        if isinstance(parsed, str):
            report.warn(f"ResourceClaim {namespace}/{name}: {parsed}; its devices stay unresolved")
            continue
        claims[name] = parsed
    return claims


def _print_pod(
    args: argparse.Namespace,
    namespace: str,
    name: str,
    node: str | None,
    found: list[PodDevice],
    records_known: bool,
    out: TextIO,
    err: TextIO,
) -> None:
    if args.output in ("json", "yaml"):
        document = {
            "apiVersion": devices_view.API_VERSION,
            "kind": "PodDeviceList",
            "pod": {"namespace": namespace, "name": name, "node": node},
            "devices": [_pod_device_document(d, records_known) for d in found],
        }
        write_document(document, args.output, out)
        return
    if not found:
        err.write(
            f"Pod {namespace}/{name} reports no device health (no allocatedResourcesStatus: it holds no "
            "device, is not running, or its kubelet is older than 1.36).\n"
        )
        return
    wide = args.output == "wide"
    headers = ["CONTAINER", "RESOURCE", "DEVICE", "HEALTH", "AGE", "QUARANTINE"]
    if wide:
        headers += ["RESOURCE-ID", "VERSION", "RECORD"]
    headers.append("MESSAGE")
    rows = []
    for d in found:
        exported = d.exporter
        row = [
            d.container,
            d.resource,
            d.device or "<unresolved>",
            d.health,
            human_duration(exported[1]) if exported is not None else "?",
            _phase(d.quarantine) if records_known else "?",
        ]
        if wide:
            row += [
                d.resource_id,
                str(exported[0].status_version) if exported is not None else "?",
                d.quarantine.name if d.quarantine is not None else "-",
            ]
        row.append(d.message if wide else truncate(d.message or "-", 48))
        rows.append(row)
    write_table(headers, rows, out, no_headers=args.no_headers)


def _pod_device_document(d: PodDevice, records_known: bool) -> dict[str, Any]:
    exported = d.exporter
    doc: dict[str, Any] = {
        "container": d.container,
        "resource": d.resource,
        "resourceID": d.resource_id,
        "node": d.node,
        "device": d.device or None,
        "health": d.health,
        "message": d.message,
        "statusAgeSeconds": round(exported[1], 3) if exported is not None else None,
        "exporter": device_document(*exported) if exported is not None else None,
    }
    if records_known:
        doc["quarantine"] = _quarantine_document(d.quarantine)
    return doc
