"""The plugin's settings, for both modes, in one table. Here are the defaults, the value
parsers, the table of options, and the loading that layers flag > environment > config file >
default into one frozen `PluginConfig`.

One table (`OPTIONS`) names every setting once: its flag, its environment variable, its key in
the versioned YAML file and the parser that turns text (or a YAML value) into a checked value.
The three sources then cannot drift apart, and every bad value is reported the same way: a
`ConfigError` whose message names the source and the setting, which the entry point prints as
one line before exiting with code 2. Each parser is total: it returns the value or raises
`ValueError` with a reason, which the loader wraps into that `ConfigError`.

Both plugin modes read this one table (issue 30): an `Option` names the modes that use it, and
`--help` of each mode lists its own options first; the other mode's are still accepted and
checked (a node moves between the modes by adding `--mode dra`, its other settings unchanged),
never used. A new setting is one `PluginConfig` field and one `Option` row here (plus its
parser when no existing one fits), and the docs' table (docs/deviceplugin.md, or docs/dra.md
for a DRA one). Choosing a per-node config file from a mounted ConfigMap by the Node's label is a
separate job, with an API call: `deviceplugin.nodeconfig`.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import yaml

from deviceplugin import strategies
from deviceplugin.hardware.backend import BandwidthOverrides
from gputopo.node import draslices
from gputopo.node.links import PCIE_LEVELS
from gputopo.node.policy import DEFAULT_POLICY, POLICY_NAMES
from gputopo.output import add_version_argument
from gputopo.userfile import (
    MAX_CONFIG_BYTES,
    MAX_HEALTH_FILE_BYTES,
    UserFileError,
    check_kubeconfig,
    check_regular,
    read_text,
)

# --- Defaults (flags, env vars and the config file override them; daemon constants beside them).

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
RESOURCE_NAME = "nvidia.com/gpu"
SOCKET_NAME = "gputopo-gpu.sock"
METRICS_PORT = 9402  # 0 disables the metrics server
TOPOLOGY_ANNOTATION = "gputopo.io/topology"
IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
NODE_CONFIG_LABEL = "gputopo.io/config"  # Node label naming its config in --config-dir

# Device plugin daemon (deviceplugin/kubelet/daemon.py and friends).
KUBELET_SOCKET_NAME = "kubelet.sock"  # kubelet's Registration socket inside KUBELET_DIR
API_VERSION = "v1beta1"
CDI_KIND = "nvidia.com/gpu"  # CDI devices are named CDI_KIND=<uuid>
HEALTH_RECOVERY_SECONDS = 300.0  # 0: an unhealthy GPU stays unhealthy until restart
WATCH_INTERVAL_SECONDS = 0.15  # how often the kubelet folder is polled
REGISTER_BACKOFF_SECONDS = (0.2, 5.0)  # first and largest wait between failed Register calls
REGISTER_TIMEOUT_SECONDS = 10.0  # kubelet dials back inside Register (its own timeout: 10 s)
NVML_RETRY_SECONDS = 30.0  # NVML init retry period when fail-on-init-error is off
# DRA mode (deviceplugin/dra): kubelet's plugin-watcher folder and the parent of the plugin's own.
DRA_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DRA_PLUGINS_DIR = "/var/lib/kubelet/plugins"
SYSFS = "/sys"
# Longest device-ID list (and most container requests) one RPC may carry. kubelet lists the
# devices this plugin advertised, at most gputopo.node.allocator.MAX_GPUS (16); 4x that leaves room
# for IDs of GPUs since replaced (kubelet may still offer them) and for larger nodes, while
# keeping every request's work tiny. Longer lists are INVALID_ARGUMENT before any per-ID work.
MAX_REQUEST_IDS = 64


# --- Value parsers: text from a flag or env var, or a YAML value, to one checked value.

STRATEGIES = strategies.STRATEGIES  # the names --device-list-strategy accepts (plus "cdi")
PUBLISH_MODES = ("auto", "true", "false")
LOG_LEVELS = ("debug", "info", "warning", "error")
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def parse_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    if "\0" in value:  # only YAML can carry one; every path and name would fail later, less clearly
        raise ValueError("must not contain a NUL character")
    return value.strip()


def parse_socket_path(value: Any) -> str:
    """Absolute: gRPC reads `unix://a/b` as host `a`, so a relative path could never be served."""
    return os.path.abspath(parse_text(value))


def parse_optional_text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_text(value)


def parse_choice(options: Sequence[str]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = parse_text(value).lower()
        if text not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {value!r}")
        return text

    return parse


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def parse_port(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be a port number 0..65535, got {value!r}")
    try:
        port = int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a port number 0..65535, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"must be a port number 0..65535, got {value!r}")
    return port


def parse_seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}")
    try:
        seconds = float(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}")
    return seconds


def parse_xids(value: Any) -> tuple[int, ...]:
    items: list[Any]
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, str):
        items = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    else:
        raise ValueError(f"must be a comma-separated list of XID numbers, got {value!r}")
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{item!r} is not an XID number")
        try:
            xid = int(str(item))
        except ValueError:
            raise ValueError(f"{item!r} is not an XID number") from None
        if xid < 0:
            raise ValueError(f"{item!r} is not an XID number")
        out.append(xid)
    return tuple(sorted(set(out)))


def parse_resource(value: Any) -> str:
    text = parse_text(value)
    if not _RESOURCE_RE.match(text) or len(text) > 253:
        raise ValueError(f"must be an extended resource name like nvidia.com/gpu, got {value!r}")
    return text


def parse_socket_name(value: Any) -> str:
    text = parse_text(value)
    if "/" in text or text in (".", "..", KUBELET_SOCKET_NAME):
        raise ValueError(f"must be a plain file name other than {KUBELET_SOCKET_NAME}, got {value!r}")
    return text


def parse_gbps(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"must be a positive number of GB/s, got {value!r}")
    try:
        gbps = float(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a positive number of GB/s, got {value!r}") from None
    if not 0 < gbps < float("inf"):
        raise ValueError(f"must be a positive number of GB/s, got {value!r}")
    return gbps


def parse_pcie_gbps(value: Any) -> tuple[tuple[str, float], ...] | None:
    """`PIX=24,PXB=20` (flag/env) or a mapping (YAML) of PCIe level -> GB/s."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        items = []
        for part in (p.strip() for p in value.split(",") if p.strip()):
            level, sep, number = part.partition("=")
            if not sep:
                raise ValueError(f"must look like PIX=24,SYS=6, got {value!r}")
            items.append((level.strip(), number.strip()))
    else:
        raise ValueError(f"must look like PIX=24,SYS=6, got {value!r}")
    out: dict[str, float] = {}
    for level, number in items:
        name = level.upper()
        if name not in PCIE_LEVELS:
            raise ValueError(f"unknown PCIe level {level!r} (one of {', '.join(PCIE_LEVELS)})")
        try:
            gbps = parse_gbps(number)
        except ValueError as e:
            raise ValueError(f"{level}: {e}") from None
        if gbps is None:
            raise ValueError(f"{level} needs a number of GB/s")
        out[name] = gbps
    return tuple(sorted(out.items()))


