"""What a node's GPUs are and what they report, through one seam. The `Backend` Protocol
(`backend`) has two implementations: `nvml` over `nvml_topology` on a real node, `filebackend`
from a topology file everywhere else; `python -m deviceplugin.hardware.nvml_probe` prints what
NVML discovery finds. Nothing here knows kubelet, Kubernetes or either plugin mode."""
