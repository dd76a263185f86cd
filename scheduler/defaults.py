"""Defaults the sidecar serves with; the deploy manifests and their tests read these."""

from gputopo.gang import sources as gangsources
from gputopo.gang import tracker as gangs
from gputopo.network import levels as network

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

# Gang membership and placement constraints (design.md §5): the core's table of gang sources
# (gputopo/gang/sources.py) has every key; scheduler-plugins' PodGroup has a watch of its own.
PODGROUP_GROUP = gangsources.SCHEDULER_PLUGINS_API.group
PODGROUP_VERSION = gangsources.SCHEDULER_PLUGINS_API.versions[0]
PODGROUP_PLURAL = gangsources.SCHEDULER_PLUGINS_API.plural
#: The sidecar recognises Topograph's current and pre-1.0 label families and the GPU clique;
#: a cluster's Kueue / KAI `Topology` objects put their own levels first (scheduler/live/kinds.py).
DEFAULT_LEVELS = network.RECOGNISED_LEVELS

# Limits and timings of the sidecar.
MAX_BODY_BYTES = 64 * 1024 * 1024  # a full 5,000-node NodeList is ~30 MiB
# Bounds of the HTTP server (docs/scheduler.md "Limits"): a connection idle this long is
# closed. kube-scheduler's client keeps connections alive up to 90 s idle (Go's
# IdleConnTimeout via utilnet.SetTransportDefaults); when the server closes first, Go drops the
# connection from its pool and dials a new one, retrying a request that raced the close.
IDLE_TIMEOUT_S = 60.0
BODY_TIMEOUT_S = 30.0  # a whole request body must arrive within this (kube-scheduler: httpTimeout 30s)
MAX_CONNECTIONS = 64  # open connections (one thread each); kube-scheduler uses a handful
# Bodies being read, decoded and answered at once, all connections together: one full-size body
# (decoded, a body costs several times its bytes: a 60 MiB NodeNames list peaked near 500 MB).
MAX_INFLIGHT_BODY_BYTES = MAX_BODY_BYTES
MAX_GPUS_PER_POD = 1024
RESERVATION_TTL_S = gangs.RESERVATION_TTL_S  # a gang plan's capacity is held this long without binds
ANNOTATION_MAX_AGE_S = 900.0  # older topology annotations are treated as unknown
GANG_BACKOFF_S = gangs.BACKOFF_S  # first and largest retry delay of a gang that fits nowhere
GANG_SPILL_AFTER_S = gangs.SPILL_AFTER_S  # a gang's wait for a domain of its own level: 0, opt-in
#: A sidecar not called for this long (and at its first call) looks for gangs another replica
#: left part-bound before it answers (docs/operator.md "Failover"): kube-scheduler with leader
#: election calls only its own pod's sidecar, so a replica's first call after a pause may be
#: its first as the leader. Well below kube-scheduler's leaseDuration (15 s by default).
TAKEOVER_GAP_S = 2.0
#: Extended resources of gputopo's DeviceClasses on a DRA cluster (deploy/components/dra): a
#: container asking `gputopo.io/nvlink-4: 1` asks for 4 GPUs. A Helm release other than
#: "gputopo" puts its classes in a domain of its own under gputopo.io
#: (`research-gputopo.gputopo.io/nvlink-4`, `nvlink-4.research-gputopo.gputopo.io`; the chart's
#: gputopo.draClassDomain): DeviceClasses are cluster-scoped, so two releases must not share
#: one, and each release's classes still count as GPUs.
DRA_CLASS_DOMAIN = "gputopo.io"
DRA_GPU_RESOURCE = f"{DRA_CLASS_DOMAIN}/gpu"
DRA_SET_RESOURCE_PREFIX = f"{DRA_CLASS_DOMAIN}/nvlink-"
