"""The device plugin DaemonSet: kubelet device-plugin API v1beta1 over unix sockets,
NVML or file backend, XID health, node publication."""
