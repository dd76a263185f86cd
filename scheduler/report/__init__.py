"""What the sidecar tells operators: Kubernetes Events for its gang decisions and Prometheus metrics on a registry of its own."""