_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_label_key(value: Any) -> str:
    """A Kubernetes label key: optional DNS-subdomain prefix and '/', then a name of <= 63."""
    text = parse_text(value)
    prefix, _, name = text.rpartition("/")
    if not _LABEL_NAME_RE.match(name) or (
        prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix))
    ):
        raise ValueError(f"must be a label key like gputopo.io/config, got {value!r}")
    return text


def parse_config_name(value: Any) -> str | None:
    """A ConfigMap key (the name of one config in --config-dir)."""
    text = parse_optional_text(value)
    if text is not None and not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", text):
        raise ValueError(f"must be a ConfigMap key (letters, digits, '-', '_', '.'), got {value!r}")
    return text


def parse_strategy_list(value: Any) -> str:
    """`envvar,cdi-cri` (canonical order, comma-joined: the status API reports it as text)."""
    return ",".join(strategies.parse_strategies(value))


def parse_log_level(value: Any) -> str:
    return parse_choice(LOG_LEVELS)(value)


def parse_driver_name(value: Any) -> str:
    """A DRA driver name: the ResourceSlices' `driver` and the DeviceClasses' attribute domain,
    so a DNS subdomain of at most 63 characters with a dot, like gputopo.io."""
    text = parse_text(value)
    if len(text) > 63 or not _DNS_SUBDOMAIN_RE.match(text) or "." not in text:
        raise ValueError(f"must be a DNS subdomain with a dot (like gputopo.io), got {value!r}")
    return text


