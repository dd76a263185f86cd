"""Which API server, with which credentials: in-cluster first, then a kubeconfig.

An explicit kubeconfig file wins. Without one, the pod's ServiceAccount (what both daemons use
when deployed), and outside a cluster `$KUBECONFIG` or `~/.kube/config` (what an operator uses
on a laptop). Every failure is one `KubeConfigError` with a one-line reason, so each daemon
decides what it means: the sidecar cannot start, the plugin runs without publishing.
"""

from __future__ import annotations

from kubernetes import client, config

from gputopo.userfile import check_kubeconfig


class KubeConfigError(Exception):
    """No usable API server configuration; the message says why, on one line."""


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """A client Configuration for `kubeconfig` (a file) or, when None, in-cluster then default."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            check_kubeconfig(kubeconfig)  # a FIFO would hang the client's open, /dev/zero its read
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except Exception as e:
        # The loader raises whatever its parsing trips over (ConfigException, OSError, a
        # yaml error on a malformed file, TypeError / AttributeError on a wrongly shaped
        # one): for the caller each is "this configuration cannot be used".
        text = " ".join(str(e).split()) or type(e).__name__
        if kubeconfig and kubeconfig not in text:
            text = f"{kubeconfig}: {text}"
        raise KubeConfigError(text) from None
    return cfg


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient on `load_configuration(kubeconfig)`; KubeConfigError when there is none."""
    return client.ApiClient(load_configuration(kubeconfig))
