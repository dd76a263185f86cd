"""The policies the simulator compares, one module per family.

`catalog` (their names and how each is built), `base` (what a policy answers, and the node
ranking the in-node baselines share), `sidecar` (gputopo as deployed: kube-scheduler's choice
and the gang tracker, with `podclasses` and `levelwaits`), `peers` (FGD and Kueue TAS) and
`shared` (the policies under `--gpu-sharing`).
"""
