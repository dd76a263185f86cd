"""Client of the plugin's status service, for `gputopo status` and for tests.

The status service shares the plugin socket, so anyone who can reach the kubelet folder can
ask a running plugin what it advertises, without a port or a kubeconfig.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from gputopo_proto.status.v1 import status_pb2, status_pb2_grpc


class StatusUnavailable(RuntimeError):
    """The plugin could not be asked (no socket, nobody serving, too slow); the message says which."""


def fetch_status(socket_path: str, timeout: float = 3.0) -> dict[str, Any]:
    """The plugin's status as a plain dict (proto field names, every field present)."""
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
                raise StatusUnavailable(f"no answer within {timeout:g}s") from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise StatusUnavailable("the process on this socket has no gputopo status service") from None
            raise StatusUnavailable(
                f"{code.name}: {detail.splitlines()[0] if detail else 'no detail'}"
            ) from None
        raise StatusUnavailable(str(e)) from None
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
