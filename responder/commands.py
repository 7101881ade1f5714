"""The operator commands: `gpuhealth quarantine list|show|release|extend` and `gpuhealth breaker
status|reset`, read from and written to the records in the cluster.

They read the `DeviceQuarantine` objects in whichever cluster the kubeconfig names (or the
in-cluster service account), never a local file, so what they print is what the responder and
any other replica act on. `list`, `show` and `breaker status` only read. `release` and `extend`
write a person's change to one record's spec, conditionally, and never its status (the operator
role may not, and an admission policy refuses status writes by anyone but the responder):
`release` writes a request (`spec.releaseRequest`: who, why, when) that the responder carries out
through the release ladder or refuses with the reason (the `ReleaseRequest` condition), `extend`
moves `spec.expiresAt` with who and why in the record's `gpuhealth.io/last-change` annotation.
`breaker reset` writes the breaker's ConfigMap (audited there); with `--backlog discard` the
responder dismisses the deferred records. The `kubectl gpuhealth` plugin shares these arguments
and `run_*` functions.

- `gpuhealth quarantine list [--node NODE] [--phase PHASE] [-o table|wide|json|yaml]`
- `gpuhealth quarantine show NAME | NODE DEVICE [-o table|json|yaml]`
- `gpuhealth quarantine release NAME | NODE DEVICE --actor NAME --reason TEXT`
- `gpuhealth quarantine extend NAME | NODE DEVICE --by DURATION --actor NAME --reason TEXT`
- `gpuhealth breaker status [-o table|json|yaml]`
- `gpuhealth breaker reset --actor NAME --reason TEXT [--backlog reevaluate|discard]`

Exit codes: 0; 1 when the cluster cannot be read (the message says why: no CRD, no access,
unreachable) or the record asked for does not exist (as kubectl answers); 2 for bad flags.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from gpuhealth.cliargs import (
    CommandFailed,
    UsageError,
    add_output_option,
    command,
    positive_duration_seconds,
)
from gpuhealth.clock import Clock, SystemClock
from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import ApiError, Conflict, NotFound
from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from gpuhealth.kube.resources import CONFIG_MAP
from gpuhealth.tables import human_duration, truncate, write_document, write_table
from responder.ladder import LADDER
from responder.reconcile import breaker, requests
from responder.reconcile.breaker_store import NAME as BREAKER_CONFIG_MAP
from responder.reconcile.breaker_store import AuditEntry, BreakerStore, Stored
from responder.reconcile.policy import PolicySettings
from responder.records import (
    ACTIVE_PHASES,
    HELD,
    PHASES,
    QUARANTINES,
    Phase,
    Quarantine,
    RecordError,
    ReleaseRequest,
    from_object,
    record_name,
    to_object,
)

if TYPE_CHECKING:
    from gpuhealth.kube.client import KubeClient

RESPONDER_NAMESPACE = "gpuhealth-system"
"""Where the manifests install the responder (and so the breaker's ConfigMap)."""

CRD_HINT = "kubectl apply -f deploy/crds/"

# The arguments of each operator command, less how the cluster and namespace are named: the
# `kubectl gpuhealth` plugin names those the kubectl way and shares the rest (and the `run_*`).
LIST_HELP = "one line per record"
SHOW_HELP = "one record with its history"
RELEASE_HELP = (
    f"ask the responder to release a device through {LADDER.describe()} (a GPU reset first where "
    "its reset hand-off is on): waits may be shortened, checks and the reset never skipped"
)
BREAKER_STATUS_HELP = "tripped or not, why, and the audit trail"
BREAKER_RESET_HELP = "close a tripped breaker (audited)"
EXTEND_HELP = "move a quarantine's re-evaluation later"


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", help="only this node's devices")
    parser.add_argument("--phase", choices=list(PHASES), help="only records in this phase")
    parser.add_argument(
        "-l", "--selector", help="label selector on the records (e.g. gpuhealth.io/node=gpu-node-1)"
    )
    parser.add_argument("--no-headers", action="store_true", help="leave out the table's header line")
    add_output_option(parser)
    command(parser, run_list)


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    target_argument(parser)
    add_output_option(parser)
    command(parser, run_show)


def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    target_argument(parser)
    parser.add_argument("--actor", required=True, help="who asks (recorded)")
    parser.add_argument("--reason", required=True, help="why (recorded)")
    command(parser, run_release)


def add_breaker_status_arguments(parser: argparse.ArgumentParser) -> None:
    add_output_option(parser)
    command(parser, run_breaker_status)


def add_breaker_reset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actor", required=True, help="who resets it (recorded)")
    parser.add_argument("--reason", required=True, help="why (recorded)")
    parser.add_argument(
        "--backlog",
        choices=["reevaluate", "discard"],
        default="reevaluate",
        help="deferred devices: reevaluate each against its current health (default), or discard them",
    )
    command(parser, run_breaker_reset)


def cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")


def target_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", nargs="+", metavar="NAME | NODE DEVICE", help="the record's name, or its node and device"
    )


