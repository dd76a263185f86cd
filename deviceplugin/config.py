"""The plugin's settings, layered flag > environment > config file > default.

One table (`OPTIONS`) names every setting once: its flag, its environment variable, its key
in the versioned YAML file and the parser that turns text (or a YAML value) into a checked
value. The three sources then cannot drift apart, and every bad value is reported the same
way: a `ConfigError` whose message names the source and the setting, which the entry point
prints as one line before exiting with code 2.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import yaml

from deviceplugin import defaults, strategies
from deviceplugin.backend import BandwidthOverrides
from deviceplugin.configoptions import OPTIONS, Option
from deviceplugin.configvalues import LOG_LEVELS, PUBLISH_MODES, STRATEGIES
from gputopo.node.policy import DEFAULT_POLICY
from gputopo.output import add_version_argument
from gputopo.userfile import (
    MAX_CONFIG_BYTES,
    MAX_HEALTH_FILE_BYTES,
    UserFileError,
    check_kubeconfig,
    check_regular,
    read_text,
)

CONFIG_VERSION = "v1"
# sun_path of a unix socket holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which one, where it came from and why."""


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Everything the daemon is told from outside, already checked."""

    kubelet_dir: str = defaults.KUBELET_DIR
    resource_name: str = defaults.RESOURCE_NAME
    socket_name: str = defaults.SOCKET_NAME
    topology: str | None = None
    health_file: str | None = None
    device_list_strategy: str = "envvar"
    ignored_xids: tuple[int, ...] = defaults.IGNORED_XIDS
    health_recovery_seconds: float = defaults.HEALTH_RECOVERY_SECONDS
    fail_on_init_error: bool = True
    metrics_port: int = defaults.METRICS_PORT
    log_level: str = "info"
    node_name: str | None = None
    pod_resources_socket: str = defaults.POD_RESOURCES_SOCKET
    publish: str = "auto"
    kubeconfig: str | None = None
    nvlink_gbps_per_link: float | None = None
    pcie_gbps: tuple[tuple[str, float], ...] | None = None
    policy: str = DEFAULT_POLICY
    config_dir: str | None = None
    node_config_label: str = defaults.NODE_CONFIG_LABEL
    node_config: str | None = None
    pass_device_specs: bool = False
    nvidia_driver_root: str = "/"
    cdi_annotation_prefix: str = strategies.CDI_ANNOTATION_PREFIX

    @property
    def socket_path(self) -> str:
        return os.path.join(self.kubelet_dir, self.socket_name)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.kubelet_dir, defaults.KUBELET_SOCKET_NAME)

    @property
    def bandwidth(self) -> BandwidthOverrides | None:
        if self.nvlink_gbps_per_link is None and self.pcie_gbps is None:
            return None
        return BandwidthOverrides(self.nvlink_gbps_per_link, dict(self.pcie_gbps or ()))

    @property
    def backend_kind(self) -> str:
        return "file" if self.topology else "nvml"


CONFIG_ENV = "GPUTOPO_CONFIG"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as ConfigError (one line, exit 2) instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m deviceplugin",
        description="gputopo device plugin: topology-aware GetPreferredAllocation for kubelet.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config", help=f"versioned YAML config file (version: {CONFIG_VERSION}); env {CONFIG_ENV}"
    )
    add_version_argument(parser)
    for opt in OPTIONS:
        text = f"{opt.help} (env {opt.env}, file key {opt.key})"
        if opt.boolean:
            parser.add_argument(opt.flag, dest=opt.name, nargs="?", const="true", metavar="BOOL", help=text)
        else:
            parser.add_argument(opt.flag, dest=opt.name, metavar=opt.name.upper(), help=text)
    return parser


def read_config_file(path: str) -> dict[str, Any]:
    """The YAML file's settings by field name; unknown keys and a missing version are errors,
    so a typo never silently falls back to a default."""
    try:  # a FIFO, a device or a huge file is refused here, never read (gputopo.userfile)
        doc = yaml.safe_load(read_text(path, MAX_CONFIG_BYTES))
    except UserFileError as e:
        raise ConfigError(f"config file {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: not valid YAML: {str(e).splitlines()[0]}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path}: not UTF-8 text: {e.reason} at byte {e.start}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: not valid YAML: nested too deeply") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"config file {path}: must be a YAML mapping")
    version = doc.get("version")
    if version != CONFIG_VERSION:
        raise ConfigError(f"config file {path}: 'version' must be {CONFIG_VERSION!r}, got {version!r}")
    by_key = {opt.key: opt for opt in OPTIONS}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "version":
            continue
        opt = by_key.get(str(key))
        if opt is None:
            raise ConfigError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(by_key))})")
        out[opt.name] = _checked(opt, value, f"config file {path}: {opt.key}")
    return out


def _checked(opt: Option, value: Any, where: str) -> Any:
    try:
        return opt.parse(value)
    except ValueError as e:
        raise ConfigError(f"{where} {e}") from None


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> PluginConfig:
    """Merge flags, environment and the optional config file (in that precedence) over defaults."""
    args = vars(build_parser().parse_args(list(argv)))
    config_path = args.pop("config", None) or environ.get(CONFIG_ENV) or None
    values: dict[str, Any] = read_config_file(config_path) if config_path else {}
    for opt in OPTIONS:
        if opt.env in environ:
            values[opt.name] = _checked(opt, environ[opt.env], f"environment {opt.env}:")
    for opt in OPTIONS:
        if opt.name in args:
            values[opt.name] = _checked(opt, args[opt.name], f"flag {opt.flag}:")
    known = {f.name for f in fields(PluginConfig)}
    config = PluginConfig(**{k: v for k, v in values.items() if k in known})
    if len(config.socket_path.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"socket path {config.socket_path} is longer than a unix socket allows ({MAX_SOCKET_PATH} bytes)"
        )
    if config.publish == "true" and not config.node_name:
        raise ConfigError("--publish=true needs a node name (--node-name or NODE_NAME)")
    if config.health_file and not config.topology:
        raise ConfigError("--health-file needs --topology (it drives the file backend)")
    _check_files(config)
    return config


def _check_files(config: PluginConfig) -> None:
    """Named files that are there must be regular and small enough (gputopo.userfile): a FIFO
    would hang the first read, /dev/zero exhaust memory. A health file may appear later (it is
    watched), so only one that exists is checked; the topology is checked where it is read."""
    checks: list[tuple[str, Callable[[], None]]] = []
    if config.kubeconfig:
        checks.append(("--kubeconfig", lambda: check_kubeconfig(config.kubeconfig or "")))
    if config.health_file and os.path.lexists(config.health_file):
        checks.append(
            ("--health-file", lambda: check_regular(config.health_file or "", MAX_HEALTH_FILE_BYTES))
        )
    for flag, check in checks:
        try:
            check()
        except UserFileError as e:
            raise ConfigError(f"{flag} {e}") from None


__all__ = [
    "CONFIG_ENV",
    "CONFIG_VERSION",
    "LOG_LEVELS",
    "MAX_SOCKET_PATH",
    "OPTIONS",
    "PUBLISH_MODES",
    "STRATEGIES",
    "ConfigError",
    "Option",
    "PluginConfig",
    "build_parser",
    "load_config",
    "read_config_file",
]
