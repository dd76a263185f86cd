"""The pure core of gputopo (topology-aware GPU scheduling for Kubernetes): link bandwidths,
topology, the node objective and its exact allocator, gang placement, the simulator, the CLI.

This package is the pure core shared by the device plugin, the scheduler sidecar, the CLI and
the simulator: link bandwidths, the topology model, the node objective and its allocator, and
gang placement. It does no network or hardware I/O and holds no global state.
"""

__version__ = "0.1.0"