def _target_name(args: argparse.Namespace) -> str:
    if len(args.target) == 1:
        return str(args.target[0])
    if len(args.target) == 2:
        return record_name(*args.target)
    raise UsageError("give the record's NAME, or its NODE and DEVICE")


def _list_command(args: argparse.Namespace) -> str:
    """`gpuhealth quarantine list`, or `kubectl gpuhealth quarantine list`: the command's own family."""
    return _sibling(args, "list")


def _sibling(args: argparse.Namespace, verb: str) -> str:
    return str(args.prog).rsplit(" ", 1)[0] + f" {verb}"


def namespace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        default="gpuhealth-system",
        help="the responder's namespace (default: %(default)s)",
    )


def connect(args: argparse.Namespace) -> KubeClient:
    """A KubeClient for the cluster the flags name; the adapters are imported only here."""
    from gpuhealth.kube.client import KubeClient
    from gpuhealth.kube.config import api_client
    from gpuhealth.kube.transport import KubeTransport

    try:
        return KubeClient(KubeTransport(api_client(args.kubeconfig, args.context)))
    except Exception as exc:  # the client's config loader raises several kinds
        raise UsageError(f"cannot load the cluster configuration: {exc}") from exc


def run_list(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out, err, clock = out or sys.stdout, err or sys.stderr, clock or SystemClock()
    objects = _read(lambda c: c.list(QUARANTINES, label_selector=args.selector).items, args, client)
    records: list[Quarantine] = []
    for obj in objects:
        try:
            records.append(from_object(obj))
        except RecordError as exc:
            name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, dict) else "?"
            err.write(f"{args.prog}: warning: {name}: unreadable record ({exc}); skipped\n")
    records = [
        r
        for r in records
        if (not args.node or r.spec.node == args.node)
        and (not args.phase or str(r.status.phase) == args.phase)
    ]
    records.sort(key=lambda r: (r.spec.node, r.spec.device))
    created = {_name(o): _created(o) for o in objects if isinstance(o, dict)}
    if args.output in ("json", "yaml"):
        wanted = {r.name for r in records}
        write_document({"quarantines": [o for o in objects if _name(o) in wanted]}, args.output, out)
        return 0
    if not records:
        filtered = " matching the filters" if args.node or args.phase or args.selector else ""
        out.write(f"No quarantined devices{filtered}.\n")
        return 0
    now = clock.now()
    wide = args.output == "wide"
    headers = ["NAME", "NODE", "DEVICE", "PHASE", "REASON", "ACTION", "AGE", "EXPIRES"]
    if wide:
        headers += ["PATH", "ACTOR", "WAITING FOR"]
    rows = []
    for r in records:
        row = [
            r.name if wide else truncate(r.name, 40),
            r.spec.node,
            r.spec.device,
            str(r.status.phase),
            r.spec.reason,
            r.spec.action,
            _age(created.get(r.name), now),
            _until(parse_rfc3339(r.spec.expires_at), now),
        ]
        if wide:
            row += [r.spec.path or "-", r.spec.actor, r.status.phase_reason or "-"]
        rows.append(row)
    write_table(headers, rows, out, no_headers=args.no_headers)
    return 0


