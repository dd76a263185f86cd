"""Client of the plugin's status service, for `gputopo status` and for tests.

The status service shares the plugin socket, so anyone who can reach the kubelet folder can
ask a running plugin what it advertises, without a port or a kubeconfig.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from gputopo_proto.status.v1 import status_pb2, status_pb2_grpc


class StatusUnavailable(RuntimeError):
    """The plugin could not be asked (no socket, nobody serving, too slow); the message says which."""


def _probe(socket_path: str, timeout: float) -> None:
    """Say in words why nothing can answer at `socket_path`, before gRPC says it in its own
    (`UNAVAILABLE: failed to connect to all addresses; last error: FAILED_PRECONDITION ...`)."""
    try:
        mode = os.stat(socket_path).st_mode
    except FileNotFoundError:
        raise StatusUnavailable(
            f"no plugin socket at {socket_path} (not a GPU node running the gputopo device plugin? "
            "--socket or --kubelet-dir names another)"
        ) from None
    except OSError as e:
        raise StatusUnavailable(f"cannot look at {socket_path}: {e.strerror or e}") from None
    if not stat.S_ISSOCK(mode):
        raise StatusUnavailable(f"{socket_path} is not a socket (a plugin socket is a unix socket)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(socket_path)
    except OSError as e:
        if e.errno == errno.ECONNREFUSED:
            raise StatusUnavailable(
                f"no plugin answers at {socket_path} (a socket left behind by a plugin that stopped?)"
            ) from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise StatusUnavailable(
                f"no permission to connect to {socket_path} (run it in the plugin pod or as root)"
            ) from None
        raise StatusUnavailable(f"cannot connect to {socket_path}: {e.strerror or e}") from None
    finally:
        probe.close()


def fetch_status(socket_path: str, timeout: float = 3.0) -> dict[str, Any]:
    """The plugin's status as a plain dict (proto field names, every field present). Raises
    StatusUnavailable with one line that names the path and says why."""
    _probe(socket_path, timeout)
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            reply = status_pb2_grpc.StatusStub(channel).GetStatus(
                status_pb2.GetStatusRequest(), timeout=timeout
            )
    except grpc.RpcError as e:
        if isinstance(e, grpc.Call):
            code = e.code()
            detail = e.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StatusUnavailable(
                    f"the plugin at {socket_path} did not answer within {timeout:g}s"
                ) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise StatusUnavailable(
                    f"the process at {socket_path} has no gputopo status service (another device plugin?)"
                ) from None
            if code == grpc.StatusCode.UNAVAILABLE:  # it went away between the probe and the call
                raise StatusUnavailable(f"no plugin answers at {socket_path}") from None
            raise StatusUnavailable(
                f"the plugin at {socket_path} answered {code.name}: "
                f"{detail.splitlines()[0] if detail else 'no detail'}"
            ) from None
        raise StatusUnavailable(f"cannot ask the plugin at {socket_path}: {e}") from None
    return _ordered(reply)


def _ordered(message: Message) -> dict[str, Any]:
    """MessageToDict, with keys in the .proto's field order so printed status reads the same way
    every time (MessageToDict puts set fields before defaulted ones)."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.name not in doc:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.is_repeated:
            out[field.name] = [_ordered(v) for v in value]
        elif field.message_type is not None:
            out[field.name] = _ordered(value)
        else:
            out[field.name] = doc[field.name]
    return out
