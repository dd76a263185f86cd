"""In-node GPU policies other than gputopo's own: the systems people run today, as `GpuPolicy`s.

`baselines` holds the policy classes (kubelet's order, NVIDIA's go-gpuallocator best-effort,
HAMi's best combination), `search` the searches they wrap, `pairpoints` the pair-point scale
those systems score with. The registry that names them is `gputopo.node.policy`.
"""
