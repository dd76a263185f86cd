"""The kube-scheduler extender sidecar: filter, prioritize and bind,
with all-or-nothing gangs in the smallest network domain."""
