"""Device-plugin mode's Node publication, the annotation the scheduler sidecar plans on. The
`publisher` keeps `gputopo.io/topology` current, with the GPUs in use read from kubelet's
PodResources API (`podresources`)."""
