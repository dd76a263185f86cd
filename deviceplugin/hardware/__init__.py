"""What a node's GPUs are and what they report: the `Backend` seam (`backend`), its two
implementations (`nvml` over `nvml_topology` on a real node, `filebackend` from a topology file
everywhere else) and the NVML probe command (`python -m deviceplugin.hardware.nvml_probe`).
Nothing here knows kubelet, Kubernetes or either plugin mode."""
