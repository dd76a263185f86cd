"""DRA mode as the start path runs it (deviceplugin/startup.py): how its daemon is built, with
the API server client it publishes through. Light to import, like the device-plugin mode's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deviceplugin.hardware.backend import Backend
from deviceplugin.settings import DRA, PluginConfig
from deviceplugin.startup import InitError, Mode

if TYPE_CHECKING:
    from deviceplugin.dra.daemon import DraDaemon


def check(config: PluginConfig) -> str | None:
    return None  # the node name it needs is a setting: load_config checks it for this mode


def daemon(config: PluginConfig, backend: Backend) -> DraDaemon:
    from deviceplugin.dra.daemon import DraDaemon
    from deviceplugin.dra.kubeapi import for_cluster

    try:
        api = for_cluster(config.kubeconfig)
    except Exception as e:
        raise InitError(f"no API server configuration: {type(e).__name__}: {e}") from None
    return DraDaemon(config, backend, api)


MODE = Mode(DRA, check, daemon)
