"""Across nodes: which nodes share a network domain, and what is known of each node.

`levels` (network levels, domains and the per-snapshot index), `cluster` (cluster snapshot
files and synthetic clusters), `annotation` (the Node annotation the plugin publishes and the
sidecar reads) and `nodeview` (what the placers know of one node and answer with). Imports only
`gputopo.node` below it.
"""
