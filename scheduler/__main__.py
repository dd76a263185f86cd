"""`python -m scheduler`: the kube-scheduler extender sidecar.

Wires flags to the pieces: a cluster state (a snapshot file, or the API server through the
official client), the Extender, and its HTTP server on loopback. Bad flags or an unreadable
file end the process with exit code 2 and one line on stderr; after start-up nothing a client
sends can stop it. SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, cast

from prometheus_client import start_http_server

from gputopo import jsonlog
from gputopo.network.cluster import ClusterError, load_cluster
from gputopo.network.levels import LevelError, validate_levels
from gputopo.numerals import ascii_uint
from gputopo.output import add_version_argument
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.picture.feed import ClusterState, from_cluster
from scheduler.report.events import EventEmitter
from scheduler.report.metrics import Metrics
from scheduler.web import webhook
from scheduler.web.server import Server

#: A scheduler name as a pod's spec.schedulerName takes it (a DNS-1123 subdomain).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

if TYPE_CHECKING:
    from scheduler.live.kube import KubeState


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    number = ascii_uint(port, max_digits=5)
    if not sep or number is None or not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return (host.strip("[]") or defaults.DEFAULT_HOST), number


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m scheduler", description="gputopo kube-scheduler extender")
    add_version_argument(p)
    p.add_argument(
        "--listen",
        type=_listen,
        default=(defaults.DEFAULT_HOST, defaults.DEFAULT_PORT),
        metavar="HOST:PORT",
        help=f"default {defaults.DEFAULT_HOST}:{defaults.DEFAULT_PORT}",
    )
    p.add_argument(
        "--metrics-listen",
        type=_listen,
        metavar="HOST:PORT",
        help="also serve Prometheus /metrics here, e.g. 0.0.0.0:9403 so Prometheus can scrape it "
        "(the extender port stays on loopback); default: only on --listen",
    )
    p.add_argument(
        "--cluster", metavar="FILE", help="serve a cluster snapshot file instead of the API server"
    )
    p.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    p.add_argument(
        "--levels",
        metavar="KEY,KEY,...",
        help="network levels, smallest domain first (default: the file's; live: the cluster's Topology objects, then the recognised levels)",
    )
    p.add_argument(
        "--reservation-ttl",
        type=_positive,
        default=defaults.RESERVATION_TTL_S,
        metavar="SECONDS",
        help="a gang plan holds its capacity this long without a member binding, then lapses and "
        "the gang is planned again (default %(default)g)",
    )
    p.add_argument(
        "--gang-spill-after",
        type=_non_negative,
        default=defaults.GANG_SPILL_AFTER_S,
        metavar="SECONDS",
        help="opt-in wait: how long a gang with no required level waits for one domain of its own "
        "level before it takes a larger one, and a pod of 2+ GPUs for a node at its best ring "
        "(default %(default)g: placed now in the smallest level that holds it; a pod's "
        "gputopo.io/topology-wait sets its own)",
    )
    p.add_argument(
        "--annotation-max-age",
        type=_positive,
        default=defaults.ANNOTATION_MAX_AGE_S,
        metavar="SECONDS",
        help="a node's gputopo.io/topology annotation older than this is treated as unknown (its "
        "plugin may be gone): GPU count from allocatable, a neutral score (default %(default)g)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe JSON log line written to stderr (default %(default)s)",
    )
    _webhook_arguments(p)
    return p


def _webhook_arguments(p: argparse.ArgumentParser) -> None:
    """The opt-in admission webhook (scheduler/web/webhook.py): off unless --webhook."""
    g = p.add_argument_group('opt-in admission webhook (docs/scheduler.md "Opt-in webhook")')
    g.add_argument(
        "--webhook",
        action="store_true",
        help="serve the mutating admission webhook (HTTPS POST /mutate-pods) that sets schedulerName "
        "on opted-in pods asking for GPUs",
    )
    g.add_argument(
        "--webhook-listen",
        type=_listen,
        default=("0.0.0.0", webhook.DEFAULT_PORT),
        metavar="HOST:PORT",
        help=f"default 0.0.0.0:{webhook.DEFAULT_PORT} (the API server calls it through a Service)",
    )
    g.add_argument(
        "--webhook-tls-dir",
        default=webhook.DEFAULT_TLS_DIR,
        metavar="DIR",
        help="a mounted kubernetes.io/tls Secret: DIR/tls.crt and DIR/tls.key (default %(default)s)",
    )
    g.add_argument("--webhook-cert-file", metavar="FILE", help="certificate (PEM); default DIR/tls.crt")
    g.add_argument("--webhook-key-file", metavar="FILE", help="private key (PEM); default DIR/tls.key")
    g.add_argument(
        "--webhook-scheduler-name",
        default=webhook.DEFAULT_SCHEDULER_NAME,
        metavar="NAME",
        help="the schedulerName set on opted-in GPU pods (default %(default)s)",
    )
    g.add_argument(
        "--webhook-gpu-resource",
        action="append",
        default=[],
        metavar="NAME",
        help="another extended resource that counts as a GPU (repeatable; nvidia.com/gpu always does)",
    )


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"python -m scheduler: error: {message}\n")
    sys.exit(2)


def _live_state(
    kubeconfig: str | None, max_age: float, metrics: Metrics, *, topology_levels: bool = True
) -> ClusterState:
    from gputopo_kube import KubeConfigError, api_client
    from scheduler.live.kube import KubeState

    try:
        client = api_client(kubeconfig)
    except KubeConfigError as e:
        _fail(f"cannot load Kubernetes configuration: {e}")
    # --levels given: those levels; otherwise the cluster's Kueue/KAI Topology objects may set them
    return KubeState(  # started by main, once its Node Events are wired
        client, clock=time.time, max_age_s=max_age, metrics=metrics, topology_levels=topology_levels
    )


def _webhook(args: argparse.Namespace, metrics: Metrics) -> webhook.WebhookServer | None:
    """The webhook server when --webhook, bound before anything else starts: a missing
    certificate exits 2, a busy port 1, each with one line."""
    if not args.webhook:
        return None
    cert, key = webhook.tls_files(args.webhook_tls_dir)
    config = webhook.WebhookConfig(
        cert_file=args.webhook_cert_file or cert,
        key_file=args.webhook_key_file or key,
        scheduler_name=args.webhook_scheduler_name,
        resources=tuple(args.webhook_gpu_resource),
    )
    if not _DNS_LABEL.fullmatch(config.scheduler_name):
        _fail(f"--webhook-scheduler-name {config.scheduler_name!r} is not a valid scheduler name")
    host, port = args.webhook_listen
    try:
        return webhook.WebhookServer(config, host, port, registry=metrics.registry)
    except webhook.TLSFilesError as e:
        _fail(f"webhook: {e}")
    except OSError as e:
        sys.stderr.write(f"python -m scheduler: error: cannot listen on {host}:{port}: {e.strerror or e}\n")
        sys.exit(1)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set: main waits on it, then stops everything it started."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    jsonlog.setup(args.log_level)
    # Handlers before anything that can be seen from outside (the watch, the metrics port, the
    # extender, the webhook): whoever sees one of them answer may send SIGTERM at once, and a
    # signal that comes before the handler kills the process by its default action (exit -15,
    # not 0). Installed here, a signal during start-up only sets `stop`, and the start-up that
    # follows ends at `stop.wait()` straight away.
    stop = _stop_on_signals()
    metrics = Metrics()  # one registry: the watch's per-node counters beside the extender's
    hook = _webhook(args, metrics)
    levels: tuple[str, ...] | None = None
    if args.levels is not None:
        try:
            levels = validate_levels(
                [s.strip() for s in args.levels.split(",") if s.strip()], where="--levels"
            )
        except LevelError as e:
            _fail(str(e))
    state: ClusterState
    if args.cluster:
        try:
            snapshot = load_cluster(args.cluster)
        except ClusterError as e:
            _fail(str(e))
        file_state = from_cluster(snapshot)
        levels = levels or snapshot.levels
        state = file_state
    else:
        state = _live_state(args.kubeconfig, args.annotation_max_age, metrics, topology_levels=levels is None)
    events = None
    core = getattr(state, "core", None)
    if core is not None:  # live: Events where operators look (kubectl describe pod / podgroup)
        kube = cast("KubeState", state)
        events = EventEmitter(core.api_client, pod_uid=kube.pod_uid, group_ref=kube.group_ref)
        kube.guard.notify = events.node_topology  # the annotations it refuses, on their Nodes
        kube.start()
    extender = Extender(
        state,
        levels or defaults.DEFAULT_LEVELS,
        clock=time.time,
        ttl_s=args.reservation_ttl,
        spill_after_s=args.gang_spill_after,
        metrics=metrics,
        events=events,
    )
    annotation_times = getattr(state, "annotation_times", None)  # live mode only: a file's ages mean nothing
    if annotation_times is not None:
        extender.metrics.track_annotation_ages(annotation_times, time.time)
    host, port = args.listen
    try:
        server = Server(extender, host, port)
    except OSError as e:
        sys.stderr.write(f"python -m scheduler: error: cannot listen on {host}:{port}: {e.strerror or e}\n")
        return 1
    if args.metrics_listen is not None:
        mhost, mport = args.metrics_listen
        try:
            start_http_server(mport, addr=mhost, registry=extender.metrics.registry)
        except OSError as e:
            server.stop()
            sys.stderr.write(
                f"python -m scheduler: error: cannot listen on {mhost}:{mport}: {e.strerror or e}\n"
            )
            return 1
        jsonlog.event(logging.getLogger("gputopo.scheduler"), "metrics_listening", address=f"{mhost}:{mport}")
    server.start()
    if hook is not None:
        hook.start()
    stop.wait()
    if hook is not None:
        hook.stop()
    server.stop()
    halt = getattr(state, "stop", None)
    if halt is not None:
        halt()
    jsonlog.event(logging.getLogger("gputopo.scheduler"), "stopped", reason="signal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
