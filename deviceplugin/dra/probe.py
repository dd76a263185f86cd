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
from collections.abc import Mapping, Sequence

import grpc

from gputopo.node import draslices
from gputopo_proto.dra.v1 import api_pb2 as dra_pb2
from gputopo_proto.dra.v1 import api_pb2_grpc as dra_grpc
from gputopo_proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gputopo_proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

PROG = "deviceplugin.dra.probe"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--driver-name", default=env.get("GPUTOPO_DRA_DRIVER", draslices.DRIVER))
    p.add_argument(
        "--registry-dir", default=env.get("GPUTOPO_DRA_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry")
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    try:
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    reg_path = os.path.join(args.registry_dir, f"{args.driver_name}-reg.sock")
    try:
        with grpc.insecure_channel(f"unix://{reg_path}") as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=args.timeout)
        if info.type != "DRAPlugin" or info.name != args.driver_name or not info.endpoint:
            print(
                f"{PROG}: {reg_path} answers as {info.type!r} {info.name!r}, not our DRA plugin",
                file=sys.stderr,
            )
            return 1
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            dra_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(), timeout=args.timeout
            )
    except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        print(f"{PROG}: no answer from the plugin ({code}): {reg_path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