def run_show(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
) -> int:
    out, clock = out or sys.stdout, clock or SystemClock()
    name = _target_name(args)
    try:
        obj = _read(lambda c: c.get(QUARANTINES, name), args, client)
    except NotFound:
        raise CommandFailed(f"no DeviceQuarantine {name!r} (see `{_list_command(args)}`)") from None
    if args.output in ("json", "yaml"):
        write_document(obj, args.output, out)
        return 0
    try:
        record = from_object(obj)
    except RecordError as exc:
        raise CommandFailed(f"{name}: unreadable record ({exc}); `-o yaml` shows it as stored") from exc
    now = clock.now()
    spec, status = record.spec, record.status
    fields = [
        ("Name", record.name),
        ("Node", spec.node),
        ("Device", spec.device),
        ("UUID", spec.uuid or "-"),
        ("Path", spec.path or "(not identified yet)"),
        ("DRA device", "/".join(p for p in (spec.driver, spec.pool, spec.device_name) if p) or "-"),
        ("Action", spec.action),
        ("Reason", spec.reason),
        ("Actor", spec.actor),
        ("Phase", str(status.phase) + (f" ({status.phase_reason})" if status.phase_reason else "")),
        ("Age", _age(_created(obj), now)),
        ("Expires", f"{spec.expires_at} ({_until(parse_rfc3339(spec.expires_at), now)})"),
        ("Source alerts", ", ".join(f"{a.alertname} since {a.starts_at}" for a in spec.source_alerts) or "-"),
    ]
    held = status.condition(HELD)
    if held is not None:
        # Device plugins: where the card's hold by gpuhealth's holder pods stands (their names
        # in the message; `kubectl get pods -n gpuhealth-system -l gpuhealth.io/holder` lists them).
        fields.append(("Hold", f"{held.reason} since {held.last_transition_time}: {held.message}"))
    request = spec.release_request
    if request is not None:
        answer = status.condition(requests.CONDITION)
        fields += [
            ("Release request", f"{request.actor} at {request.requested_at}: {request.reason}"),
            ("Answer", f"{answer.reason}: {answer.message}" if answer is not None else "not answered yet"),
        ]
    width = max(len(label) for label, _ in fields) + 1
    for label, value in fields:
        out.write(f"{label + ':':<{width}} {value}\n")
    out.write("History:\n")
    if not status.history:
        out.write("  (none)\n")
        return 0
    write_table(
        ["  TIME", "PHASE", "ACTOR", "MESSAGE"],
        [[f"  {h.time}", str(h.phase), h.actor, h.message] for h in status.history],
        out,
    )
    return 0


def _read(call: Callable[[Api], Any], args: argparse.Namespace, client: Api | None, *, what: str = "") -> Any:
    with contextlib.ExitStack() as owned:
        active = client if client is not None else owned.enter_context(contextlib.closing(connect(args)))
        try:
            return call(active)
        except NotFound as exc:
            if getattr(exc, "details", {}).get("name"):
                raise  # the object is missing, not the resource type
            raise CommandFailed(
                f"DeviceQuarantine is not served by this cluster: install the CRD ({CRD_HINT})"
            ) from exc
        except ApiError as exc:
            raise CommandFailed(f"cannot reach {what or 'the DeviceQuarantine records'}: {exc}") from exc


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def _created(obj: dict[str, Any]) -> float | None:
    meta = obj.get("metadata")
    return parse_rfc3339(meta.get("creationTimestamp")) if isinstance(meta, dict) else None


def _age(created: float | None, now: float) -> str:
    return human_duration(now - created) if created is not None else "?"


def _until(when: float | None, now: float) -> str:
    if when is None:
        return "?"
    if when >= now:
        return f"in {human_duration(when - now)}"
    return f"{human_duration(now - when)} ago"


