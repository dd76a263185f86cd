"""`python -m deviceplugin.dra` (or `python -m deviceplugin --mode dra`): the DRA node daemon.

Its own flags are below; every other flag, environment variable and config-file key is the
device plugin's (`--topology`, `--health-file`, `--node-name`, `--kubeconfig`, `--metrics-port`,
`--log-level`, the XID and recovery settings …), read by the same loader, so a node moves
between the modes by adding one flag. Exit codes as in device-plugin mode: 2 for a bad flag or
topology (one line on stderr), 1 when the node cannot be served, 0 after SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gputopo import jsonlog

log = logging.getLogger("deviceplugin.dra")
PROG = "deviceplugin --mode dra"


_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class _Error(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Error(message)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not sizes or any(k < 2 or k > 16 for k in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be between 2 and 16, got {text!r}")
    return sizes


def _driver(text: str) -> str:
    if len(text) > 63 or not _DNS.fullmatch(text) or "." not in text:
        raise argparse.ArgumentTypeError(
            f"must be a DNS subdomain with a dot (like gputopo.io), got {text!r}"
        )
    return text


def _max_sets(text: str) -> int:
    from gputopo.node.draslices import MAX_SETS_PER_SIZE

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_SETS_PER_SIZE:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_SETS_PER_SIZE}, got {value}")
    return value


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    from gputopo.node import draslices

    p = _Parser(prog=PROG, add_help=False, allow_abbrev=False)
    p.add_argument(
        "--driver-name",
        type=_driver,
        default=_driver(env.get("GPUTOPO_DRA_DRIVER", draslices.DRIVER)),
        help="DRA driver name: the ResourceSlices' driver and DeviceClass selectors (env GPUTOPO_DRA_DRIVER)",
    )
    p.add_argument(
        "--registry-dir",
        default=env.get("GPUTOPO_DRA_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"),
        help="kubelet's plugin-watcher folder (env GPUTOPO_DRA_REGISTRY_DIR)",
    )
    p.add_argument(
        "--plugins-dir",
        default=env.get("GPUTOPO_DRA_PLUGINS_DIR", "/var/lib/kubelet/plugins"),
        help="parent of the plugin's own folder <plugins-dir>/<driver>/ (env GPUTOPO_DRA_PLUGINS_DIR)",
    )
    p.add_argument(
        "--set-sizes",
        type=_sizes,
        default=_sizes(env.get("GPUTOPO_DRA_SET_SIZES", "2,4,8,16")),
        help="GPU set sizes published as devices (env GPUTOPO_DRA_SET_SIZES; default 2,4,8,16)",
    )
    p.add_argument(
        "--max-sets",
        type=_max_sets,
        default=_max_sets(env.get("GPUTOPO_DRA_MAX_SETS", str(draslices.MAX_SETS_PER_SIZE))),
        help=(
            "most set devices per size, 64 a slice; below the number of sets, a claim can wait"
            f" while GPUs are free (env GPUTOPO_DRA_MAX_SETS; default {draslices.MAX_SETS_PER_SIZE}: every set"
            " of a node of up to 16 GPUs)"
        ),
    )
    p.add_argument("--sysfs", default="/sys", help="sysfs root, for PCIe roots (default /sys)")
    return p


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from deviceplugin.settings import ConfigError, load_config

    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    if "--help" in args or "-h" in args:
        build_parser(env).print_help()
        print("\nEvery other flag is the device plugin's: python -m deviceplugin --help")
        return 0
    from deviceplugin.nodeconfig import NodeConfigUnavailable, resolve

    try:
        ours, rest = build_parser(env).parse_known_args(args)
        config = load_config(rest, env)
        # --config-dir: the node's named config takes --config's place, as in device-plugin mode
        rest, node_config, _chosen_by = resolve(rest, env, config)
        config = load_config(rest, env) if node_config is not None else config
    except (_Error, ConfigError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except NodeConfigUnavailable as e:
        print(f"{PROG}: error: per-node config: {e}", file=sys.stderr)
        return 1
    if not config.node_name:
        print(f"{PROG}: error: DRA mode needs the node name (--node-name or NODE_NAME)", file=sys.stderr)
        return 2
    jsonlog.setup(config.log_level)

    from deviceplugin.dra.daemon import DraDaemon, DraSettings
    from deviceplugin.dra.kubeapi import for_cluster
    from deviceplugin.dra.registrar import RegistrarError
    from deviceplugin.startup import backend_or_exit, stop_on_signals
    from gputopo.node.topology import TopologyError

    stop = stop_on_signals()
    try:
        api = for_cluster(config.kubeconfig)
    except Exception as e:
        print(f"{PROG}: error: no API server configuration: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    backend = backend_or_exit(config, stop, PROG)
    if isinstance(backend, int):
        return backend
    settings = DraSettings(
        node_name=config.node_name,
        driver=ours.driver_name,
        registry_dir=ours.registry_dir,
        plugins_dir=ours.plugins_dir,
        sizes=ours.set_sizes,
        max_sets=ours.max_sets,
        sysfs=ours.sysfs,
        ignored_xids=tuple(config.ignored_xids),
        health_recovery_seconds=config.health_recovery_seconds,
        metrics_port=config.metrics_port,
        backend_kind=config.backend_kind,
    )
    daemon = DraDaemon(settings, backend, api)
    try:
        daemon.start()
    except TopologyError as e:
        print(f"{PROG}: error: topology: {e}", file=sys.stderr)
        return 2 if config.topology else 1
    except (RegistrarError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the backend failed its first probe: one line, no traceback
        print(f"{PROG}: error: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    while not stop.wait(0.5):
        pass
    daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
