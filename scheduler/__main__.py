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
from scheduler.events import EventEmitter
from scheduler.extender import Extender
from scheduler.metrics import Metrics
from scheduler.server import Server
from scheduler.state import ClusterState, from_cluster

if TYPE_CHECKING:
    from scheduler.kube import KubeState


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
    p.add_argument("--reservation-ttl", type=_positive, default=defaults.RESERVATION_TTL_S, metavar="SECONDS")
    p.add_argument(
        "--gang-spill-after",
        type=_non_negative,
        default=defaults.GANG_SPILL_AFTER_S,
        metavar="SECONDS",
        help="how long a gang waits for one domain of its own level before it takes a slower one, "
        "and a pod of 2+ GPUs for a node at its best ring (0: at once; default %(default)g)",
    )
    p.add_argument(
        "--annotation-max-age", type=_positive, default=defaults.ANNOTATION_MAX_AGE_S, metavar="SECONDS"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"python -m scheduler: error: {message}\n")
    sys.exit(2)


def _live_state(
    kubeconfig: str | None, max_age: float, metrics: Metrics, *, topology_levels: bool = True
) -> ClusterState:
    from gputopo_kube import KubeConfigError, api_client
    from scheduler.kube import KubeState

    try:
        client = api_client(kubeconfig)
    except KubeConfigError as e:
        _fail(f"cannot load Kubernetes configuration: {e}")
    # --levels given: those levels; otherwise the cluster's Kueue/KAI Topology objects may set them
    state = KubeState(
        client, clock=time.time, max_age_s=max_age, metrics=metrics, topology_levels=topology_levels
    )
    state.start()
    return state


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    jsonlog.setup(args.log_level)
    levels: tuple[str, ...] | None = None
    if args.levels is not None:
        try:
            levels = validate_levels(
                [s.strip() for s in args.levels.split(",") if s.strip()], where="--levels"
            )
        except LevelError as e:
            _fail(str(e))
    state: ClusterState
    metrics = Metrics()  # one registry: the watch's per-node counters beside the extender's
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
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    stop.wait()
    server.stop()
    halt = getattr(state, "stop", None)
    if halt is not None:
        halt()
    jsonlog.event(logging.getLogger("gputopo.scheduler"), "stopped", reason="signal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
