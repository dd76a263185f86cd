"""Live mode: the cluster read from the API server, list then watch, into the one store the extender plans on.

Nodes, Pods, the gang kinds found through discovery (kinds), and on DRA clusters ResourceSlices
and ResourceClaims (dra) are mirrored by reflectors (reflector), parsed at the edge (objects),
kept in `KubeState` (kube), reconciled with what each pod really holds (accounting), and bound
through the API server (binding).
"""
