"""`kubectl gputopo`: what gputopo sees and decided, read from the API server with the user's
kubeconfig. A kubectl plugin (the `kubectl-gputopo` console script) with three commands:

* `nodes`: every GPU node's GPUs, free and healthy counts, the best ring a 2/4/8-GPU request
  gets there now, and how old the plugin's annotation is;
* `topo NODE`: the node's link matrix as `gputopo topo` prints it, from its annotation;
* `why POD`: the sidecar's decision for a pod or its gang, or why it waits.

A package of its own above the core and the shared Kubernetes client (import-linter layers):
it decodes annotations and ranks rings with the core, exactly as the sidecar does, and never
imports either daemon. Docs: docs/kubectl-gputopo.md.
"""