def parse_set_sizes(value: Any) -> tuple[int, ...]:
    """GPU set sizes, `2,4,8` (flag/env) or a YAML list, each 2..16 (a node's most GPUs here)."""
    items: list[Any]
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, str):
        items = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    else:
        raise ValueError(f"must be comma-separated integers, got {value!r}")
    sizes: set[int] = set()
    for item in items:
        try:
            if isinstance(item, bool):
                raise ValueError
            sizes.add(int(str(item).strip()))
        except ValueError:
            raise ValueError(f"must be comma-separated integers, got {value!r}") from None
    if not sizes or any(k < 2 or k > 16 for k in sizes):
        raise ValueError(f"sizes must be between 2 and 16, got {value!r}")
    return tuple(sorted(sizes))


def parse_max_sets(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be an integer, got {value!r}")
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be an integer, got {value!r}") from None
    if not 1 <= count <= draslices.MAX_SETS_PER_SIZE:
        raise ValueError(f"must be between 1 and {draslices.MAX_SETS_PER_SIZE}, got {count}")
    return count


# --- The one table of settings.

DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
#: The plugin's modes (`--mode`): kubelet's device-plugin API, or a DRA driver (docs/dra.md).
MODES = (DEVICE_PLUGIN, DRA)


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # PluginConfig field
    flag: str  # --flag
    env: str  # environment variable
    key: str  # YAML key
    parse: Callable[[Any], Any]
    help: str
    boolean: bool = False
    #: The modes that use the setting; the others accept and check it, and never read it.
    modes: tuple[str, ...] = MODES


OPTIONS: tuple[Option, ...] = (
    Option(
        "kubelet_dir",
        "--kubelet-dir",
        "GPUTOPO_KUBELET_DIR",
        "kubeletDir",
        parse_socket_path,
        "kubelet device-plugin folder holding kubelet.sock and the plugin's socket",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "resource_name",
        "--resource-name",
        "GPUTOPO_RESOURCE_NAME",
        "resourceName",
        parse_resource,
        "extended resource advertised to kubelet",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "socket_name",
        "--socket-name",
        "GPUTOPO_SOCKET_NAME",
        "socketName",
        parse_socket_name,
        "file name of the plugin's socket inside the kubelet folder",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "topology",
        "--topology",
        "GPUTOPO_TOPOLOGY",
        "topology",
        parse_optional_text,
        "topology JSON / `nvidia-smi topo -m` file or preset name; without it NVML is used",
    ),
    Option(
        "health_file",
        "--health-file",
        "GPUTOPO_HEALTH_FILE",
        "healthFile",
        parse_optional_text,
        "file backend only: file stating each GPU's health, watched for changes",
    ),
    Option(
        "device_list_strategy",
        "--device-list-strategy",
        "GPUTOPO_DEVICE_LIST_STRATEGY",
        "deviceListStrategy",
        parse_strategy_list,
        "how Allocate hands GPUs to the container, a comma list as NVIDIA's plugin takes: "
        "envvar, volume-mounts, cdi-annotations, cdi-cri (cdi = cdi-cri)",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "ignored_xids",
        "--ignored-xids",
        "GPUTOPO_IGNORED_XIDS",
        "ignoredXids",
        parse_xids,
        "XID errors that do not make a GPU unhealthy (comma-separated)",
    ),
    Option(
        "health_recovery_seconds",
        "--health-recovery-seconds",
        "GPUTOPO_HEALTH_RECOVERY_SECONDS",
        "healthRecoverySeconds",
        parse_seconds,
        "an unhealthy GPU without new errors for this long is healthy again (0: never)",
    ),
    Option(
        "fail_on_init_error",
        "--fail-on-init-error",
        "GPUTOPO_FAIL_ON_INIT_ERROR",
        "failOnInitError",
        parse_bool,
        "exit non-zero when NVML cannot start (false: keep retrying)",
        boolean=True,
    ),
    Option(
        "metrics_port",
        "--metrics-port",
        "GPUTOPO_METRICS_PORT",
        "metricsPort",
        parse_port,
        "Prometheus metrics port (0 disables)",
    ),
    Option(
        "log_level",
        "--log-level",
        "GPUTOPO_LOG_LEVEL",
        "logLevel",
        parse_log_level,
        "debug, info, warning or error",
    ),
    Option(
        "node_name",
        "--node-name",
        "NODE_NAME",
        "nodeName",
        parse_optional_text,
        "name of this node (downward API)",
    ),
    Option(
        "pod_resources_socket",
        "--pod-resources-socket",
        "GPUTOPO_POD_RESOURCES_SOCKET",
        "podResourcesSocket",
        parse_socket_path,
        "kubelet PodResources socket",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "publish",
        "--publish",
        "GPUTOPO_PUBLISH",
        "publish",
        parse_choice(PUBLISH_MODES),
        "keep the Node's gputopo.io/topology annotation current: true, false, or auto "
        "(when a node name is set and the API server can be reached)",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "kubeconfig",
        "--kubeconfig",
        "GPUTOPO_KUBECONFIG",
        "kubeconfig",
        parse_optional_text,
        "kubeconfig for the API server: node publication, or DRA's ResourceSlices and claims "
        "(default: in-cluster service account)",
    ),
    Option(
        "nvlink_gbps_per_link",
        "--nvlink-gbps-per-link",
        "GPUTOPO_NVLINK_GBPS_PER_LINK",
        "nvlinkGbpsPerLink",
        parse_gbps,
        "one NVLink's GB/s, one direction (default: from NVML's NVLink version, else 25)",
    ),
    Option(
        "pcie_gbps",
        "--pcie-gbps",
        "GPUTOPO_PCIE_GBPS",
        "pcieGbps",
        parse_pcie_gbps,
        "PCIe GB/s per level, e.g. PIX=24,PXB=20,PHB=16,NODE=12,SYS=6 (default: those)",
    ),
    Option(
        "policy",
        "--policy",
        "GPUTOPO_POLICY",
        "policy",
        parse_choice(POLICY_NAMES),
        "in-node GPU choice: gputopo (default), or to A/B one node against what others run: "
        "kubelet-default (kubelet's random order), best-effort-pairs (NVIDIA go-gpuallocator), "
        "best-combo (HAMi)",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "config_dir",
        "--config-dir",
        "GPUTOPO_CONFIG_DIR",
        "configDir",
        parse_optional_text,
        "folder of named configs (a mounted ConfigMap: key = name, value = a config file); the "
        "node's label picks one (docs/deviceplugin.md), used as --config; flags and env only",
    ),
    Option(
        "node_config_label",
        "--node-config-label",
        "GPUTOPO_NODE_CONFIG_LABEL",
        "nodeConfigLabel",
        parse_label_key,
        f"Node label naming this node's config in --config-dir (default {NODE_CONFIG_LABEL})",
    ),
    Option(
        "node_config",
        "--node-config",
        "GPUTOPO_NODE_CONFIG",
        "nodeConfig",
        parse_config_name,
        "name of this node's config in --config-dir, instead of reading the node label",
    ),
    Option(
        "pass_device_specs",
        "--pass-device-specs",
        "GPUTOPO_PASS_DEVICE_SPECS",
        "passDeviceSpecs",
        parse_bool,
        "also list /dev/nvidia<minor> and the control devices in Allocate (runtimes without the NVIDIA hook)",
        boolean=True,
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "nvidia_driver_root",
        "--nvidia-driver-root",
        "GPUTOPO_NVIDIA_DRIVER_ROOT",
        "nvidiaDriverRoot",
        parse_socket_path,
        "root of the driver's /dev on the host, for device specs (the GPU Operator: /run/nvidia/driver)",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "cdi_annotation_prefix",
        "--cdi-annotation-prefix",
        "GPUTOPO_CDI_ANNOTATION_PREFIX",
        "cdiAnnotationPrefix",
        strategies.parse_annotation_prefix,
        "key prefix of cdi-annotations (default cdi.k8s.io/)",
        modes=(DEVICE_PLUGIN,),
    ),
    Option(
        "driver_name",
        "--driver-name",
        "GPUTOPO_DRA_DRIVER",
        "draDriverName",
        parse_driver_name,
        "DRA driver name: the ResourceSlices' driver and the DeviceClasses' attribute domain "
        f"(default {draslices.DRIVER})",
        modes=(DRA,),
    ),
    Option(
        "registry_dir",
        "--registry-dir",
        "GPUTOPO_DRA_REGISTRY_DIR",
        "draRegistryDir",
        parse_socket_path,
        f"kubelet's plugin-watcher folder, where the registration socket goes (default {DRA_REGISTRY_DIR})",
        modes=(DRA,),
    ),
    Option(
        "plugins_dir",
        "--plugins-dir",
        "GPUTOPO_DRA_PLUGINS_DIR",
        "draPluginsDir",
        parse_socket_path,
        "parent of the plugin's own folder <plugins-dir>/<driver>/: its DRA socket and prepared "
        f"claims (default {DRA_PLUGINS_DIR})",
        modes=(DRA,),
    ),
    Option(
        "set_sizes",
        "--set-sizes",
        "GPUTOPO_DRA_SET_SIZES",
        "draSetSizes",
        parse_set_sizes,
        "GPU set sizes published as devices, one DeviceClass each (default "
        + ",".join(map(str, draslices.DEFAULT_SIZES))
        + ")",
        modes=(DRA,),
    ),
    Option(
        "max_sets",
        "--max-sets",
        "GPUTOPO_DRA_MAX_SETS",
        "draMaxSets",
        parse_max_sets,
        "most set devices per size, 64 a slice; below the number of sets, a claim can wait while "
        f"GPUs are free (default {draslices.MAX_SETS_PER_SIZE}: every set of a node of up to 16 GPUs)",
        modes=(DRA,),
    ),
    Option(
        "sysfs",
        "--sysfs",
        "GPUTOPO_SYSFS",
        "sysfs",
        parse_socket_path,
        f"sysfs root, where the GPUs' PCIe roots are read (default {SYSFS})",
        modes=(DRA,),
    ),
)


def option(name: str) -> Option:
    """The table's row of setting `name` (a PluginConfig field), for commands beside the daemon
    that take some of its flags (the DRA probe)."""
    return next(opt for opt in OPTIONS if opt.name == name)


# --- Loading: flags > environment > config file > defaults.

CONFIG_VERSION = "v1"
# sun_path of a unix socket holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which one, where it came from and why."""


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Everything the daemon is told from outside, already checked."""

    kubelet_dir: str = KUBELET_DIR
    resource_name: str = RESOURCE_NAME
    socket_name: str = SOCKET_NAME
    topology: str | None = None
    health_file: str | None = None
    device_list_strategy: str = "envvar"
    ignored_xids: tuple[int, ...] = IGNORED_XIDS
    health_recovery_seconds: float = HEALTH_RECOVERY_SECONDS
    fail_on_init_error: bool = True
    metrics_port: int = METRICS_PORT
    log_level: str = "info"
    node_name: str | None = None
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    publish: str = "auto"
    kubeconfig: str | None = None
    nvlink_gbps_per_link: float | None = None
    pcie_gbps: tuple[tuple[str, float], ...] | None = None
    policy: str = DEFAULT_POLICY
    config_dir: str | None = None
    node_config_label: str = NODE_CONFIG_LABEL
    node_config: str | None = None
    pass_device_specs: bool = False
    nvidia_driver_root: str = "/"
    cdi_annotation_prefix: str = strategies.CDI_ANNOTATION_PREFIX
    driver_name: str = draslices.DRIVER
    registry_dir: str = DRA_REGISTRY_DIR
    plugins_dir: str = DRA_PLUGINS_DIR
    set_sizes: tuple[int, ...] = draslices.DEFAULT_SIZES
    max_sets: int = draslices.MAX_SETS_PER_SIZE
    sysfs: str = SYSFS

    @property
    def plugin_dir(self) -> str:
        """DRA mode's own folder: its DRA socket and checkpoint of prepared claims."""
        return os.path.join(self.plugins_dir, self.driver_name)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.kubelet_dir, self.socket_name)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.kubelet_dir, KUBELET_SOCKET_NAME)

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


