"""Defaults the sidecar serves with; the deploy manifests and their tests read these."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8888
FILTER_PATH = "/filter"
PRIORITIZE_PATH = "/prioritize"
BIND_PATH = "/bind"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
TOPOLOGY_ANNOTATION = "gputopo.io/topology"
RESOURCE_NAME = "nvidia.com/gpu"
