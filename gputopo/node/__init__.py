"""Inside one node: which GPUs a pod gets.

`links` (the `nvidia-smi topo -m` codes and what each is worth), `topology` (the node model),
`topofile` (topologies from files, `topo -m` text and the bundled `presets/`), `allocator` (the
node objective of design.md §2 and its exact allocator), `policy` (the `GpuPolicy` seam and the
names the plugin, the sidecar and the simulator choose by) and `policies/` (what kubelet, NVIDIA
and HAMi pick, as `GpuPolicy`s). Imports nothing above it in the core.
"""
