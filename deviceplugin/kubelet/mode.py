"""Device-plugin mode as the start path runs it (deviceplugin/startup.py): its one check before
starting and how its daemon is built. Light to import: the daemon's modules (grpc, numpy) load
when `daemon` is called, after the flags are known good."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from deviceplugin.hardware.backend import Backend
from deviceplugin.settings import DEVICE_PLUGIN, PluginConfig
from deviceplugin.startup import InitError, Mode
from gputopo import jsonlog

if TYPE_CHECKING:
    from deviceplugin.kubelet.daemon import Daemon
    from deviceplugin.publish.publisher import NodePublication

log = logging.getLogger("deviceplugin")


def check(config: PluginConfig) -> str | None:
    if not os.path.isdir(config.kubelet_dir):
        # kubelet creates its device-plugin folder (and the DaemonSet mounts it with type
        # Directory); a folder that is not there is a mistyped path, and creating it would
        # serve a socket kubelet never looks at while the plugin seems to start fine.
        return (
            f"--kubelet-dir {config.kubelet_dir}: no such directory "
            "(kubelet creates it; is this kubelet's device-plugin folder?)"
        )
    return None


def publication(config: PluginConfig) -> NodePublication | None:
    """`--publish`: false -> none; true -> must work (else InitError); auto -> when it can."""
    if config.publish == "false":
        return None
    if not config.node_name:
        jsonlog.event(log, "publish_disabled", reason="no node name (NODE_NAME / --node-name)")
        return None
    from deviceplugin.publish.publisher import NodePublication

    try:
        return NodePublication.for_cluster(
            config.node_name, config.kubeconfig, config.pod_resources_socket, config.resource_name
        )
    except Exception as e:
        reason = f"no API server configuration: {type(e).__name__}: {e}"
        if config.publish == "true":
            raise InitError(f"node publication: {reason}") from None
        jsonlog.event(log, "publish_disabled", logging.WARNING, reason=reason)
        return None


def daemon(config: PluginConfig, backend: Backend) -> Daemon:
    from deviceplugin.kubelet.daemon import Daemon

    return Daemon(config, backend, publication=publication(config))


MODE = Mode(DEVICE_PLUGIN, check, daemon)
