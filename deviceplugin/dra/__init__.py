"""DRA mode (`python -m deviceplugin --mode dra`): a kubelet DRA plugin publishing the node's
GPUs and GPU sets as ResourceSlices. gputopo.node.draslices decides their content; this package
publishes them (`python -m deviceplugin.dra` is the same command) and prepares allocated claims.

Modules: `kubeapi` (ResourceSlices and ResourceClaims through the API server), `slicepub` (keeps
the node's slices in step with health and use), `service` (the DRA gRPC service kubelet calls),
`registrar` (kubelet plugin-watcher registration), `pcie` (PCIe roots from sysfs), `probe`
(kubelet's probe, from outside), `daemon` (this mode's steps of the shared start,
deviceplugin/daemon.py), `mode` (its entry in the one start path, deviceplugin/startup.py).
Its settings are rows of the one table, marked for this mode (deviceplugin/settings.py).
"""
