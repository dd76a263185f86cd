"""`python -m deviceplugin.dra.probe`: the DRA daemon's liveness and readiness probe.

What kubelet needs of the plugin, asked the way kubelet asks it: `GetInfo` on the registration
socket (it must name a DRA plugin and an endpoint), then `NodePrepareResources` with no claims
on that endpoint (the service must answer). A metrics port that answers says only that one
thread lives; this says the two sockets kubelet dials serve. Exit 0 when both answer, 1 with
one line on stderr when not, 2 for a bad flag. Same flags and environment as the daemon for the
folders and the driver name, so the probe finds the sockets the daemon made.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from deviceplugin import settings
from gputopo_proto.dra.v1 import api_pb2 as dra_pb2
from gputopo_proto.dra.v1 import api_pb2_grpc as dra_grpc
from gputopo_proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gputopo_proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

PROG = "deviceplugin.dra.probe"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    # the daemon's own rows of the one settings table: the same flags, environment and parsers
    for name in ("driver_name", "registry_dir"):
        opt = settings.option(name)
        p.add_argument(opt.flag, dest=name, type=_checked(opt.parse), help=f"{opt.help} (env {opt.env})")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    try:
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        defaults = settings.PluginConfig()
        driver = args.driver_name or _from_env(env, "driver_name") or defaults.driver_name
        registry = args.registry_dir or _from_env(env, "registry_dir") or defaults.registry_dir
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    reason = check(driver, registry, args.timeout)
    if reason is not None:
        print(f"{PROG}: {reason}", file=sys.stderr)
        return 1
    return 0


def _checked(parse: Callable[[Any], Any]) -> Callable[[str], Any]:
    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return checked


def _from_env(env: Mapping[str, str], name: str) -> Any:
    opt = settings.option(name)
    if opt.env not in env:
        return None
    try:
        return opt.parse(env[opt.env])
    except ValueError as e:
        raise ValueError(f"environment {opt.env}: {e}") from None


def check(driver_name: str, registry_dir: str, timeout: float) -> str | None:
    """None when both sockets kubelet dials answer as our DRA plugin, else why not (one line).
    The daemon answers its /healthz with this (deviceplugin/dra/daemon.py), so kubelet's httpGet
    probe starts no process; this module's command line runs the same check from outside."""
    reg_path = os.path.join(registry_dir, f"{driver_name}-reg.sock")
    try:
        with grpc.insecure_channel(f"unix://{reg_path}") as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
        if info.type != "DRAPlugin" or info.name != driver_name or not info.endpoint:
            return f"{reg_path} answers as {info.type!r} {info.name!r}, not our DRA plugin"
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            dra_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(), timeout=timeout
            )
    except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        return f"no answer from the plugin ({code}): {reg_path}"
    return None


if __name__ == "__main__":
    sys.exit(main())
