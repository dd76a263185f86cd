"""The DRA mode of the node daemon (`python -m deviceplugin.dra`, or `python -m deviceplugin
--mode dra`): a kubelet DRA plugin that publishes the node's GPUs and good GPU sets as
ResourceSlices (gputopo.node.draslices decides their content) and prepares allocated claims.

Modules: `kubeapi` (ResourceSlices and ResourceClaims through the API server), `slicepub` (keeps
the node's slices in step with health and use), `service` (the DRA gRPC service kubelet calls),
`registrar` (kubelet plugin-watcher registration), `daemon` (wiring), `__main__` (flags).
"""
