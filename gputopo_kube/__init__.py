"""The Kubernetes API configuration both daemons and kubectl gputopo share.

The device plugin's node publisher and the sidecar's cluster state load their API server
configuration here, one way; `kubectl gputopo` loads a person's kubeconfig here too
(`user_configuration`).

A package of its own because of the layers (`make test` checks them with import-linter): the
core `gputopo` imports no Kubernetes client, and `deviceplugin` and `scheduler` never import
each other, so neither can hold code the other needs.
"""

from gputopo_kube.config import KubeConfigError, api_client, load_configuration
from gputopo_kube.user import user_configuration

__all__ = ["KubeConfigError", "api_client", "load_configuration", "user_configuration"]
