"""Where one pod that is not in a gang goes.

`placement` (the extender's node scores, `place_pod`), `objective` (the cluster objective: what
the pod gains on a node against what it costs the jobs after it; gang planning reuses it),
`leafpack` (among the best-scored nodes, the fullest leaf: empty leaves stay whole for gangs),
`ringwait` (when a multi-GPU pod waits for a node's best ring) and `kubesched` (a model of
kube-scheduler's own choice, for the simulator). Imports `gputopo.network` and `gputopo.node`.
"""
