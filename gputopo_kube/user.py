"""API server access as a person's command line tool has it (`kubectl gputopo`): the kubeconfig
first, as kubectl does, with `--kubeconfig`, `--context` and the context's namespace; in-cluster
only when no kubeconfig exists (a debug pod).

The daemons keep `gputopo_kube.config` (in-cluster first): a pod's ServiceAccount is what they
are deployed with, while a laptop's kubeconfig is what an operator means.
"""

from __future__ import annotations

import os

from kubernetes import client, config

from gputopo_kube.config import KubeConfigError


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _default_file() -> str | None:
    """The kubeconfig kubectl would read: the first file of $KUBECONFIG, else ~/.kube/config."""
    env = os.environ.get("KUBECONFIG", "")
    for path in env.split(os.pathsep):
        if path and os.path.exists(path):
            return path
    home = os.path.expanduser(config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    return home if os.path.exists(home) else None


def user_configuration(
    kubeconfig: str | None = None, context: str | None = None
) -> tuple[client.Configuration, str]:
    """A client Configuration and the namespace of the chosen context ("default" if it names
    none). KubeConfigError with a one-line reason when neither a kubeconfig nor in-cluster
    credentials work."""
    cfg = client.Configuration()
    path = kubeconfig or _default_file()
    if path is None:
        if context:
            raise KubeConfigError(f"--context {context}: no kubeconfig ($KUBECONFIG, ~/.kube/config)")
        try:
            config.load_incluster_config(client_configuration=cfg)
        except Exception as e:
            raise KubeConfigError(
                f"no kubeconfig ($KUBECONFIG, ~/.kube/config, --kubeconfig) and not in a cluster ({_one_line(e)})"
            ) from None
        return cfg, _incluster_namespace()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        contexts, active = config.list_kube_config_contexts(config_file=path)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    except Exception as e:  # ConfigException, OSError, yaml errors, wrongly shaped files
        text = _one_line(e)
        raise KubeConfigError(text if path in text else f"{path}: {text}") from None
    namespace = ((chosen or {}).get("context") or {}).get("namespace") if isinstance(chosen, dict) else None
    return cfg, namespace if isinstance(namespace, str) and namespace else "default"


def _incluster_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"
