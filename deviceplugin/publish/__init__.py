"""Device-plugin mode's Node publication: the `gputopo.io/topology` annotation the scheduler
sidecar plans on (`publisher`), with the GPUs in use read from kubelet's PodResources API
(`podresources`)."""
