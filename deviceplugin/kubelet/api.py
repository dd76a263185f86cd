"""What the plugin's servers, servicers and kubelet watcher share about kubelet's side.

The registration state the status service reports, the options the plugin announces (the same
in GetDevicePluginOptions and RegisterRequest). They live
here, not in the watcher (`deviceplugin.kubelet.registration`), so that the server and the servicers
need not import the watcher that drives them: registration -> server -> service, no cycle
(tests/test_plugin_layers.py holds it on the import graph).
"""

from __future__ import annotations

from dataclasses import dataclass

from gputopo_proto.deviceplugin.v1beta1 import api_pb2


@dataclass(frozen=True, slots=True)
class RegistrationInfo:
    """Registration as the status service reports it."""

    registered: bool = False
    last_registration_unix: float | None = None
    count: int = 0
    last_error: str = ""
    failed_attempts: int = 0


def plugin_options() -> api_pb2.DevicePluginOptions:
    """The same options in GetDevicePluginOptions (what kubelet stores) and RegisterRequest."""
    return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
