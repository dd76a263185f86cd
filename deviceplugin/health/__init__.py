"""What a health observation means, for both plugin modes. The `tracker` turns backend events
(XIDs, stated health, NVML failures) and a clock into each GPU's Healthy/Unhealthy, the `loop`
feeds it off the RPC path and publishes a new snapshot (and the health gauges) on every change."""