def run_breaker_status(
    args: argparse.Namespace, *, client: Api | None = None, out: TextIO | None = None
) -> int:
    out = out or sys.stdout

    def installed(c: Api) -> Stored | None:
        # The install ships the ConfigMap (deploy/base/breaker-configmap.yaml): without it this
        # namespace holds no breaker, which is not the same as a closed one.
        try:
            c.get(CONFIG_MAP, BREAKER_CONFIG_MAP, namespace=args.namespace)
        except NotFound:
            return None
        return BreakerStore(c, args.namespace).read()

    stored = _read(installed, args, client, what="the breaker")
    if stored is None:
        raise CommandFailed(
            f"no breaker found in namespace {args.namespace}: ConfigMap {BREAKER_CONFIG_MAP} is not there "
            "(gpuhealth's install creates it); pass -n/--namespace with the responder's namespace"
        )
    state = stored.state
    if args.output in ("json", "yaml"):
        document = {
            "tripped": state.tripped,
            "trigger": state.trigger,
            "trippedAt": None if state.tripped_at is None else rfc3339(state.tripped_at),
            "detail": state.detail,
            "history": [
                {
                    "time": e.time,
                    "action": e.action,
                    "actor": e.actor,
                    "reason": e.reason,
                    "backlog": e.backlog,
                }
                for e in stored.history
            ],
        }
        write_document(document, args.output, out)
        return 0
    if state.tripped:
        since = "" if state.tripped_at is None else f" since {rfc3339(state.tripped_at)}"
        out.write(f"TRIPPED ({state.trigger}){since}: {state.detail}\n")
        out.write("New automatic quarantines and migrations wait (phase Deferred); releases go on.\n")
    else:
        out.write("closed: automatic quarantines are admitted.\n")
    if stored.history:
        out.write("History:\n")
        write_table(
            ["  TIME", "ACTION", "ACTOR", "BACKLOG", "REASON"],
            [[f"  {e.time}", e.action, e.actor, e.backlog or "-", e.reason] for e in stored.history[-10:]],
            out,
        )
    return 0


def run_breaker_reset(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
) -> int:
    out, clock = out or sys.stdout, clock or SystemClock()
    _audited(args)

    def reset(c: Api) -> tuple[bool, int]:
        store = BreakerStore(c, args.namespace)
        if not store.read().state.tripped:
            return False, 0
        now = clock.now()
        discard = args.backlog == "discard"
        # Only the count: the responder dismisses the deferred records itself (this role may not
        # write their status), those deferred before the reset's time.
        backlog = _deferred_count(c) if discard else 0
        entry = AuditEntry(
            time=rfc3339(now), action="reset", actor=args.actor, reason=args.reason, backlog=args.backlog
        )
        store.write(breaker.reset(store.read().state, discard_at=now if discard else None), entry)
        return True, backlog

    was_tripped, discarded = _read(reset, args, client, what="the breaker")
    if not was_tripped:
        out.write("The breaker is not tripped: nothing to reset.\n")
        return 0
    what = (
        f"the responder dismisses {discarded} deferred device(s)"
        if args.backlog == "discard"
        else "deferred devices are re-evaluated against their current health"
    )
    out.write(f"Breaker reset by {args.actor}: {what}.\n")
    return 0


def _deferred_count(client: Api) -> int:
    count = 0
    for obj in client.list(QUARANTINES).items:
        try:
            count += from_object(obj).status.phase == Phase.DEFERRED
        except RecordError:
            continue
    return count