#: What each mode does, for the top of its --help.
DESCRIPTIONS = {
    DEVICE_PLUGIN: "gputopo device plugin: topology-aware GetPreferredAllocation for kubelet.",
    DRA: "gputopo DRA driver: the node's GPUs and best-connected GPU sets as ResourceSlices, "
    "allocated by kube-scheduler (docs/dra.md).",
}


def prog(mode: str = DEVICE_PLUGIN) -> str:
    """The command line of `mode`, as --help and --version name it."""
    return "python -m deviceplugin" + ("" if mode == DEVICE_PLUGIN else f" --mode {mode}")


def build_parser(mode: str = DEVICE_PLUGIN) -> argparse.ArgumentParser:
    """The flags of `mode`: the settings both modes read, then this mode's own, then the other
    mode's (accepted and checked, not used: one flag moves a node between the modes)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    parser = _Parser(
        prog=prog(mode),
        description=DESCRIPTIONS[mode],
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config", help=f"versioned YAML config file (version: {CONFIG_VERSION}); env {CONFIG_ENV}"
    )
    add_version_argument(parser)
    # Read by deviceplugin/__main__.py before this parser sees the arguments; here for --help.
    parser.add_argument(
        "--mode",
        choices=MODES,
        help="device-plugin (default): serve kubelet's device-plugin API; dra: run the DRA node "
        "driver instead, publishing ResourceSlices (its flags: python -m deviceplugin --mode dra "
        "--help; docs/dra.md)",
    )
    # argparse lists groups in the order they are made: this mode's own, then the other's
    groups = {
        m: parser.add_argument_group(f"{m} mode only" + ("" if m == mode else " (accepted, not used here)"))
        for m in sorted(MODES, key=lambda m: m != mode)
    }
    for opt in OPTIONS:
        where = parser if set(MODES) <= set(opt.modes) else groups[opt.modes[0]]
        text = f"{opt.help} (env {opt.env}, file key {opt.key})"
        if opt.boolean:
            where.add_argument(opt.flag, dest=opt.name, nargs="?", const="true", metavar="BOOL", help=text)
        else:
            where.add_argument(opt.flag, dest=opt.name, metavar=opt.name.upper(), help=text)
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


def load_config(argv: Sequence[str], environ: Mapping[str, str], mode: str = DEVICE_PLUGIN) -> PluginConfig:
    """Merge flags, environment and the optional config file (in that precedence) over defaults,
    for `mode` (its --help, and the settings it cannot run without)."""
    args = vars(build_parser(mode).parse_args(list(argv)))
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
    if mode == DRA and not config.node_name:
        # the pool, the slices' nodeName and the claims' results all name the node
        raise ConfigError("DRA mode needs the node name (--node-name or NODE_NAME)")
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
