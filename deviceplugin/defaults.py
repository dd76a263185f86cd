"""Defaults of the device plugin; flags, env vars and the config file override them."""

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
RESOURCE_NAME = "nvidia.com/gpu"
SOCKET_NAME = "gputopo-gpu.sock"
METRICS_PORT = 9402  # 0 disables the metrics server
TOPOLOGY_ANNOTATION = "gputopo.io/topology"
IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
NODE_CONFIG_LABEL = "gputopo.io/config"  # Node label naming its config in --config-dir

# Device plugin daemon (deviceplugin/daemon.py and friends).
KUBELET_SOCKET_NAME = "kubelet.sock"  # kubelet's Registration socket inside KUBELET_DIR
API_VERSION = "v1beta1"
CDI_KIND = "nvidia.com/gpu"  # CDI devices are named CDI_KIND=<uuid>
HEALTH_RECOVERY_SECONDS = 300.0  # 0: an unhealthy GPU stays unhealthy until restart
WATCH_INTERVAL_SECONDS = 0.15  # how often the kubelet folder is polled
REGISTER_BACKOFF_SECONDS = (0.2, 5.0)  # first and largest wait between failed Register calls
REGISTER_TIMEOUT_SECONDS = 10.0  # kubelet dials back inside Register (its own timeout: 10 s)
NVML_RETRY_SECONDS = 30.0  # NVML init retry period when fail-on-init-error is off
# Longest device-ID list (and most container requests) one RPC may carry. kubelet lists the
# devices this plugin advertised, at most gputopo.node.allocator.MAX_GPUS (16); 4x that leaves room
# for IDs of GPUs since replaced (kubelet may still offer them) and for larger nodes, while
# keeping every request's work tiny. Longer lists are INVALID_ARGUMENT before any per-ID work.
MAX_REQUEST_IDS = 64