def run_release(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
) -> int:
    """A person's release is a request the responder carries out through the ladder.

    The command writes `spec.releaseRequest` and nothing else; the responder may shorten the
    ladder's waits for it, never skip a check, and refuses it while a failure or Unhealthy
    evidence stands. What the record itself shows (a failure since its last release, an alert
    still firing) refuses it here too, with the same words, before anything is written; the
    responder's answer (it also reads the device's health) is the `ReleaseRequest` condition.
    """
    out, clock = out or sys.stdout, clock or SystemClock()
    _audited(args)
    settings = PolicySettings()

    def decide_release(record: Quarantine) -> Quarantine:
        if record.status.phase not in ACTIVE_PHASES:
            raise CommandFailed(f"{record.name}: is {record.status.phase}: nothing to release")
        request = ReleaseRequest(f"person/{args.actor}", args.reason, rfc3339(clock.now()))
        asked = replace(record, spec=replace(record.spec, release_request=request))
        given = requests.answer(
            asked, unhealthy=False, wait_seconds=settings.requested_wait_seconds, ladder=settings.rungs
        )
        if given is not None and not given.honoured:
            raise CommandFailed(f"{record.name}: {given.message}")
        return asked

    name = _change(args, client, clock, decide_release, "release requested")
    show = _sibling(args, "show")
    out.write(
        f"{name}: release requested: the responder carries it out through {LADDER.describe()} "
        f"(its answer: `{show} {name}`, condition {requests.CONDITION}).\n"
    )
    return 0


def run_extend(
    args: argparse.Namespace,
    *,
    client: Api | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
) -> int:
    out, clock = out or sys.stdout, clock or SystemClock()
    _audited(args)

    def decide_extend(record: Quarantine) -> Quarantine:
        if record.status.phase not in ACTIVE_PHASES:
            raise CommandFailed(f"{record.name}: is {record.status.phase}: nothing to extend")
        base = max(parse_rfc3339(record.spec.expires_at) or clock.now(), clock.now())
        return replace(record, spec=replace(record.spec, expires_at=rfc3339(base + args.by)))

    name = _change(args, client, clock, decide_extend, f"extended by {args.by:.0f} s")
    out.write(f"{name}: re-evaluation moved {human_duration(args.by)} later.\n")
    return 0


def _audited(args: argparse.Namespace) -> None:
    for flag, value in (("--actor", args.actor), ("--reason", args.reason)):
        if not value.strip():
            raise UsageError(f"{flag} must not be empty: who asked and why are kept (audited)")


LAST_CHANGE = "gpuhealth.io/last-change"
"""Annotation on a record: the last change a person made to its spec (when, who, what, why);
the API server's audit log keeps every one."""


def _change(
    args: argparse.Namespace,
    client: Api | None,
    clock: Clock,
    change: Callable[[Quarantine], Quarantine],
    message: str,
) -> str:
    """Read the record, apply a person's change to its spec and write the spec (conditional).

    Never the status: that is the responder's alone (RBAC, and the admission policy)."""
    name = _target_name(args)

    def apply(c: Api) -> str:
        def attempt() -> str:
            try:
                obj = c.get(QUARANTINES, name)
            except NotFound:
                raise CommandFailed(f"no DeviceQuarantine {name!r} (see `{_list_command(args)}`)") from None
            try:
                record = from_object(obj)
            except RecordError as exc:
                raise CommandFailed(f"{name}: unreadable record ({exc})") from exc
            changed = change(record)
            metadata = dict(obj.get("metadata") or {})
            audit = f"{rfc3339(clock.now())} person/{args.actor}: {message}: {args.reason}"
            metadata["annotations"] = {**(metadata.get("annotations") or {}), LAST_CHANGE: audit}
            c.update(QUARANTINES, {**obj, "metadata": metadata, "spec": to_object(changed)["spec"]})
            return name

        try:
            return retry_on_conflict(attempt, what=name)
        except Conflict:
            raise CommandFailed(f"{name}: the record kept changing under us; try again") from None

    result: str = _read(apply, args, client)
    return result


def add_extend_arguments(parser: argparse.ArgumentParser) -> None:
    target_argument(parser)
    parser.add_argument(
        "--by", required=True, type=positive_duration_seconds, help="how much later (e.g. 12h, 2d)"
    )
    parser.add_argument("--actor", required=True, help="who asks (recorded)")
    parser.add_argument("--reason", required=True, help="why (recorded)")
    command(parser, run_extend)
