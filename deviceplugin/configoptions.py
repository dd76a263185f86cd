"""The one table of the plugin's settings: every setting named once, with its flag, its
environment variable, its key in the versioned YAML file and the parser that checks its value,
so the three sources cannot drift apart (`deviceplugin.config` reads them from it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deviceplugin import defaults, strategies
from deviceplugin.configvalues import (
    PUBLISH_MODES,
    parse_bool,
    parse_choice,
    parse_config_name,
    parse_gbps,
    parse_label_key,
    parse_log_level,
    parse_optional_text,
    parse_pcie_gbps,
    parse_port,
    parse_resource,
    parse_seconds,
    parse_socket_name,
    parse_socket_path,
    parse_strategy_list,
    parse_xids,
)
from gputopo.node.policy import POLICY_NAMES


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # PluginConfig field
    flag: str  # --flag
    env: str  # environment variable
    key: str  # YAML key
    parse: Callable[[Any], Any]
    help: str
    boolean: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "kubelet_dir",
        "--kubelet-dir",
        "GPUTOPO_KUBELET_DIR",
        "kubeletDir",
        parse_socket_path,
        "kubelet device-plugin folder holding kubelet.sock and the plugin's socket",
    ),
    Option(
        "resource_name",
        "--resource-name",
        "GPUTOPO_RESOURCE_NAME",
        "resourceName",
        parse_resource,
        "extended resource advertised to kubelet",
    ),
    Option(
        "socket_name",
        "--socket-name",
        "GPUTOPO_SOCKET_NAME",
        "socketName",
        parse_socket_name,
        "file name of the plugin's socket inside the kubelet folder",
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
    ),
    Option(
        "publish",
        "--publish",
        "GPUTOPO_PUBLISH",
        "publish",
        parse_choice(PUBLISH_MODES),
        "keep the Node's gputopo.io/topology annotation current: true, false, or auto "
        "(when a node name is set and the API server can be reached)",
    ),
    Option(
        "kubeconfig",
        "--kubeconfig",
        "GPUTOPO_KUBECONFIG",
        "kubeconfig",
        parse_optional_text,
        "kubeconfig for node publication (default: in-cluster service account)",
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
        f"Node label naming this node's config in --config-dir (default {defaults.NODE_CONFIG_LABEL})",
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
    ),
    Option(
        "nvidia_driver_root",
        "--nvidia-driver-root",
        "GPUTOPO_NVIDIA_DRIVER_ROOT",
        "nvidiaDriverRoot",
        parse_socket_path,
        "root of the driver's /dev on the host, for device specs (the GPU Operator: /run/nvidia/driver)",
    ),
    Option(
        "cdi_annotation_prefix",
        "--cdi-annotation-prefix",
        "GPUTOPO_CDI_ANNOTATION_PREFIX",
        "cdiAnnotationPrefix",
        strategies.parse_annotation_prefix,
        "key prefix of cdi-annotations (default cdi.k8s.io/)",
    ),
)
