"""Defaults of the device plugin; flags, env vars and the config file override them."""

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
RESOURCE_NAME = "nvidia.com/gpu"
SOCKET_NAME = "gputopo-gpu.sock"
METRICS_PORT = 9402          # 0 disables the metrics server
TOPOLOGY_ANNOTATION = "gputopo.io/topology"
IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
