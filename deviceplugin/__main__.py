"""`python -m deviceplugin`: run the gputopo device plugin until SIGTERM/SIGINT.

Exit codes: 0 after a signal (socket removed), 2 for any bad flag, environment value, config
file, per-node config name, topology or a kubelet folder that does not exist (one line on
stderr, nothing started), 1 when the node
cannot be served (NVML will not start with --fail-on-init-error, the kubelet folder is not
writable, the Node's config label cannot be read).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.settings import ConfigError, PluginConfig, load_config
from deviceplugin.startup import InitError, backend_or_exit, stop_on_signals
from gputopo import jsonlog

log = logging.getLogger("deviceplugin")
PROG = "deviceplugin"


class NodePublication:
    """The Node annotation publisher and its PodResources reader, started after the daemon."""

    def __init__(self, publisher: Any, pods: Any) -> None:
        self.publisher = publisher
        self.pods = pods

    def stop(self) -> None:
        self.publisher.stop()
        self.pods.close()


def _publication(config: PluginConfig) -> NodePublication | None:
    """`--publish`: false -> none; true -> must work (else InitError); auto -> when it can."""
    if config.publish == "false":
        return None
    if not config.node_name:
        jsonlog.event(log, "publish_disabled", reason="no node name (NODE_NAME / --node-name)")
        return None
    try:
        from deviceplugin.publish.podresources import PodResourcesClient
        from deviceplugin.publish.publisher import for_cluster

        pods = PodResourcesClient(config.pod_resources_socket, config.resource_name)
        # per pod, so the sidecar can free a pod's GPUs as soon as it sees the pod end
        publisher = for_cluster(config.node_name, pods.assignments, kubeconfig=config.kubeconfig)
    except Exception as e:
        reason = f"no API server configuration: {type(e).__name__}: {e}"
        if config.publish == "true":
            raise InitError(f"node publication: {reason}") from None
        jsonlog.event(log, "publish_disabled", logging.WARNING, reason=reason)
        return None
    return NodePublication(publisher, pods)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from deviceplugin.nodeconfig import NodeConfigUnavailable, resolve

    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    mode, args = _mode(args)
    if mode == "dra":  # the DRA node daemon (deviceplugin/dra): its own flags, then ours
        from deviceplugin.dra.__main__ import main as dra_main

        return dra_main(args, env)
    if mode != "device-plugin":
        print(f"{PROG}: error: --mode must be device-plugin or dra, got {mode!r}", file=sys.stderr)
        return 2
    try:
        config = load_config(args, env)
        # --config-dir: the node's named config takes --config's place, then the usual layering
        args, node_config, chosen_by = resolve(args, env, config)
        config = load_config(args, env) if node_config is not None else config
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except NodeConfigUnavailable as e:
        print(f"{PROG}: error: per-node config: {e}", file=sys.stderr)
        return 1
    if not os.path.isdir(config.kubelet_dir):
        # kubelet creates its device-plugin folder (and the DaemonSet mounts it with type
        # Directory); a folder that is not there is a mistyped path, and creating it would
        # serve a socket kubelet never looks at while the plugin seems to start fine.
        print(
            f"{PROG}: error: --kubelet-dir {config.kubelet_dir}: no such directory "
            "(kubelet creates it; is this kubelet's device-plugin folder?)",
            file=sys.stderr,
        )
        return 2
    jsonlog.setup(config.log_level)
    if config.config_dir:
        jsonlog.event(
            log, "node_config", config=node_config, dir=config.config_dir, reason=f"chosen by {chosen_by}"
        )
    # Heavy imports (grpc, numpy) only once the flags are known good: bad flags fail fast.
    from deviceplugin.kubelet.daemon import Daemon
    from deviceplugin.kubelet.server import ServerError
    from gputopo.node.allocator import AllocationError
    from gputopo.node.topology import TopologyError

    stop = stop_on_signals()
    backend = backend_or_exit(config, stop, PROG)
    if isinstance(backend, int):
        return backend

    try:
        publication = _publication(config)  # built (not started) first: a failure starts nothing
    except InitError as e:
        backend.close()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    daemon = Daemon(config, backend)
    try:
        daemon.start()
    except (TopologyError, AllocationError) as e:
        # a topology we were handed is a bad value (2); one NVML found is the node's fact (1)
        return _fail(f"topology: {e}", 2 if config.topology else 1, publication)
    except ServerError as e:
        return _fail(str(e), 1, publication)
    except Exception as e:  # the backend failed its first probe: say why in one line, no traceback
        return _fail(f"cannot start: {type(e).__name__}: {e}", 1, publication)
    if publication is not None:
        daemon.add_listener(publication.publisher.update)  # called at once with the current snapshot
        daemon.add_allocate_listener(publication.publisher.poke)
        publication.publisher.start()
    # Everything built so far (allocator tables, stubs, modules) lives as long as the process:
    # keep it out of the collector's way so a full collection never lands inside an RPC.
    gc.freeze()
    while not stop.wait(0.5):
        pass
    if publication is not None:
        publication.stop()
    daemon.stop()
    _abandon_stragglers(SHUTDOWN_JOIN_SECONDS)
    return 0


def _mode(args: list[str]) -> tuple[str, list[str]]:
    """`--mode dra|device-plugin` (or `--mode=…`) taken out of the arguments."""
    for k, a in enumerate(args):
        if a == "--mode" and k + 1 < len(args):
            return args[k + 1], args[:k] + args[k + 2 :]
        if a.startswith("--mode="):
            return a.partition("=")[2], args[:k] + args[k + 1 :]
    return "device-plugin", args


# After a signal the socket is gone and the server stopped; an RPC handler still running then
# (gRPC cannot interrupt Python code) would hold interpreter exit, which joins every worker
# thread. It gets this long, then the process exits without it: kubelet retries a call whose
# connection dropped, and nothing of ours is left half-written (the socket is already removed).
SHUTDOWN_JOIN_SECONDS = 0.5


def _abandon_stragglers(seconds: float) -> None:
    """Give non-daemon threads `seconds` in all to end; if some still run, flush and _exit(0)."""
    deadline = time.monotonic() + seconds
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive())
    if not left:
        return
    jsonlog.event(
        log,
        "shutdown_abandoned_threads",
        logging.WARNING,
        threads=left[:10],
        count=len(left),
        reason=f"still running {seconds} s after the server stopped (an RPC in flight); exiting anyway",
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _fail(message: str, code: int, publication: NodePublication | None) -> int:
    if publication is not None:
        publication.pods.close()
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
