"""`kubectl gputopo nodes | topo NODE | why POD`, the command line.

Flags as kubectl plugins take them (`--kubeconfig`, `--context`, `-n/--namespace`), before or
after the command; `-o json|yaml|wide` (`--json` = `-o json`) and `--version` on every command.
Exit codes: 0 success, 1 the API server could not answer (one line), 2 bad input (one line,
never a traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from kubernetes import client

from gputopo.cli import render_topo, topo_document
from gputopo.gang.sources import COMPOSITE_API, SourceError, dig
from gputopo.network import annotation
from gputopo.node.allocator import MAX_GPUS, AllocatorPool
from gputopo.output import add_output_arguments, add_version_argument, ago, dump, is_machine
from gputopo_kube import KubeConfigError, user_configuration
from kubectl_gputopo import views
from kubectl_gputopo.api import ApiError, Reader

PROG = "kubectl gputopo"
# RFC 1123: what the API server accepts as a Node/Pod name (subdomain) and a namespace (label).
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class UsageError(Exception):
    """Bad input: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _name(text: str, what: str, *, prefix: str = "") -> str:
    if prefix and text.startswith(prefix + "/"):
        text = text[len(prefix) + 1 :]
    if len(text) > 253 or not _SUBDOMAIN.fullmatch(text):
        raise UsageError(f"{what} {text!r} is not a valid Kubernetes name (lower-case RFC 1123)")
    return text


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """kubectl's connection flags; SUPPRESS lets them stand before or after the command."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace of POD (default: the context's)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=10.0 if top else argparse.SUPPRESS,
        help="seconds per request",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="What gputopo sees on GPU nodes and why it placed a pod.")
    add_version_argument(parser)
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("nodes", help="GPU nodes: GPUs, free, healthy, best ring per size, annotation age")
    p.add_argument("-l", "--selector", help="label selector, as kubectl's")
    p.add_argument("--resource", default="nvidia.com/gpu", help="GPU resource name (default nvidia.com/gpu)")
    p.add_argument(
        "--max-age",
        type=float,
        default=views.DEFAULT_MAX_AGE_S,
        help=f"seconds after which an annotation is stale (default {views.DEFAULT_MAX_AGE_S:g}, the sidecar's)",
    )
    _common(p, top=False)
    add_output_arguments(p)

    p = sub.add_parser("topo", help="a node's link matrix, from its gputopo.io/topology annotation")
    p.add_argument("node", help="node name (or node/NAME)")
    _common(p, top=False)
    add_output_arguments(p)

    p = sub.add_parser("why", help="the sidecar's decision for a pod or its gang, or why it waits")
    p.add_argument("pod", help="pod name (or pod/NAME) in -n NAMESPACE")
    _common(p, top=False)
    add_output_arguments(p)
    return parser


def _reader(args: argparse.Namespace) -> tuple[Reader, str]:
    try:
        cfg, namespace = user_configuration(args.kubeconfig, args.context)
    except KubeConfigError as e:
        raise UsageError(str(e)) from None
    cfg.retries = 0  # one answer or one error line, not three silent retries
    return Reader(client.ApiClient(cfg), timeout=args.request_timeout), args.namespace or namespace


def _nodes(reader: Reader, args: argparse.Namespace, now: float) -> int:
    pool = AllocatorPool()
    rows = []
    nodes = reader.nodes(args.selector)
    by_node: dict[str, list[dict[str, Any]]] = {}
    if nodes:
        for event in reader.gputopo_node_events(tuple(views.NODE_PROBLEM_REASONS)):
            name = views.event_row(event)["object"].removeprefix("node/")
            by_node.setdefault(name, []).append(event)
    for node in nodes:
        row = views.node_row(
            node,
            now=now,
            max_age_s=args.max_age,
            pool=pool,
            resource=args.resource,
            events=by_node.get(str((node.get("metadata") or {}).get("name")), ()),
        )
        if row is not None:
            rows.append(row)
    rows.sort(key=lambda r: r["name"])
    print(
        dump(rows, args.output)
        if is_machine(args.output)
        else views.render_nodes(
            rows,
            wide=args.output == "wide",
            resource=args.resource,
            unserved=views.unserved_gpu_nodes(nodes, {r["name"] for r in rows}),
            skipped=views.skipped_gpu_nodes(nodes, {r["name"] for r in rows}),
        )
    )
    return 0


def _topo(reader: Reader, args: argparse.Namespace, now: float) -> int:
    name = args.node
    node = reader.node(name)
    raw = views.annotations_of(node).get(views.TOPOLOGY_ANNOTATION)
    try:
        value = annotation.decode(raw if isinstance(raw, str) else None, now=now, max_age_s=math.inf)
    except annotation.AnnotationError as e:
        print(f"{PROG}: node {name}: {views.TOPOLOGY_ANNOTATION}: {e}", file=sys.stderr)
        return 1
    topo = value.topology
    if topo.n > MAX_GPUS:
        print(
            f"{PROG}: node {name}: {topo.n} GPUs; nodes of more than {MAX_GPUS} are not supported",
            file=sys.stderr,
        )
        return 1
    age = now - value.generated_at
    state = {
        "node": name,
        "annotation_age_s": round(age, 3),
        "plugin_version": value.plugin_version,
        "unhealthy": sorted(value.unhealthy),
        "allocated": sorted(value.allocated),
        "free": sorted(value.free),
    }
    if is_machine(args.output):
        print(dump(state | {"topology": topo_document(topo)}, args.output))
        return 0
    print(render_topo(topo, wide=args.output == "wide"))
    print()
    print(
        f"node {name}: annotation {ago(age)} (plugin {value.plugin_version or '?'}); "
        f"free {_list(state['free'])}; allocated {_list(state['allocated'])}; "
        f"unhealthy {_list(state['unhealthy'])}"
    )
    return 0


def _list(xs: list[int]) -> str:
    return ",".join(map(str, xs)) or "none"


def _why(reader: Reader, args: argparse.Namespace, namespace: str, now: float) -> int:
    if len(namespace) > 63 or not _LABEL.fullmatch(namespace):
        raise UsageError(f"namespace {namespace!r} is not a valid Kubernetes namespace")
    name = args.pod
    pod = reader.pod(namespace, name)
    gang_error = None
    try:
        gang = views.gang_of(pod)
    except SourceError as e:
        gang, gang_error = None, str(e)
    gang_object = None
    members: list[dict[str, Any]] = [pod]
    events = reader.events(namespace, "Pod", name)
    tree = None
    if gang is not None:
        if gang.source.api is not None:
            gang_object = reader.gang_object(gang.source.api, namespace, gang.name)
        pods = reader.pods(namespace)
        if gang.source.api is not None and dig(
            gang_object, "spec", "parentCompositePodGroupName"
        ):  # a PodGroup under a CompositePodGroup: the gang is the whole tree
            tree = views.composite_tree(
                gang,
                namespace,
                gang_object,
                reader.gang_objects(gang.source.api, namespace),
                reader.gang_objects(COMPOSITE_API, namespace),
            )
        if tree is not None:
            members = [p for p in pods if views.tree_member(p, namespace, tree) is not None]
            kind, _, root = tree.object.partition("/")
            events += reader.events(namespace, kind, root)  # the gang's Events are on its root
        else:
            members = [p for p in pods if views.same_gang(views.member_gang(p), gang)]
        events += reader.events(namespace, views.object_kind(gang), gang.name)
        predicted = views.predictions(reader.events_by_reason(namespace, "Pod", views.PREDICTED_REASON))
    else:
        predicted = {}
    doc = views.why_document(
        pod,
        gang=gang,
        gang_object=gang_object,
        members=members,
        events=events,
        gang_error=gang_error,
        predicted=predicted,
        tree=tree,
    )
    print(
        dump(doc, args.output)
        if is_machine(args.output)
        else views.render_why(doc, now=now, wide=args.output == "wide")
    )
    return 0


def _check(args: argparse.Namespace) -> None:
    """Every flag and name checked before the first request: bad input changes nothing."""
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise UsageError(
            f"--request-timeout must be a positive number of seconds, got {args.request_timeout}"
        )
    if args.command == "nodes" and not (math.isfinite(args.max_age) and args.max_age > 0):
        raise UsageError(f"--max-age must be a positive number of seconds, got {args.max_age}")
    if args.command == "topo":
        args.node = _name(args.node, "node", prefix="node")
    if args.command == "why":
        args.pod = _name(args.pod, "pod", prefix="pod")
    if args.namespace is not None and (len(args.namespace) > 63 or not _LABEL.fullmatch(args.namespace)):
        raise UsageError(f"namespace {args.namespace!r} is not a valid Kubernetes namespace")


def _run(args: argparse.Namespace) -> int:
    _check(args)
    reader, namespace = _reader(args)
    now = time.time()
    if args.command == "nodes":
        return _nodes(reader, args, now)
    if args.command == "topo":
        return _topo(reader, args, now)
    return _why(reader, args, namespace, now)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(build_parser().parse_args(argv))
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
